#!/bin/bash
# On the GPU host (device tool), from the repo root, .gpu carried:
#   OLD=.gpu/old bash bench/gpu/same_figures.sh
# The same `rayft train` (the 1.5B preset on ../shared/data's alpaca EN + ZH, 50 steps, every local
# GPU) with two source trees in one call, alternating OLD, NEW, OLD, NEW: OLD is a checkout's src/
# (e.g. `git archive <commit> src examples | tar -x -C .gpu/old`), NEW this tree. Writes one results
# file per run under $OUT (rayft.benchmarks.record) and prints each run's first-step loss and median
# tokens/s/GPU. A refactor that keeps behaviour gives the same first loss and tokens/s within noise.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
OLD=${OLD:-.gpu/old}; STEPS=${STEPS:-50}; MB=${MB:-16}; ROUNDS=${ROUNDS:-2}
NG=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
D="$PWD/.gpu/data"
ARGS="examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=$MB --set train.max_steps=$STEPS --set train.lr=3e-4 --set train.warmup_steps=10 --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set train.log_every=1 --set checkpoint.storage_path=/tmp/runs --set checkpoint.every_steps=null --set checkpoint.save_final=false --set checkpoint.export_hf=false"
for round in $(seq 1 "$ROUNDS"); do
  for tree in old new; do
    name="$tree-$round"
    if [ "$tree" = old ]; then src="$PWD/$OLD/src"; else src="$PWD/src"; fi
    echo "=== $name: PYTHONPATH $src"
    (cd "${src%/src}" && PYTHONPATH="$src:$PYTHONPATH" timeout ${TRAIN_TIMEOUT:-300} python3 -m rayft.cli train $ARGS --set checkpoint.name="$name") \
      > "$OUT/train-$name.log" 2>&1
    echo "exit $?"
    python3 - "$name" <<'EOF'
import json, statistics, sys
name = sys.argv[1]
rows = [json.loads(x) for x in open(f"/tmp/runs/{name}/rayft_metrics.jsonl")]
steady = [r["tokens_per_s_per_gpu"] for r in rows[3:]]
print(f"{name}: first loss {rows[0]['loss']:.6f}, last loss {rows[-1]['loss']:.4f}, steps {rows[-1]['step']}, "
      f"median tokens/s/GPU {statistics.median(steady):,.0f} over {len(steady)} reported steps, MFU {statistics.median(r['mfu'] for r in rows[3:]):.4f}")
EOF
    python3 -m rayft.benchmarks.record "/tmp/runs/$name" "$OUT/same-figures-$name.json" --command "rayft train $ARGS --set checkpoint.name=$name  # PYTHONPATH=${src#$PWD/}" > /dev/null
  done
done
tail -n 3 "$OUT"/train-*.log

#!/bin/bash
# Issue 23's float8 evidence, on the GPU host (device tool), from the repo root, .gpu carried:
#   STEPS=400 DEADLINE_S=500 bash bench/gpu/float8_evidence.sh
# Two `rayft train` runs of the qwen2.5-1.5b preset (random init, the same seed: the same initial
# weights and the same step plan), bf16 then float8 (torchao tensorwise dynamic scaling), each STEPS
# steps on ../shared/data alpaca EN + ZH with 5% of the records held out (evaluated every EVAL_EVERY
# steps), torch.compile per layer, no checkpoints, no export. Writes one results file per run
# ($OUT/float8-evidence-MODE-1xgpu.json, rayft.benchmarks.record) and the comparison
# ($OUT/float8-evidence-1xgpu.json: both loss curves, the largest |gap| after step 50, each eval loss,
# throughput). DEADLINE_S: seconds from now by which both runs must have ended (each run's timeout is
# half of what is left when it starts, less 15 s, so a device call's limit cuts neither mid-way).
# MODES="float8" runs one of them (then run bench/gpu/float8_compare.py on a folder with both runs' files). float8 needs
# torchao in .gpu: bash ../shared/gpu/stage.sh torchao==0.18.0 (with the families' wheels, if wanted).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D" || exit 3
STEPS=${STEPS:-400}; MB=${MB:-8}; EVAL_EVERY=${EVAL_EVERY:-50}; LR=${LR:-3e-4}
END=$(( $(date +%s) + ${DEADLINE_S:-100000} ))
n=0
MODES=${MODES:-bf16 float8}; NM=$(echo $MODES | wc -w)
for mode in $MODES; do
  f8=false; [ "$mode" = float8 ] && f8=true
  CMD="rayft train examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=1 --set train.micro_batch_size=$MB --set train.max_steps=$STEPS --set train.epochs=40 --set train.lr=$LR --set train.warmup_steps=20 --set train.activation_checkpointing=false --set train.compile=true --set train.float8=$f8 --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.validation_fraction=0.05 --set train.eval_every=$EVAL_EVERY --set train.log_every=10 --set checkpoint.storage_path=/tmp/runs --set checkpoint.name=f8-$mode --set checkpoint.every_steps=null --set checkpoint.save_final=false --set checkpoint.export_hf=false"
  echo "=== $mode: $CMD"
  left=$(( END - $(date +%s) )); t=$(( left / (NM - n) - 15 )); n=$((n + 1))
  [ "$t" -lt 60 ] && { echo "$mode: not started: ${t}s left before DEADLINE_S"; continue; }
  timeout -k 30 "$t" python3 -m rayft.cli ${CMD#rayft } > "$OUT/train-$mode.log" 2>&1
  echo "exit $?"; grep -E "eval|loss|error|Error" "$OUT/train-$mode.log" | tail -6
  python3 -m rayft.benchmarks.record "/tmp/runs/f8-$mode" "$OUT/float8-evidence-$mode-1xgpu.json" --command "$CMD" || echo "$mode: no summary"
  cp "/tmp/runs/f8-$mode/rayft_metrics.jsonl" "$OUT/metrics-$mode.jsonl" 2>/dev/null
done
[ "$NM" = 2 ] && python3 bench/gpu/float8_compare.py "$OUT" "$OUT/float8-evidence-1xgpu.json"

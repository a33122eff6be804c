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
# MODES="float8" runs one of them (the comparison then needs the other's files in $OUT). float8 needs
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
python3 - "$OUT" <<'EOF'
import json, sys
from rayft.benchmarks.record import write_result
out = sys.argv[1]
def load(mode):
    rows = [json.loads(x) for x in open(f"{out}/metrics-{mode}.jsonl")]
    return {r["step"]: r for r in rows}
runs = {m: load(m) for m in ("bf16", "float8")}
figs = {m: json.load(open(f"{out}/float8-evidence-{m}-1xgpu.json"))["figures"] for m in runs}
common = sorted(set(runs["bf16"]) & set(runs["float8"]))
gaps = {s: runs["float8"][s]["loss"] - runs["bf16"][s]["loss"] for s in common}
after = {s: g for s, g in gaps.items() if s > 50}
worst = max(after, key=lambda s: abs(after[s])) if after else None
evals = {m: {s: r["eval_loss"] for s, r in runs[m].items() if "eval_loss" in r} for m in runs}
res = {
    "steps_compared": len(common),
    "largest_abs_gap_after_step_50": abs(after[worst]) if worst else None, "at_step": worst,
    "mean_gap_after_step_50": sum(after.values()) / len(after) if after else None,
    "final_loss": {m: runs[m][common[-1]]["loss"] for m in runs},
    "eval_loss": evals,
    "median_tokens_per_s_per_gpu": {m: figs[m]["median_tokens_per_s_per_gpu"] for m in runs},
    "median_mfu": {m: figs[m]["median_mfu"] for m in runs},
    "peak_mem_gib": {m: figs[m]["peak_mem_gib"] for m in runs},
    "loss_curves": {m: [runs[m][s]["loss"] for s in common] for m in runs},
}
print(write_result(f"{out}/float8-evidence-1xgpu.json", "bash bench/gpu/float8_evidence.sh", res))
print(json.dumps({k: v for k, v in res.items() if k != "loss_curves"}, indent=1))
EOF

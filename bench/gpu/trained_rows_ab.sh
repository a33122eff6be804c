#!/bin/bash
# One device call (nvidia-h200), from the repo root, after staging TRL as bench_train.sh's header says:
#   git archive <before-commit> src | tar -x -C ab_before      (an untracked folder in the tree, carried)
#   RAYFT_GIT_COMMIT=<sha> BEFORE_SRC=ab_before/src bash bench/gpu/trained_rows_ab.sh
# `rayft bench train` on alpaca EN+ZH (the real workload), qwen2.5-1.5b, micro-batch 16, 1 GPU, three
# invocations in one call: rayft at BEFORE_SRC (the LM head over every position), then rayft and
# trl-best at this tree (the head over the trained positions only), then, if the call has time left,
# THIRD: "before2" (rayft at BEFORE_SRC again: the drift between the first and last run; the default)
# or "chunk16" (rayft at this tree with train.fused_loss_chunk_mem=16). The card's sustained bf16
# rate is measured once, by the second invocation.
# Writes under $OUT: before.json, after.json, the third's .json and each invocation's log.
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
[ -d "${BEFORE_SRC:-}/rayft" ] || { echo "BEFORE_SRC must name a src folder holding rayft"; exit 5; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
START=$(date +%s)
AFTER_PATH=$PYTHONPATH
BEFORE_PATH="/tmp/site:$PWD/$BEFORE_SRC"
bench() {  # NAME RECIPES DEADLINE CEILING_S PYTHONPATH [EXTRA --rayft-set ...]
  local wd=/tmp/bench-$1; rm -rf "$wd"
  local cmd="bench train examples/qwen2.5-1.5b.yaml --workload real --recipes $2 --rayft-set train.micro_batch_size=16 --rayft-set parallel.reshard_after_forward=false ${6:-} --steps 15 --warmup-steps 5 --out $OUT/$1.json --work-dir $wd --timeout-s rayft=200,trl-best=150 --deadline-s $3 --ceiling-s $4 --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=1 --set train.micro_batch_size=16 --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$wd"
  echo "== $1 (PYTHONPATH=$5): rayft $cmd"
  PYTHONPATH=$5 timeout -k 10 "$(( ${3%.*} + 20 ))" python3 -m rayft.cli $cmd > "$OUT/$1.log" 2>&1
  echo "rc=$? after $(( $(date +%s) - START )) s"; grep -E "tokens/s|^\| (rayft|trl)" "$OUT/$1.log" | tail -6
  rm -f "$OUT/$1.png"; [ "$1" = after ] || rm -f "$OUT/$1.md"
}
bench before rayft 170 0 "$BEFORE_PATH"
bench after rayft,trl-best 300 15 "$AFTER_PATH"
left=$(( 540 - ($(date +%s) - START) ))
THIRD=${THIRD:-before2}
if [ "$left" -le 110 ]; then echo "no time for $THIRD ($left s left)"
elif [ "$THIRD" = chunk16 ]; then bench chunk16 rayft $(( left - 20 )) 0 "$AFTER_PATH" "--rayft-set train.fused_loss_chunk_mem=16"
else bench before2 rayft $(( left - 20 )) 0 "$BEFORE_PATH"; fi
ls -la "$OUT"

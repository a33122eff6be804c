#!/bin/bash
# One device call (nvidia-h200), from the repo root: RAYFT_GIT_COMMIT=<sha> bash bench/gpu/trained_rows_check.sh
# The LM head over the trained positions on a GPU, end to end: the GPU tests (varlen attention and the
# fused loss against the plain one), then a 30-step `rayft train` of the qwen2.5-1.5b preset on alpaca
# EN+ZH with float8 (decoder linears; the LM head stays bf16), a held-out 2% evaluated every 10 steps
# (the no-grad path of the loss), a checkpoint at step 30 and the checked export (its probe compares
# the model's own logits, not the loss). Writes under $OUT: gpu-tests.log, train.log, the run's rayft_summary.json and
# rayft_metrics.jsonl, its export check.
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/gpu-tests.log" 2>&1; echo "gpu tests rc=$?"; tail -3 "$OUT/gpu-tests.log"
RUN=/tmp/trained-rows-run; rm -rf "$RUN"
timeout -k 10 400 python3 -m rayft.cli train examples/qwen2.5-1.5b.yaml \
  --set model.name_or_path=qwen2.5-1.5b --set "data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json]" \
  --set data.validation_fraction=0.02 --set data.cache_dir=null --set train.num_workers=1 --set train.micro_batch_size=16 \
  --set train.activation_checkpointing=false --set train.max_steps=30 --set train.epochs=10 --set train.eval_every=10 \
  --set train.float8=true --set checkpoint.storage_path=$RUN --set checkpoint.name=r --set checkpoint.every_steps=null \
  > "$OUT/train.log" 2>&1
echo "train rc=$?"; grep -E "step (1|10|20|30)/|eval|export" "$OUT/train.log" | tail -12
cp "$RUN/r/rayft_summary.json" "$RUN/r/rayft_metrics.jsonl" "$RUN/r/hf/rayft_export_check.json" "$OUT/" 2>/dev/null
ls -la "$OUT"

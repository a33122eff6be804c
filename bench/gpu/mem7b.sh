#!/bin/bash
# On nvidia-h200-x2, from the repo root (issue #4, memory mode): full fine-tuning of the
# Qwen2.5-7B architecture (random init) on 2 GPUs with activation checkpointing, random
# full-length rows, seq 2048; no CPU offload (fp32 weights + grads + AdamW: 16 B/param,
# 7.6e9 × 16 / 2 ≈ 61 GB per GPU before activations, inside 139 GiB). No checkpoint is written:
# the 7B run's 91 GB of DCP state would take minutes of the 10-minute call to write.
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/mem7b.sh     (env: STEPS=12 MB=4 COMPILE=true RUN_TIMEOUT=420)
# Writes $OUT/mem7b-run.tar.gz (rayft_summary.json, rayft_metrics.jsonl with time_setup_*, log) and
# $OUT/mem7b-summary.json (the run record, rayft.benchmarks.record).
set -uo pipefail
[ -n "${PYTHONPATH:-}" ] && python3 -c "import ray" 2>/dev/null || source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}
STEPS=${STEPS:-12}; MB=${MB:-4}; STORE=${STORE:-/tmp/mem7b-runs}; rm -rf "$STORE"; mkdir -p "$STORE"
ROWS=$(( STEPS * NG * MB ))
timeout -k 10 "${RUN_TIMEOUT:-420}" python3 -m rayft.cli train examples/qwen2.5-1.5b.yaml \
  --set "model.name_or_path=${MODEL:-qwen2.5-7b}" --set "train.num_workers=$NG" --set "train.micro_batch_size=$MB" \
  --set "train.max_steps=$STEPS" --set train.warmup_steps=1 --set train.activation_checkpointing=true \
  --set "train.compile=${COMPILE:-true}" --set "data.train_files=[]" --set "data.synthetic={rows: $ROWS, seed: 0}" \
  --set "checkpoint.storage_path=$STORE" --set checkpoint.name=mem7b --set checkpoint.every_steps=null \
  --set checkpoint.export_hf=false --set checkpoint.save_final=false ${EXTRA_SETS:-} > "$STORE/mem7b.log" 2>&1
rc=$?; echo "exit $rc"; grep -v "NCCL INFO\|PlacementGroupCleaner\|Reporting training" "$STORE/mem7b.log" | tail -15
[ $rc -eq 0 ] && python3 -m rayft.benchmarks.record "$STORE/mem7b" "$OUT/mem7b-summary.json" \
  --command "bash bench/gpu/mem7b.sh (STEPS=$STEPS MB=$MB COMPILE=${COMPILE:-true} NG=$NG)" 2>&1 | tail -2
(cd "$STORE" && find . -maxdepth 2 \( -name '*.log' -o -name 'rayft_summary.json' -o -name rayft_metrics.jsonl \) -printf '%P\n' | tar -czf "$OUT/mem7b-run.tar.gz" -T -)
ls -la "$OUT"
exit $rc

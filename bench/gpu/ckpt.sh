#!/bin/bash
# On nvidia-h200-x2, from the repo root (issue #5): checkpoint save and load times of Qwen2.5-1.5B
# (random init, random full-length rows, 2 workers, micro-batch 8, compile off) to the host's local
# disk, DCP writer threads per rank 1 vs 8, then a resume of the 8-thread run (load time).
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/ckpt.sh        (env: STEPS=70 EVERY=20 STORE=/tmp/ckpt-runs THREADS="1 8" RUN_TIMEOUT=170)
# A device call of its own: 3 runs of up to RUN_TIMEOUT s each (one with 1 thread did not finish in 140 s).
# Writes $OUT/ckpt-runs.tar.gz: each run's rayft_summary.json (checkpoint timings, resumes),
# rayft_metrics.jsonl (prestage_s at the first step) and log.
set -uo pipefail
[ -n "${PYTHONPATH:-}" ] && python3 -c "import ray" 2>/dev/null || source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}
THREADS=${THREADS:-1 8}; STEPS=${STEPS:-70}; EVERY=${EVERY:-20}; STORE=${STORE:-/tmp/ckpt-runs}; rm -rf "$STORE"; mkdir -p "$STORE"
df -h "$STORE" | tail -1
ROWS=$(( (STEPS + 10) * NG * ${MB:-8} ))
MODEL=${MODEL:-qwen2.5-1.5b}; MB=${MB:-8}
# EXTRA_SETS: more `--set key=value` words, split on spaces (no value may contain one)
common=(--set "model.name_or_path=$MODEL" --set "train.num_workers=$NG" --set "train.micro_batch_size=$MB" --set train.compile=false
  --set train.activation_checkpointing=false --set "data.train_files=[]" --set "data.synthetic={rows: $ROWS, seed: 0}"
  --set "checkpoint.storage_path=$STORE" --set "checkpoint.every_steps=$EVERY" --set checkpoint.export_hf=false --set checkpoint.keep_last=2
  ${EXTRA_SETS:-})
worst=0; last=
for t in $THREADS; do
  echo "== write_threads=$t"
  timeout -k 10 "${RUN_TIMEOUT:-170}" python3 -m rayft.cli train examples/qwen2.5-1.5b.yaml "${common[@]}" --set "train.max_steps=$STEPS" \
    --set "checkpoint.write_threads=$t" --set "checkpoint.name=threads$t" > "$STORE/threads$t.log" 2>&1
  rc=$?; echo "exit $rc"; [ $rc -gt $worst ] && worst=$rc; [ $rc -eq 0 ] && last=threads$t
done
if [ -n "$last" ]; then
  echo "== resume $last"
  cp "$STORE/$last/rayft_summary.json" "$STORE/$last/rayft_summary.before-resume.json"
  timeout -k 10 "${RUN_TIMEOUT:-170}" python3 -m rayft.cli train examples/qwen2.5-1.5b.yaml "${common[@]}" --set "train.max_steps=$((STEPS + 2))" \
    --set "checkpoint.name=$last" --resume "$STORE/$last" > "$STORE/resume.log" 2>&1
  rc=$?; echo "exit $rc"; [ $rc -gt $worst ] && worst=$rc; grep -E "resum|loaded" "$STORE/resume.log" | tail -4
else
  echo "no run finished: no resume"
fi
(cd "$STORE" && find . -maxdepth 2 \( -name '*.log' -o -name 'rayft_summary*.json' -o -name rayft_metrics.jsonl \) -printf '%P\n' | tar -czf "$OUT/ckpt-runs.tar.gz" -T -)
ls -la "$OUT"
exit $worst

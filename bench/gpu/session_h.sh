#!/bin/bash
# Fourth call of the sixth session (nvidia-h200, 1 GPU): rayft's bf16 step (micro-batch 16, loss
# chunk 8) with the SM clock, power and clock-event reasons sampled every 100 ms and a profile of
# two steps (kernel time by kind); then bench/gpu/ckpt.sh (disk, 1 vs 8 writer threads, resume)
# in what is left of the call. Outputs packed into one archive.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,nounits -lms 100 > "$W/step.smi.csv" &
SMI=$!
date +%s.%N > "$W/step.t0"
timeout -k 5 150 python3 bench/gpu/step_anatomy.py --ng 1 --skip-kernels --variants ce8 --mb 16 --steps 20 --trace "$W/trace.json.gz" --out "$W/anatomy-mb16-trace.json" > "$W/anatomy.log" 2>&1
echo "== step rc=$? ($(( $(date +%s) - t0 )) s)"; grep '^\[variant' "$W/anatomy.log"; grep -A9 gpu_ms_by_kind "$W/anatomy-mb16-trace.json" | head -10
date +%s.%N > "$W/step.t1"
kill $SMI; rm -f "$W/trace.json.gz"
left=$((t0 + 560 - $(date +%s)))
STEPS=40 RUN_TIMEOUT=$(( (left - 30) / 3 )) OUT="$W" bash bench/gpu/ckpt.sh 2>&1 | tail -12
tar czf "$OUT/session-h.tgz" -C "$W" .

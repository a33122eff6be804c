#!/bin/bash
# One device call on nvidia-h200-x2 (2026-11-30, fifth session): the step's anatomy (kernels alone,
# candidate variants, a profiled step) and TRL at its best on alpaca at micro-batch 16.
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/session_c.sh
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
timeout -k 5 330 python3 bench/gpu/step_anatomy.py --ng 2 --mb 16 --out "$OUT/step-anatomy-2xh200.json" \
  --trace "$OUT/trace-rank0.json.gz" > "$OUT/step-anatomy.log" 2>&1
echo "step_anatomy rc=$?"; grep -v -i warn "$OUT/step-anatomy.log" | tail -60
RECIPES=trl-best MB=16 WORKLOAD=real DEADLINE_S=190 BENCH_TIMEOUT=210 bash bench/gpu/bench_train.sh > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -25 "$OUT/bench.log"

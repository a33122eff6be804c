#!/bin/bash
# Sixth session, one call on nvidia-h200 (1 GPU): the card's sustained bf16 matrix rate for this
# model's shapes, with the SM clock and power sampled, then rayft's step at micro-batch 16, 24,
# 16 × 2 accumulated, and 16 with Inductor's GEMM autotuning, the clock sampled alongside.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT/smi-q.txt" 2>&1
timeout -k 5 120 python3 bench/gpu/matmul_ceiling.py --seconds 20 --out "$OUT/matmul-ceiling.json" > "$OUT/matmul-ceiling.log" 2>&1
echo "== ceiling rc=$?"; cat "$OUT/matmul-ceiling.log" | tail -5
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,nounits -lms 100 > "$OUT/steps.smi.csv" &
SMI=$!
run() {  # name, limit (s), env assignments ("" for none), step_anatomy arguments
  local name=$1 limit=$2 envs=$3; shift 3
  echo "$name start $(date +%s.%N)" >> "$OUT/steps.phases"
  env $envs timeout -k 5 "$limit" python3 bench/gpu/step_anatomy.py --ng 1 --skip-kernels --variants ce8 --out "$OUT/anatomy-$name.json" "$@" > "$OUT/anatomy-$name.log" 2>&1
  echo "== $name rc=$?"; grep '^\[variant' "$OUT/anatomy-$name.log"
  echo "$name end $(date +%s.%N)" >> "$OUT/steps.phases"
}
run mb16 110 '' --mb 16 --steps 10
run mb24 110 '' --mb 24 --steps 10
run mb16acc2 110 '' --mb 16 --accum 2 --steps 6
run mb16autotune 200 'TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1' --mb 16 --steps 10
kill $SMI

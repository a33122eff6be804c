#!/bin/bash
# Second device call of the fifth session (nvidia-h200-x2): step variants of rayft's bf16 step.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
run() {  # name, env assignments ("" for none), step_anatomy arguments
  local name=$1 envs=$2; shift 2
  env $envs timeout -k 5 150 python3 bench/gpu/step_anatomy.py --ng 2 --skip-kernels --out "$OUT/anatomy-$name.json" "$@" > "$OUT/anatomy-$name.log" 2>&1
  echo "== $name rc=$?"; grep '^\[variant' "$OUT/anatomy-$name.log"; grep -A12 gpu_ms_by_kind "$OUT/anatomy-$name.json" | head -14
}
run a '' --variants cudnn_ce8,cudnn_ce16,ce8,ce16 --mb 16 --trace "$OUT/trace-ce16-flash.json.gz"
run simple NCCL_PROTO=Simple --variants cudnn_ce16 --mb 16 --trace "$OUT/trace-simple.json.gz"
run simple8 'NCCL_PROTO=Simple NCCL_MAX_CTAS=8' --variants cudnn_ce16 --mb 16
run bf16rs '' --variants cudnn_ce16 --mb 16 --reduce-dtype bfloat16
run mb24 '' --variants cudnn_ce16 --mb 24

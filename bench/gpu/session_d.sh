#!/bin/bash
# One device call on nvidia-h200-x2 (~560 s): `rayft bench fabric` (issue #6) then the checkpoint
# timings (issue #5, bench/gpu/ckpt.sh).
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/session_d.sh
set -u
source .gpu/setup.sh
STEPS=${FABRIC_STEPS:-20} SWEEP_MIB=${SWEEP_MIB:-512} RUN_TIMEOUT=${RUN_TIMEOUT:-200} BENCH_TIMEOUT=${BENCH_TIMEOUT:-330} STORE=/dev/shm/runs \
  bash bench/gpu/fabric.sh; a=$?
RUN_TIMEOUT=${CKPT_RUN_TIMEOUT:-140} bash bench/gpu/ckpt.sh; b=$?
echo "exit: fabric $a, ckpt $b"
exit $(( a > b ? a : b ))

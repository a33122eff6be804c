#!/bin/bash
# One device call: torchtitan_h2h.sh twice (a: rayft,torchtitan,rayft-fp8,torchtitan-fp8 at rayft's default, compute copies
# on one GPU; b: rayft-fp8 with parallel.single_worker=fsdp2), 20 steps each, then the GPU tests.
#   RAYFT_GIT_COMMIT=<sha> OUT=... bash bench/gpu/compute_copy_h2h.sh
set -uo pipefail
START=$(date +%s)
mkdir -p $OUT/a $OUT/b
OUT=$OUT/a STEPS=20 WARM=6 DEADLINE_S=390 BENCH_TIMEOUT=410 bash bench/gpu/torchtitan_h2h.sh > /dev/null 2>&1
echo "a done after $(( $(date +%s) - START )) s"; grep -E "^\| (rayft|torchtitan)" $OUT/a/bench-*.log | tail -5
left=$(( 560 - ($(date +%s) - START) ))
if [ $left -gt 100 ]; then
OUT=$OUT/b RECIPES=rayft-fp8 RAYFT_SET=parallel.single_worker=fsdp2 STEPS=20 WARM=6 DEADLINE_S=$(( left - 40 )) BENCH_TIMEOUT=$(( left - 30 )) bash bench/gpu/torchtitan_h2h.sh > /dev/null 2>&1
echo "b done after $(( $(date +%s) - START )) s"; grep -E "^\| (rayft|torchtitan)" $OUT/b/bench-*.log | tail -3
fi
left=$(( 590 - ($(date +%s) - START) ))
[ $left -gt 25 ] && (source .gpu/setup.sh >/dev/null; timeout $left python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -15)

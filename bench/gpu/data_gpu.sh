#!/bin/bash
# On the GPU host (device tool), from the repo root, .gpu carried (issue 18's GPU-host figures):
#   OLD=.gpu/old SCALE_BASE=30000 bash bench/gpu/data_gpu.sh
# 1. bench/gpu/same_figures.sh (ROUNDS=1): the 1.5B preset's `rayft train` with OLD's src/ and this
#    tree's, alternating; same first-step loss and tokens/s within ±2% is the target.
# 2. Ingest throughput by CPU count: bench/data_scale.py --mode ray --cpus C for C = 1, 2, 4, 8, 16
#    with the Qwen2.5 tokenizer, SCALE_BASE × C records each (weak scaling: every point runs about as
#    long, so start-up costs weigh the same); records/s per point in $OUT/scale-cpus-C/. SCALE_CPUS picks the points.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
[ -z "${SKIP_AB:-}" ] && ROUNDS=${ROUNDS:-1} OUT="$OUT" bash bench/gpu/same_figures.sh 2>&1 | tail -n 12  # SKIP_AB=1: the ingest series only
BASE=${SCALE_BASE:-30000}
for C in ${SCALE_CPUS:-1 2 4 8 16}; do
  N=$((BASE * C)); mkdir -p "$OUT/scale-cpus-$C"
  echo "=== ingest, Ray Data on $C CPUs, $N records"
  timeout ${SCALE_TIMEOUT:-150} python3 bench/data_scale.py --records "$N" --cpus "$C" --mode ray --out "$OUT/scale-cpus-$C" \
    --label "ray-${C}cpu" > "$OUT/scale-cpus-$C/log.txt" 2>&1
  echo "exit $?"; grep -E '^\{' "$OUT/scale-cpus-$C/log.txt" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'prepare_records_per_s' in r:
        print(f\"cpus $C: {r['records']} records in {r['prepare_wall_s']} s = {r['prepare_records_per_s']} records/s; driver peak RSS {r['prepare_driver_peak_rss_mib']} MiB\")
"
done

#!/bin/bash
# Third call of the sixth session (nvidia-h200, 1 GPU): issue 9 part 3 emulated on one GPU. Each
# line is one process playing rank 0 of 8 under a 22.5 GiB cap (bench/gpu/l4_fit_fakepg.py),
# micro-batches ascending until one runs out of memory. Outputs packed into one archive.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
t0=$(date +%s); deadline=$((t0 + ${DEADLINE_S:-540}))
fit() {  # name, arguments
  local name=$1; shift
  local left=$((deadline - $(date +%s)))
  [ $left -lt 40 ] && { echo "== $name: no time left"; return; }
  timeout -k 5 $((left - 5)) python3 bench/gpu/l4_fit_fakepg.py --out "$W/l4fit-$name.json" "$@" > "$W/l4fit-$name.log" 2>&1
  echo "== $name rc=$? ($(( $(date +%s) - t0 )) s)"; grep '^\[l4fit\]' "$W/l4fit-$name.log" | cut -c1-260
}
fit ac-seq2048 --ac --seq 2048 --mbs 2,4,8,16,32
fit seq2048 --seq 2048 --mbs 1,2,4,8
fit seq4096 --seq 4096 --mbs 1,2,4
fit seq1024 --seq 1024 --mbs 2,4,8,16
fit ac-seq4096 --ac --seq 4096 --mbs 2,4,8,16
fit seq8192 --seq 8192 --mbs 1,2
fit ac-seq8192 --ac --seq 8192 --mbs 1,2,4,8
tar czf "$OUT/session-g.tgz" -C "$W" .

#!/bin/bash
# Issue 23, §32: torchtitan_h2h.sh at the new tree (rayft, torchtitan, rayft-fp8, torchtitan-fp8,
# the card's ceiling first), then rayft and rayft-fp8 from the archived old tree, in one device call.
# Stage as torchtitan_h2h.sh says, and `git archive <old-sha> src examples | gzip > .gpu/old-src.tar.gz`; then
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/prefetch_h2h.sh
# Writes under $OUT/new and $OUT/old what torchtitan_h2h.sh writes.
set -uo pipefail
START=$(date +%s)
# the old tree: its src and examples, this tree's bench scripts and .gpu (setup.sh puts ./src first)
OLD=/tmp/old-tree; rm -rf "$OLD" && mkdir -p "$OLD" && tar -xzf .gpu/old-src.tar.gz -C "$OLD" || exit 4
ln -s "$PWD/.gpu" "$OLD/.gpu" && cp -r bench "$OLD/bench"
mkdir -p "$OUT/new" "$OUT/old"
OUT=$OUT/new STEPS=20 WARM=6 DEADLINE_S=360 BENCH_TIMEOUT=380 bash bench/gpu/torchtitan_h2h.sh > "$OUT/new/call.log" 2>&1
echo "new done after $(( $(date +%s) - START )) s"; grep -E "^\| (rayft|torchtitan)" "$OUT"/new/bench-*.log | tail -5
left=$(( 575 - ($(date +%s) - START) ))
if [ $left -gt 120 ]; then
  (cd "$OLD" && RAYFT_GIT_COMMIT=${OLD_COMMIT:-old} OUT=$OUT/old RECIPES=rayft,rayft-fp8 STEPS=20 WARM=6 DEADLINE_S=$(( left - 30 )) BENCH_TIMEOUT=$(( left - 20 )) \
    bash bench/gpu/torchtitan_h2h.sh > "$OUT/old/call.log" 2>&1)
  echo "old done after $(( $(date +%s) - START )) s"; grep -E "^\| (rayft|torchtitan)" "$OUT"/old/bench-*.log | tail -3
else
  echo "no time for the old tree ($left s left)"
fi

#!/bin/bash
# Fourth call of the sixth session (nvidia-h200, 1 GPU): rayft's bf16 step (micro-batch 16, loss
# chunk 8) with the SM clock, power and clock-event reasons sampled every 100 ms, and a profile of
# two steps (kernel time by kind); the figures are printed (the first try's files did not come back).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,nounits -lms 100 > "$W/step.smi.csv" &
SMI=$!
timeout -k 5 150 python3 bench/gpu/step_anatomy.py --ng 1 --skip-kernels --variants ce8 --mb 16 --steps 20 --trace "$W/trace.json.gz" --out "$W/anatomy.json" > "$W/anatomy.log" 2>&1
echo "== step rc=$?"; grep '^\[variant' "$W/anatomy.log"
kill $SMI
python3 - "$W" <<'PY'
import csv, json, statistics, sys
w = sys.argv[1]
d = json.load(open(f"{w}/anatomy.json"))
print(json.dumps({"variants": d["variants"], "gpu_ms_by_kind": d["profile"]["gpu_ms_by_kind"], "compute_idle_share": d["profile"]["compute_idle_share"]}))
rows = [r for r in csv.reader(open(f"{w}/step.smi.csv"))][1:]
busy = [r for r in rows if float(r[2]) > 400]  # samples while the GPU works hard (idle draws ~80 W)
print(json.dumps({"samples": len(rows), "busy_samples": len(busy), "sm_mhz_median_busy": statistics.median(float(r[1]) for r in busy),
                  "sm_mhz_range_busy": [min(float(r[1]) for r in busy), max(float(r[1]) for r in busy)],
                  "power_w_median_busy": statistics.median(float(r[2]) for r in busy),
                  "reasons_busy": {k: sum(1 for r in busy if r[3].strip() == k) for k in {r[3].strip() for r in busy}}}))
PY
cp "$W/anatomy.json" "$W/step.smi.csv" "$OUT/"

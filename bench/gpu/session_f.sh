#!/bin/bash
# Second call of the sixth session (nvidia-h200): the card's clocks, power limit and throttle
# reasons while it multiplies square bf16 matrices of three sizes and one layer's products; every
# output packed into one archive (the device tool returns at most 8 files).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; W=$(mktemp -d); mkdir -p "$OUT"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE > "$W/smi-q-before.txt" 2>&1
timeout -k 5 150 python3 bench/gpu/matmul_ceiling.py --seconds 10 --squares 4096,8192,16384 --out "$W/matmul-ceiling.json" > "$W/matmul-ceiling.log" 2>&1
echo "== ceiling rc=$?"; tail -6 "$W/matmul-ceiling.log"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE > "$W/smi-q-after.txt" 2>&1
python3 - "$W" <<'PY'
import csv, json, sys
w = sys.argv[1]
res = json.load(open(f"{w}/matmul-ceiling.json"))
rows = list(csv.reader(open(f"{w}/matmul-ceiling.json.smi.csv")))
print("smi header", rows[0])
import statistics
from datetime import datetime
def ts(r): return datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
for k, v in res.items():
    if isinstance(v, list):
        t0, t1 = v[1]["t0"] if len(v) > 1 else v[0]["t0"], v[-1]["t1"]
        sel = [r for r in rows[1:] if t0 <= ts(r) <= t1]
        if sel:
            print(k, "sm MHz median", statistics.median(float(r[1]) for r in sel), "power W median", statistics.median(float(r[3]) for r in sel),
                  "throttle", sorted({r[6].strip() for r in sel}))
PY
tar czf "$OUT/session-f.tgz" -C "$W" .

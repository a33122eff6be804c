#!/bin/bash
# On the GPU host (device tool), from the repo root:  bash bench/gpu/speed_matrix.sh [1|2]
# One measured change at a time on top of plain FSDP2 (bench/NOTES.md), then the GPU tests.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M="$OUT/matrix.jsonl"
python3 -c "import inspect, torch.nn.attention.varlen as v; print('varlen_attn', inspect.signature(v.varlen_attn))" 2>&1 | tail -1
run() { echo "== $*"; timeout ${VT:-150} python3 bench/gpu/speed_matrix.py --out "$M" "$@" > "$OUT/last.log" 2>&1; grep -E "RESULT|Error|error:" "$OUT/last.log" | tail -4; }
G=${1:-1}
run --name base-sdpa-torchce --gpus $G --attn sdpa --ce torch
run --name fusedce --gpus $G --attn sdpa --ce fused
run --name fusedce-compile --gpus $G --attn sdpa --ce fused --compile
run --name fusedce-compile-varlen --gpus $G --attn varlen --ce fused --compile
run --name fusedce-compile-varlen-mb16 --gpus $G --attn varlen --ce fused --compile --mb 16
run --name fusedce-liger-varlen --gpus $G --attn varlen --ce fused --liger
run --name packed-sdpa-compile --gpus $G --attn sdpa --ce fused --compile --data packed
run --name packed-varlen-compile --gpus $G --attn varlen --ce fused --compile --data packed
run --name packed-flex-compile --gpus $G --attn flex_attention --ce fused --compile --data packed
run --name fusedce-compile-varlen-mb16-noreshard --gpus 2 --attn varlen --ce fused --compile --mb 16 --no-reshard
run --name fusedce-compile-varlen-mb16-2gpu --gpus 2 --attn varlen --ce fused --compile --mb 16
echo "== gpu tests"; timeout 200 python3 -m pytest -q -x tests/gpu 2>&1 | tail -15

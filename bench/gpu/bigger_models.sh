#!/bin/bash
# On the GPU host (device tool), from the repo root, .gpu carried (issue 25):
#   PART=1 bash bench/gpu/bigger_models.sh    # the 1.5B's modes, 7B and 14B on emulated L4s
#   PART=2 bash bench/gpu/bigger_models.sh    # 32B on emulated H200s
# Each point: bench/gpu/l4_fit_fakepg.py, rank 0 of 8 through the fake process group, seq 2048,
# PyTorch's memory capped at the emulated card's (22.5 GiB for an L4); one results file per model
# under $OUT (l4fit-MODEL-CARD.json), written after every micro-batch so a cut call keeps its rows.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
free -g | head -2
F=bench/gpu/l4_fit_fakepg.py
run() { local tag=$1; shift; echo "=== $tag: $*"; local t=$SECONDS; timeout "${T:-300}" python3 $F "$@" --out "$OUT/l4fit-$tag.json" 2>&1 | grep -E "^\[l4fit\]|Error|error" | tail -20; echo "($((SECONDS - t)) s)"; }
case ${PART:-1} in
  1)
    T=200 run qwen2.5-1.5b-L4 --model qwen2.5-1.5b --modes none,ac,ac2,offload,ac+offload --mbs 4
    T=200 run qwen2.5-7b-L4 --model qwen2.5-7b --modes ac,ac+offload --mbs 1,2,4,6 --warm 1 --steps 2
    T=180 run qwen2.5-14b-L4 --model qwen2.5-14b --modes ac+offload --mbs 1,2,3,4 --warm 1 --steps 2
    ;;
  2)
    T=250 run qwen2.5-32b-H200 --model qwen2.5-32b --limit-gib 139 --modes ac --mbs 4,14,16 --warm 1 --steps 2
    ;;
esac
ls -la "$OUT"

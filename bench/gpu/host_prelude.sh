#!/bin/bash
# Sourced by the GPU host's harnesses after `set -uo pipefail`, from the repository root: the staged
# packages (.gpu/setup.sh), offline Hugging Face, NVLink multicast off, OUT (default /tmp/out) made,
# and D = the staged alpaca files' folder (exits 3 when they are missing).
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3

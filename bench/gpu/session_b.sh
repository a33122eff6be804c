#!/bin/bash
# On nvidia-h200-x2, from the repo root:  RAYFT_GIT_COMMIT=<sha> bash bench/gpu/session_b.sh
# `rayft bench fabric` (NVLink vs forced sockets, checkpoints in RAM so saves stay short), then
# the padded-rows run that session_a.sh could not record in its time limit.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=15 STORE=/dev/shm/runs SWEEP_MIB=256 RUN_TIMEOUT=150 BENCH_TIMEOUT=360 bash bench/gpu/fabric.sh
source .gpu/setup.sh
D="$PWD/.gpu/data"; NG=$(nvidia-smi -L | wc -l)
CMD="rayft train examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=8 --set train.activation_checkpointing=false --set train.compile=true --set train.lr=3e-4 --set train.warmup_steps=5 --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set checkpoint.storage_path=/dev/shm/runs --set ray.max_failures=0 --set checkpoint.name=padded --set train.max_steps=30 --set data.packing=false --set checkpoint.every_steps=null --set checkpoint.export_hf=false"
timeout 150 python3 -m rayft.cli ${CMD#rayft } > /tmp/padded.log 2>&1; echo "padded rc=$?"; grep -v -E "^\s*$" /tmp/padded.log | tail -12
python3 -m rayft.benchmarks.record /dev/shm/runs/padded "$OUT/train-padded-${NG}xh200.json" --command "$CMD"

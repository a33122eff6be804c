#!/bin/bash
# On nvidia-h200-x2, from the repo root:  RAYFT_GIT_COMMIT=<sha> bash bench/gpu/session_a.sh
# GPU tests; checkpoint save/load timings and packed-vs-padded throughput through `rayft train`
# (2 GPUs, real data); the attention choice for packed rows (1 GPU, step timer).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; DATA="[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json]"
NG=$(nvidia-smi -L | wc -l)
echo "== gpu tests"; timeout 150 python3 -m pytest -q -x tests/gpu 2>&1 | tail -6
BASE="examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=8 --set train.activation_checkpointing=false --set train.compile=true --set train.lr=3e-4 --set train.warmup_steps=5 --set data.train_files=$DATA --set checkpoint.storage_path=/tmp/runs --set ray.max_failures=0"
train() { local name=$1; shift; echo "== $name: $*"; timeout ${TT:-200} python3 -m rayft.cli train $BASE --set checkpoint.name=$name "$@" > /tmp/$name.log 2>&1; echo "rc=$?"; grep -v -E "^\s*$" /tmp/$name.log | tail -12; }
train ckpt --set train.max_steps=40 --set checkpoint.every_steps=10 --set checkpoint.export_hf=false
python3 -m rayft.benchmarks.record /tmp/runs/ckpt "$OUT/train-packed-ckpt-${NG}xh200.json" --command "rayft train $BASE --set checkpoint.name=ckpt --set train.max_steps=40 --set checkpoint.every_steps=10 --set checkpoint.export_hf=false"
train ckpt --set train.max_steps=45 --set checkpoint.every_steps=10 --set checkpoint.export_hf=true --resume /tmp/runs/ckpt
python3 -m rayft.benchmarks.record /tmp/runs/ckpt "$OUT/train-packed-resume-${NG}xh200.json" --command "rayft train ... --resume /tmp/runs/ckpt (max_steps 45, export_hf)"
train padded --set train.max_steps=40 --set data.packing=false --set checkpoint.every_steps=null --set checkpoint.export_hf=false
python3 -m rayft.benchmarks.record /tmp/runs/padded "$OUT/train-padded-${NG}xh200.json" --command "rayft train $BASE --set checkpoint.name=padded --set train.max_steps=40 --set data.packing=false --set checkpoint.every_steps=null --set checkpoint.export_hf=false"
M="$OUT/matrix.jsonl"
run() { echo "== $*"; timeout ${VT:-110} python3 bench/gpu/speed_matrix.py --out "$M" "$@" > /tmp/last.log 2>&1; grep -E "RESULT|Error|error:" /tmp/last.log | tail -3; }
run --name packed-varlen-compile --attn varlen --ce fused --compile --data packed --steps 6 --warmup 3
ls -la $OUT

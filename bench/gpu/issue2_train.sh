#!/bin/bash
# On the GPU host (device tool), from the repo root:  bash bench/gpu/issue2_train.sh
# Fine-tunes the Qwen2.5-1.5B architecture (random init) on ../shared/data alpaca EN + ZH with every
# local GPU for 200 steps, then records tokens/s/GPU, MFU, peak memory, the loss curve and the export check.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SH=$(ls -d ../shared 2>/dev/null || ls -d shared 2>/dev/null || echo .gpu)  # the data travels in the carried .gpu/data
echo "shared at: $SH"; ls "$SH/data" || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
NG=$(nvidia-smi -L | wc -l)
STEPS=${STEPS:-200}; MB=${MB:-8}
CMD="rayft train examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=$MB --set train.max_steps=$STEPS --set train.lr=3e-4 --set train.warmup_steps=20 --set train.activation_checkpointing=false --set data.train_files=[$SH/data/alpaca_en_demo.json,$SH/data/alpaca_zh_demo.json] --set checkpoint.storage_path=/tmp/runs --set checkpoint.name=issue2 --set checkpoint.every_steps=null"
echo "$CMD"
timeout ${TRAIN_TIMEOUT:-480} python3 -m rayft.cli ${CMD#rayft } 2>&1 | tee "$OUT/train.log" | grep -v -E "^\s*$" | tail -40
python3 -m rayft.benchmarks.record /tmp/runs/issue2 "$OUT/issue2-train-qwen2.5-1.5b-${NG}xgpu.json" --command "$CMD"
ls -la /tmp/runs/issue2 /tmp/runs/issue2/hf

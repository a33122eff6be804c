#!/bin/bash
# Issue 23's head-to-head with torchtitan, on one GPU, through `rayft bench train`:
#   RAYFT_GIT_COMMIT=<sha> SEQ=2048 MB=8 bash bench/gpu/torchtitan_h2h.sh     (one call per SEQ/MB)
# env: SEQ (2048), MB (8: every recipe's micro-batch; equal tokens per step), RECIPES
# (rayft,torchtitan,rayft-fp8,torchtitan-fp8), PRESET (qwen3-1.7b: a model torchtitan has a flavour
# for), STEPS (30), WARM (8), AC (false), DEADLINE_S (520), RAYFT_SET (extra --rayft-set KEY=VALUE).
#
# Stage first, on the development machine (torchtitan 0.2.2 and what the host lacks of its imports;
# host: python 3.12, torch 2.11, transformers 5.17, triton, pandas, pyarrow):
#   bash ../shared/gpu/stage.sh torchtitan==0.2.2 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 \
#     torchdata==0.11.0 einops==0.8.2 datasets==4.8.5 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0 \
#     tensorboard==2.20.0 torchao==0.18.0
#   mkdir -p .gpu/data && cp ../shared/data/alpaca_*_demo.json .gpu/data/
# torchtitan's Requires-Dist (0.2.2): torchdata datasets tokenizers tomli fsspec tyro tensorboard einops
# pillow; tyro 1.0.17: docstring-parser typeguard typing-extensions; datasets as in bench_train.sh.
# tensorboard: torchtitan's metrics module imports torch.utils.tensorboard at its top (its writer is off).
# Writes under $OUT: train-bench-torchtitan-s<SEQ>-mb<MB>.json (rewritten after every run),
# bench-s<SEQ>-mb<MB>.log (the bench's whole output) and run-logs-s<SEQ>-mb<MB>.tar.gz (each run's log,
# the torchtitan runs' settings.json, the table .md).
set -uo pipefail
source bench/gpu/host_prelude.sh
python3 -c "
import torch, torchtitan, torchao, torch.utils.tensorboard
from torchtitan.train import Trainer
print('torchtitan', torchtitan.__version__, 'torchao', torchao.__version__, 'torch', torch.__version__)" 2>&1 | tail -5
[ "${PIPESTATUS[0]}" = 0 ] || { echo "stage the wheels in the header"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
SEQ=${SEQ:-2048}; MB=${MB:-8}; TAG="s$SEQ-mb$MB"; WD=/tmp/bench-tt-$TAG; rm -rf "$WD"
RECIPES=${RECIPES:-rayft,torchtitan,rayft-fp8,torchtitan-fp8}
RAYFT_SETS=""; for kv in ${RAYFT_SET:-}; do RAYFT_SETS+=" --rayft-set $kv"; done
CMD="rayft bench train examples/qwen2.5-1.5b.yaml --workload random --recipes $RECIPES$RAYFT_SETS --steps ${STEPS:-30} --warmup-steps ${WARM:-8} --out $OUT/train-bench-torchtitan-$TAG.json --work-dir $WD --timeout-s rayft=200,rayft-fp8=200,torchtitan=200,torchtitan-fp8=200 --deadline-s ${DEADLINE_S:-520} --set model.name_or_path=${PRESET:-qwen3-1.7b} --set train.num_workers=1 --set data.seq_len=$SEQ --set train.micro_batch_size=$MB --set train.activation_checkpointing=${AC:-false} --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$WD"
echo "$CMD"
timeout -k 10 "${BENCH_TIMEOUT:-545}" python3 -m rayft.cli ${CMD#rayft } 2>&1 | tee "$OUT/bench-$TAG.log"
rc=${PIPESTATUS[0]}
mv "$OUT/train-bench-torchtitan-$TAG.md" "$OUT/train-bench-torchtitan-$TAG.png" "$WD"/ 2>/dev/null
(cd "$WD" 2>/dev/null && { ls ./*.md 2>/dev/null; find . -maxdepth 2 \( -name '*.log' -o -name settings.json -o -name 'steps.rank*.jsonl' \) -printf '%P\n'; } | tar -czf "$OUT/run-logs-$TAG.tar.gz" -T -) \
  || echo "no run logs under $WD"
ls -la "$OUT"
exit $rc

#!/bin/bash
# On nvidia-h200-x2, from the repo root (one workload per device call: 8 runs do not fit in 10 minutes):
#   RAYFT_GIT_COMMIT=<sha> WORKLOAD=random bash bench/gpu/bench_train.sh   (then WORKLOAD=real)
# env: RECIPES (default the four of the issue; add rayft-fp8 by name), RAYFT_SET (space-separated
# KEY=VALUE for the rayft recipes only; default "train.micro_batch_size=16
# parallel.reshard_after_forward=false", the settings of the 2026-11-30 run2 results), MB (everyone
# else's micro-batch, 8), NG, STEPS, WARM, RUN_TIMEOUTS.
# `rayft bench train`: sample-recipe, trl-default, trl-best and rayft on the Qwen2.5-1.5B
# architecture (random init, same seeded weights for all), both workloads (random rows; alpaca EN+ZH).
#
# Stage first, on the development machine (TRL + datasets and what the host lacks of their deps;
# host: python 3.12, torch 2.11, transformers 5.17, accelerate, pandas, pyarrow, liger-kernel 0.8.5):
#   bash ../shared/gpu/stage.sh trl==1.16.0 datasets==4.8.5 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0 torchao==0.18.0
# From the wheels' METADATA (Requires-Dist, no extras):
#   trl 1.16.0: accelerate>=1.10.1 datasets>=4.7.0 huggingface_hub>=0.34.0 jinja2 numpy>=1.26 packaging pandas>=2.1.1
#               psutil>=5.9.4 pyarrow>=21 pyyaml>=6.0.1 transformers>=4.56.2 (it gates code on transformers < 5.19, so 5.17 is handled)
#   datasets 4.8.5: filelock numpy pyarrow>=21 dill<0.4.2,>=0.3.0 pandas requests>=2.32.2 httpx<1 tqdm xxhash
#               multiprocess<0.70.20 fsspec[http]<=2026.2.0 huggingface-hub<2,>=0.25 packaging pyyaml
#   multiprocess 0.70.18: dill>=0.4.0;  dill, xxhash: none.
#   Assumed present with transformers/torch/accelerate/ray: huggingface_hub, httpx, jinja2, filelock, fsspec, tqdm,
#   psutil, requests. The import check below stops the script if one is missing.
# Writes under $OUT: train-bench-<workload>.json (rewritten after every run, so a cut-off call still
# leaves the runs done), bench-<workload>.log (the bench's whole output) and run-logs-<workload>.tar.gz
# (every run's log, the TRL runs' settings.json, the table .md and the .png).
# Time: the device call has 600 s; the bench gets --deadline-s 500 (each run is cut to what is left,
# runs that cannot fit are "skipped: no time left") and `timeout -k 10 520` around it (SIGTERM: the
# bench writes what it has and kills the running recipe's process group).
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
python3 -c "import trl, datasets; from trl import SFTTrainer, SFTConfig; print('trl', trl.__version__, 'datasets', datasets.__version__)" || { echo "stage the wheels in the header"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
NG=${NG:-$(nvidia-smi -L | wc -l)}  # NG=1 on a 2-GPU host: the 1-GPU baseline of the scaling target
STEPS=${STEPS:-15}; WARM=${WARM:-5}; MB=${MB:-8}; W=${WORKLOAD:-both}; WD=/tmp/bench-train-$W; rm -rf "$WD"
RECIPES=${RECIPES:-rayft,sample-recipe,trl-default,trl-best}
TIMEOUTS=${RUN_TIMEOUTS:-rayft=200,rayft-fp8=200,sample-recipe=150,trl-default=120,trl-best=120}
RAYFT_SETS=""; for kv in ${RAYFT_SET:-train.micro_batch_size=16 parallel.reshard_after_forward=false}; do RAYFT_SETS+=" --rayft-set $kv"; done  # the rayft recipes only
CMD="rayft bench train examples/qwen2.5-1.5b.yaml --workload $W --recipes $RECIPES$RAYFT_SETS --steps $STEPS --warmup-steps $WARM --out $OUT/train-bench-$W.json --work-dir $WD --timeout-s $TIMEOUTS --deadline-s ${DEADLINE_S:-500} --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=$MB --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$WD"
echo "$CMD"
timeout -k 10 "${BENCH_TIMEOUT:-520}" python3 -m rayft.cli ${CMD#rayft } 2>&1 | tee "$OUT/bench-$W.log"
rc=${PIPESTATUS[0]}
# the .md and .png go into the archive (`rayft bench table` rebuilds both from the JSON): at most 8 files come back
mv "$OUT/train-bench-$W.md" "$OUT/train-bench-$W.png" "$WD"/ 2>/dev/null
(cd "$WD" 2>/dev/null && { ls train-bench-"$W".md train-bench-"$W".png 2>/dev/null; find . -maxdepth 2 \( -name '*.log' -o -name settings.json \) -printf '%P\n'; } | tar -czf "$OUT/run-logs-$W.tar.gz" -T -) \
  || echo "no run logs under $WD"
ls -la "$OUT"
exit $rc

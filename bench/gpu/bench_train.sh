#!/bin/bash
# On nvidia-h200-x2, from the repo root (one workload per device call: 8 runs do not fit in 10 minutes):
#   RAYFT_GIT_COMMIT=<sha> WORKLOAD=random bash bench/gpu/bench_train.sh   (then WORKLOAD=real)
# `rayft bench train`: sample-recipe, trl-default, trl-best and rayft on the Qwen2.5-1.5B
# architecture (random init, same seeded weights for all), both workloads (random rows; alpaca EN+ZH).
#
# Stage first, on the development machine (TRL + datasets and what the host lacks of their deps;
# host: python 3.12, torch 2.11, transformers 5.17, accelerate, pandas, pyarrow, liger-kernel 0.8.5):
#   bash ../shared/gpu/stage.sh trl==1.16.0 datasets==4.8.5 dill==0.4.0 multiprocess==0.70.18 xxhash==3.6.0
# From the wheels' METADATA (Requires-Dist, no extras):
#   trl 1.16.0: accelerate>=1.10.1 datasets>=4.7.0 huggingface_hub>=0.34.0 jinja2 numpy>=1.26 packaging pandas>=2.1.1
#               psutil>=5.9.4 pyarrow>=21 pyyaml>=6.0.1 transformers>=4.56.2 (it gates code on transformers < 5.19, so 5.17 is handled)
#   datasets 4.8.5: filelock numpy pyarrow>=21 dill<0.4.2,>=0.3.0 pandas requests>=2.32.2 httpx<1 tqdm xxhash
#               multiprocess<0.70.20 fsspec[http]<=2026.2.0 huggingface-hub<2,>=0.25 packaging pyyaml
#   multiprocess 0.70.18: dill>=0.4.0;  dill, xxhash: none.
#   Assumed present with transformers/torch/accelerate/ray: huggingface_hub, httpx, jinja2, filelock, fsspec, tqdm,
#   psutil, requests. The import check below stops the script if one is missing.
# Writes under $OUT (at most 8 files): train-bench.json/.md/.png, bench.log, and the logs of failed runs (gz).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
python3 -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" || { echo "stage the wheels in the header"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
NG=$(nvidia-smi -L | wc -l)
STEPS=${STEPS:-20}; WARM=${WARM:-5}; MB=${MB:-8}; WD=/tmp/bench-train; rm -rf "$WD"
CMD="rayft bench train examples/qwen2.5-1.5b.yaml --workload ${WORKLOAD:-both} --recipes ${RECIPES:-sample-recipe,trl-default,trl-best,rayft} --steps $STEPS --warmup-steps $WARM --out $OUT/train-bench-${WORKLOAD:-both}.json --work-dir $WD --timeout-s ${RUN_TIMEOUT:-240} --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=$MB --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$WD"
echo "$CMD"
timeout ${BENCH_TIMEOUT:-580} python3 -m rayft.cli ${CMD#rayft } > /tmp/bench-train.log 2>&1
rc=$?
tail -200 /tmp/bench-train.log > "$OUT/bench.log"
grep -v -E "^\s*$" /tmp/bench-train.log | tail -25
n=0; for f in "$WD"/*.log; do grep -q '"status": "failed"' "$OUT/train-bench-${WORKLOAD:-both}.json" 2>/dev/null || break
  [ $n -lt 3 ] && gzip -c "$f" > "$OUT/$(basename "$f").gz" && n=$((n+1)); done
ls -la "$OUT"
exit $rc

#!/bin/bash
# On the 2x H200 host (device tool), from the repo root:
#   RAYFT_GIT_COMMIT=<commit> bash bench/gpu/fabric.sh
# The same 30-step Qwen2.5-1.5B job (random init, alpaca EN + ZH) twice: over NVLink (NCCL's
# default) and over TCP sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1), each with a collectives
# bus-bandwidth sweep; `rayft doctor` must confirm each run's transport or the bench fails.
# Writes under $OUT (6 files):
#   fabric-<N>xh200.json                         results file (rayft.benchmarks.record)
#   bench.log                                    the bench's own output, last 200 lines
#   {fast,sockets}-{train,sweep}.log.gz           the four runs' full logs (NCCL_DEBUG=INFO)
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
echo "commit: ${RAYFT_GIT_COMMIT:-unset (the results file records git rev-parse HEAD, if any)}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
nvidia-smi topo -m | head -4
NG=$(nvidia-smi -L | wc -l)
STEPS=${STEPS:-30}; MB=${MB:-8}; STORE=${STORE:-/tmp/runs}; SWEEP_MIB=${SWEEP_MIB:-1024}
LOGS=/tmp/fabric-logs; rm -rf "$LOGS" "$STORE"/fabric-*
CMD="rayft bench fabric examples/qwen2.5-1.5b.yaml --mode onehost --out $OUT/fabric-${NG}xh200.json --logs-dir $LOGS --timeout-s ${RUN_TIMEOUT:-300} --sweep-max-mib $SWEEP_MIB --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.max_steps=$STEPS --set train.micro_batch_size=$MB --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set train.compile=false --set checkpoint.storage_path=$STORE --set checkpoint.every_steps=null --set checkpoint.export_hf=false --set ray.max_failures=0"
echo "$CMD"
timeout ${BENCH_TIMEOUT:-570} python3 -m rayft.cli ${CMD#rayft } > /tmp/fabric-bench.log 2>&1
rc=$?
tail -200 /tmp/fabric-bench.log > "$OUT/bench.log"
grep -v -E "PlacementGroupCleaner|^\s*$" /tmp/fabric-bench.log | tail -25
for f in "$LOGS"/*.log; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
ls -la "$OUT"
exit $rc

#!/bin/bash
# On the GPU host (device tool), from the repo root, .gpu carried: issue 18's last two figures.
#   POINT=mem   bash bench/gpu/data_scale_gpu.sh   # driver peak RSS preparing 10M instruction records
#                                                 # (Ray Data on 16 CPUs, the chars4 stand-in tokenizer)
#   POINT=first bash bench/gpu/data_scale_gpu.sh   # `rayft train` to its first step on a 1k- and a
#                                                 # 1M-record prepared store (Qwen2.5 tokenizer)
# Each is one device call (< 10 min); logs and the results file go under $OUT.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
CPUS=${CPUS:-16}
case "${POINT:-mem}" in
  mem) args=(--records ${RECORDS:-10000000} --tokenizer chars4 --label "GPU host, Ray Data on $CPUS CPUs; chars4 stand-in tokenizer") ;;
  first) args=(--records ${RECORDS:-1000 1000000} --train --label "GPU host, Ray Data on $CPUS CPUs; Qwen2.5 tokenizer; rayft train on CPU (qwen2-tiny)") ;;
esac
timeout ${LIMIT:-560} python3 bench/data_scale.py "${args[@]}" --cpus "$CPUS" --mode ray --files 16 --out "$OUT" 2>&1 | tee "$OUT/log.txt" | grep -vE '^\s*$' | tail -n 30
echo "exit ${PIPESTATUS[0]}"; df -h /tmp | tail -1

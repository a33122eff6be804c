#!/bin/bash
# One device call (nvidia-h200), from the repo root, after staging TRL as bench_train.sh's header says:
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/compute_copy_ab.sh
# `rayft bench train` on alpaca EN+ZH (the real workload), qwen2.5-1.5b, micro-batch 16, 1 GPU, three
# invocations in one call, the same tree: rayft with FSDP2 over the one rank
# (parallel.single_worker=fsdp2, main before compute copies), then rayft with its default on one GPU
# (compute copies: rayft.train.compute_copy) and trl-best, then, if the call has time left, FSDP2
# again (the drift between the first and last run). The card's sustained bf16 rate is measured
# once, by the second invocation. Then the GPU tests.
# Writes under $OUT: fsdp2.json, copies.json, fsdp2-again.json and each invocation's log.
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
START=$(date +%s)
bench() {  # NAME RECIPES DEADLINE CEILING_S [EXTRA --rayft-set ...]
  local wd=/tmp/bench-$1; rm -rf "$wd"
  local cmd="bench train examples/qwen2.5-1.5b.yaml --workload real --recipes $2 --rayft-set train.micro_batch_size=16 --rayft-set parallel.reshard_after_forward=false ${5:-} --steps 15 --warmup-steps 5 --out $OUT/$1.json --work-dir $wd --timeout-s rayft=200,trl-best=150 --deadline-s $3 --ceiling-s $4 --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=1 --set train.micro_batch_size=16 --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$wd"
  echo "== $1: rayft $cmd"
  timeout -k 10 "$(( ${3%.*} + 20 ))" python3 -m rayft.cli $cmd > "$OUT/$1.log" 2>&1
  echo "rc=$? after $(( $(date +%s) - START )) s"; grep -E "tokens/s|^\| (rayft|trl)" "$OUT/$1.log" | tail -6
  python3 - "$wd" "$1" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).rglob("rayft_metrics.jsonl")):
    for line in f.read_text().splitlines()[:3]:
        r = json.loads(line)
        print(sys.argv[2], {k: r.get(k) for k in ("step", "loss", "grad_norm", "weights", "peak_mem_gib")})
PY
  rm -f "$OUT/$1.png"; [ "$1" = copies ] || rm -f "$OUT/$1.md"
}
bench fsdp2 rayft 170 0 "--rayft-set parallel.single_worker=fsdp2"
bench copies rayft,trl-best 300 15
left=$(( 520 - ($(date +%s) - START) ))
if [ "$left" -le 110 ]; then echo "no time for fsdp2-again ($left s left)"
else bench fsdp2-again rayft $(( left - 20 )) 0 "--rayft-set parallel.single_worker=fsdp2"; fi
left=$(( 585 - ($(date +%s) - START) ))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -5 | tee "$OUT/gpu-tests.log"
ls -la "$OUT"

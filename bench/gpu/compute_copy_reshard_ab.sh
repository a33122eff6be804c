#!/bin/bash
# One device call (nvidia-h200), from the repo root, .gpu carried:
#   RAYFT_GIT_COMMIT=<sha> BUDGET_S=<seconds> bash bench/gpu/compute_copy_reshard_ab.sh
# Compute copies against FSDP2 over the one rank at the preset's own setting (resharding on, where
# compute_copy_ab.sh ran the bench's reshard_after_forward: false), bf16: `rayft bench train` on
# alpaca EN+ZH, qwen2.5-1.5b, micro-batch 16, 1 GPU, 15 steps (median of steps 6-15), alternating
# fsdp2, copies, fsdp2, copies while BUDGET_S (default 560) allows another (~100 s each).
# Writes under $OUT: fsdp2-1.json, copies-1.json, fsdp2-2.json, copies-2.json and each run's log.
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
START=$(date +%s); BUDGET_S=${BUDGET_S:-560}
for pair in 1 2; do
  for mode in fsdp2 compute_copy; do
    name=$([ $mode = fsdp2 ] && echo fsdp2 || echo copies)-$pair
    left=$(( BUDGET_S - ($(date +%s) - START) ))
    [ "$left" -lt 120 ] && { echo "$name: not started ($left s left)"; continue; }
    wd=/tmp/bench-$name; rm -rf "$wd"
    cmd="bench train examples/qwen2.5-1.5b.yaml --workload real --recipes rayft --rayft-set train.micro_batch_size=16 --rayft-set parallel.single_worker=$mode --steps 15 --warmup-steps 5 --out $OUT/$name.json --work-dir $wd --timeout-s rayft=200 --deadline-s $(( left - 10 )) --ceiling-s 0 --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=1 --set train.micro_batch_size=16 --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$wd"
    echo "== $name: rayft $cmd"
    timeout -k 10 "$(( left - 5 ))" python3 -m rayft.cli $cmd > "$OUT/$name.log" 2>&1
    echo "rc=$? after $(( $(date +%s) - START )) s"; grep -E "^\| rayft" "$OUT/$name.log" | tail -2
    rm -f "$OUT/$name.png" "$OUT/$name.md"
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*-[12].json")):
    d = json.load(open(f))
    for r in d["figures"].get("rows", d["figures"].get("results", [])) if isinstance(d["figures"], dict) else []:
        print(f.name, {k: r.get(k) for k in ("recipe", "tokens_per_s_per_gpu", "peak_mem_gib", "settings") if k in r})
PY

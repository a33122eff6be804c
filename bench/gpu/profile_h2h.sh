#!/bin/bash
# Issue 23: where rayft's step and torchtitan's differ on one GPU, kernel by kernel. One call:
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/profile_h2h.sh
# `rayft bench train` runs the recipes (RECIPES: rayft,torchtitan,rayft-fp8,torchtitan-fp8) on the
# same random rows of the qwen3-1.7b preset (SEQ 2048 × MB 8), STEPS (12) steps each, with
# `--set train.profile_steps=[FIRST,LAST]` (10,11): rayft's runs write each rank's trace through
# train.profile_steps, torchtitan's through its own profiler over the same steps. Then
# `python -m rayft.benchmarks.trace_kernels` reads the traces: GPU time per step by kernel category,
# side by side, and each trace's largest kernels. The traced steps are slower: their rates are not
# speed figures (the bench's median leaves them in; use torchtitan_h2h.sh for speed).
# Stage as in bench/gpu/torchtitan_h2h.sh. Writes under $OUT: kernels-<TAG>.md (the comparison),
# bench-<TAG>.log, train-bench-profile-<TAG>.json, traces-<TAG>.tar (the traces, gzip-compressed).
set -uo pipefail
source bench/gpu/host_prelude.sh
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
SEQ=${SEQ:-2048}; MB=${MB:-8}; FIRST=${FIRST:-10}; LAST=${LAST:-11}; STEPS=${STEPS:-12}
TAG="s$SEQ-mb$MB"; WD=/tmp/bench-prof-$TAG; rm -rf "$WD"
RECIPES=${RECIPES:-rayft,torchtitan,rayft-fp8,torchtitan-fp8}
RAYFT_SETS=""; for kv in ${RAYFT_SET:-}; do RAYFT_SETS+=" --rayft-set $kv"; done
CMD="rayft bench train examples/qwen2.5-1.5b.yaml --workload random --recipes $RECIPES$RAYFT_SETS --steps $STEPS --warmup-steps $((FIRST - 1)) --ceiling-s 0 --out $OUT/train-bench-profile-$TAG.json --work-dir $WD --deadline-s ${DEADLINE_S:-440} --set model.name_or_path=${PRESET:-qwen3-1.7b} --set train.num_workers=1 --set data.seq_len=$SEQ --set train.micro_batch_size=$MB --set train.activation_checkpointing=false --set train.profile_steps=[$FIRST,$LAST] --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$WD"
echo "$CMD"
timeout -k 10 "${BENCH_TIMEOUT:-470}" python3 -m rayft.cli ${CMD#rayft } 2>&1 | tee "$OUT/bench-$TAG.log"
rc=${PIPESTATUS[0]}
# the traces: rayft's RUN/profile/rank0.trace.json.gz, torchtitan's profile_traces/iteration_<LAST>/rank0_trace.json
ARGS=()
for r in ${RECIPES//,/ }; do
  t=$(find "$WD" -path "*$r-random*" \( -name 'rank0.trace.json.gz' -o -name 'rank0_trace.json' \) 2>/dev/null | sort | head -1)
  [ -n "$t" ] || { echo "no trace for $r under $WD"; continue; }
  case "$t" in *.json) gzip -f "$t"; t="$t.gz";; esac
  ARGS+=("$r=$t")
done
python3 -m rayft.benchmarks.trace_kernels "${ARGS[@]}" --top 15 | tee "$OUT/kernels-$TAG.md"
(cd "$WD" && find . \( -name 'rank0.trace.json.gz' -o -name 'rank0_trace.json.gz' -o -name 'rank0.ops.txt' -o -name '*.log' -o -name settings.json \) -print | tar -cf "$OUT/traces-$TAG.tar" -T -)
ls -la "$OUT"
exit $rc

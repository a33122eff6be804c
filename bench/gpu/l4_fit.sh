#!/bin/bash
# Issue 9, part 3 (written for nvidia-h200-x8; NOT RUN yet: that kind has not been lent):
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/l4_fit.sh
# The sample's hardware emulated: every worker's PyTorch memory capped at an L4's usable 22.5 GiB
# (train.gpu_memory_limit_gib), rayft on random rows of the Qwen2.5-1.5B architecture. For each
# sequence length in SEQS, micro-batches in MBS are tried in order (ascending) until one runs out of
# memory; each try is one `rayft bench train --recipes rayft` results file under $OUT, its status
# "failed" with the out-of-memory error when it did not fit. env: SEQS ("1024 2048 4096"), MBS
# ("1 2 4 8"), LIMIT_GIB (22.5), NG (every GPU), STEPS (8), WARM (3), AC (activation
# checkpointing, false), DEADLINE_S (560 from the start: tries that cannot finish are not started).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}; LIMIT=${LIMIT_GIB:-22.5}; STEPS=${STEPS:-8}; WARM=${WARM:-3}
t0=$(date +%s); deadline=$((t0 + ${DEADLINE_S:-560}))
for SEQ in ${SEQS:-1024 2048 4096}; do
  for MB in ${MBS:-1 2 4 8}; do
    left=$((deadline - $(date +%s))); [ $left -lt 90 ] && { echo "seq $SEQ mb $MB: no time left"; continue; }
    f="$OUT/l4fit-seq$SEQ-mb$MB.json"
    timeout -k 10 $((left - 5)) python3 -m rayft.cli bench train examples/qwen2.5-1.5b.yaml --workload random --recipes rayft \
      --steps "$STEPS" --warmup-steps "$WARM" --out "$f" --work-dir "/tmp/l4fit-$SEQ-$MB" --deadline-s $((left - 15)) \
      --rayft-set "train.micro_batch_size=$MB" --set model.name_or_path=qwen2.5-1.5b --set "train.num_workers=$NG" \
      --set "data.seq_len=$SEQ" --set "train.gpu_memory_limit_gib=$LIMIT" --set "train.activation_checkpointing=${AC:-false}" \
      --set data.cache_dir=null > "$OUT/l4fit-seq$SEQ-mb$MB.log" 2>&1
    rc=$?; grep "tokens/s/GPU\|failed" "$OUT/l4fit-seq$SEQ-mb$MB.log" | tail -2
    [ $rc -ne 0 ] && break  # this micro-batch did not fit (or failed): larger ones will not either
  done
done
ls -la "$OUT"

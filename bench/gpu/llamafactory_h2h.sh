#!/bin/bash
# The head-to-head with LLaMA-Factory 0.9.5 (its SFT stage, full fine-tuning, launched on Ray by
# LLaMA-Factory) on one GPU, through `rayft bench train`, on the real workload (alpaca EN + ZH):
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/llamafactory_h2h.sh
# env: RECIPES (llamafactory,rayft: the new recipe first, so that a slow start of the other cannot
# leave it "skipped: no time left"; trl-best ran out of GPU memory here under TRL 0.24 at micro-batch 16
# (bench/NOTES.md §23): its figures come from bench_train.sh with TRL 1.x), MB (16: every recipe's micro-batch), PRESET (qwen2.5-1.5b),
# STEPS (15), WARM (5), AC (false), DEADLINE_S (520), RUN_TIMEOUTS, RAYFT_SET (extra --rayft-set KEY=VALUE).
#
# Stage first, on the development machine (LLaMA-Factory and what the host lacks of its imports;
# host: python 3.12, torch 2.11, torchaudio 2.11, transformers 5.17, accelerate 1.15, peft, pandas,
# pyarrow, xxhash; the bundle: Ray 2.60, liger-kernel 0.8.5, pydantic):
#   bash ../shared/gpu/stage.sh llamafactory==0.9.5 trl==0.24.0 omegaconf==2.3.0 datasets==4.8.5 dill==0.4.0 \
#     multiprocess==0.70.18 xxhash==3.6.0
#   python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .gpu/wheels   # no wheel on PyPI (sdist): pure Python
#   mkdir -p .gpu/data && cp ../shared/data/alpaca_*_demo.json .gpu/data/
# .gpu/wheels must hold no other trl (bench_train.sh stages trl 1.16.0): LLaMA-Factory 0.9.5 imports names
# TRL 1.x no longer has (AutoModelForCausalLMWithValueHead, PPOTrainer): a trl-best row asked for here runs
# on TRL 0.24 with sdpa (its padding-free collator passes no document boundaries for rayft's varlen
# attention; labelled "trl-best (sdpa)"), and at micro-batch 16 it ran out of GPU memory on one H200.
# torchtitan_h2h.sh's wheels are not needed here.
# What LLaMA-Factory's SFT path imports beyond the host's packages (read off a CPU run of the recipe):
# llamafactory, trl, datasets (+ dill, multiprocess, xxhash), omegaconf (+ antlr4-python3-runtime 4.9.x,
# the runtime its grammar was generated with); torchaudio (imported at the top of its mm_plugin) is on the host.
# LLaMA-Factory 0.9.5 caps transformers at 5.6 and datasets at 4.0 and checks at import: DISABLE_VERSION_CHECK=1.
# Writes under $OUT: train-bench-llamafactory.json (rewritten after every run), bench-llamafactory.log (the
# bench's whole output) and run-logs-llamafactory.tar.gz (each run's log, settings.json, llamafactory_args.json and steps, LLaMA-Factory's
# own trainer_log.jsonl, the table .md and .png).
# Time: the device call has 600 s; the bench gets --deadline-s 520 and `timeout -k 10 545` around it.
# LLaMA-Factory saves the final model (fp32 weights, ~6 GB) when training ends: in its run's wall time, not in a step.
set -uo pipefail
source .gpu/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
export DISABLE_VERSION_CHECK=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D="$PWD/.gpu/data"; ls "$D/alpaca_en_demo.json" "$D/alpaca_zh_demo.json" || exit 3
python3 -c "
import datasets, liger_kernel, omegaconf, trl
import llamafactory
from llamafactory.train.tuner import run_exp
assert trl.__version__ == '0.24.0', f'trl {trl.__version__}: LLaMA-Factory 0.9.5 needs trl 0.24.0'
print('llamafactory', llamafactory.__version__, 'trl', trl.__version__, 'datasets', datasets.__version__)" 2>&1 | tail -5
[ "${PIPESTATUS[0]}" = 0 ] || { echo "stage the wheels in the header"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
TAG=llamafactory; WD=/tmp/bench-$TAG; rm -rf "$WD"
RECIPES=${RECIPES:-llamafactory,rayft}
TIMEOUTS=${RUN_TIMEOUTS:-llamafactory=240,rayft=200,trl-best=150}
RAYFT_SETS=""; for kv in ${RAYFT_SET:-}; do RAYFT_SETS+=" --rayft-set $kv"; done
CMD="rayft bench train examples/qwen2.5-1.5b.yaml --workload real --recipes $RECIPES$RAYFT_SETS --steps ${STEPS:-15} --warmup-steps ${WARM:-5} --out $OUT/train-bench-$TAG.json --work-dir $WD --timeout-s $TIMEOUTS --deadline-s ${DEADLINE_S:-520} --set model.name_or_path=${PRESET:-qwen2.5-1.5b} --set train.num_workers=1 --set train.micro_batch_size=${MB:-16} --set train.activation_checkpointing=${AC:-false} --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$WD"
echo "$CMD"
timeout -k 10 "${BENCH_TIMEOUT:-545}" python3 -m rayft.cli ${CMD#rayft } 2>&1 | tee "$OUT/bench-$TAG.log"
rc=${PIPESTATUS[0]}
mv "$OUT/train-bench-$TAG.md" "$OUT/train-bench-$TAG.png" "$WD"/ 2>/dev/null
(cd "$WD" 2>/dev/null && { ls ./*.md ./*.png 2>/dev/null; find . -maxdepth 4 \( -name '*.log' -o -name settings.json -o -name llamafactory_args.json -o -name 'steps.rank*.jsonl' -o -name trainer_log.jsonl -o -name all_results.json \) -printf '%P\n'; } | tar -czf "$OUT/run-logs-$TAG.tar.gz" -T -) \
  || echo "no run logs under $WD"
rm -rf "$WD"/llamafactory-real/llamafactory/output/*.safetensors  # the saved final model: not needed
ls -la "$OUT"
exit $rc

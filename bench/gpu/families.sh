#!/bin/bash
# On the GPU host (device tool), from the repo root, .gpu carried:
#   bash bench/gpu/families.sh                         # the matrix (issue 22)
#   PRESETS="gemma-2-2b phi-3.5-mini" bash bench/gpu/families.sh   # a part of it (each call <= 10 min)
#   DEADLINE_S=570 ...                                # every run's timeout ends it by then (see below)
# .gpu/wheels must hold llama_models-0.3.0, mistral_common-1.13.1, pycountry and pydantic_extra_types
# (the offline Llama 3 / Mistral tokenizers; `pip download --no-deps` them on the CPU machine).
# Per preset (random init): `rayft train` on ../shared/data alpaca EN + ZH, 30 steps on every local
# GPU, liger kernels on, export check at the end; one results file per preset
# ($OUT/families-PRESET-NxGPU.json, rayft.benchmarks.record: tokens/s/GPU, MFU, peak memory, the
# loss curve, the export's logit gap and tie flag) and one file with a row per preset
# ($OUT/families-NxGPU.json). Gemma's and Phi's tokenizers ship in no package and the host reaches no
# hub: they run with rayft's stand-ins (build_standin_tokenizer: same vocabulary format, the
# family's turn tokens and template), which changes the token count per record, not the model.
# 7B/8B presets (fp32 master weights + AdamW: 16 bytes per parameter, 116 GB for Mistral 7B) run
# with activation checkpointing; a preset `rayft fit` says does not fit these GPUs is reported as skipped.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NG=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
D="$PWD/.gpu/data"; ls "$D" || exit 3
PRESETS=${PRESETS:-"qwen3-1.7b llama-3.2-1b gemma-2-2b phi-3.5-mini mistral-7b-v0.3"}
STEPS=${STEPS:-30}; LIGER=${LIGER:-true}  # WARMUP (5) must stay below STEPS
# DEADLINE_S: seconds from now by which every training run must have ended (each run's timeout is the
# smaller of TRAIN_TIMEOUT and what is left, less 15 s for its results file; `rayft fit` and the
# summary are outside it), so a device call's limit does not cut a run off mid-way
END=$(( $(date +%s) + ${DEADLINE_S:-100000} ))
python3 - <<'EOF' || exit 4
from rayft.data.tokenizer import build_standin_tokenizer
for t in ("gemma2", "phi3"):
    build_standin_tokenizer(t).save_pretrained(f"/tmp/tok/{t}")
print("stand-in tokenizers in /tmp/tok")
EOF
for p in $PRESETS; do
  extra=""; mb=${MB:-8}; ac=false
  case $p in
    gemma-*) extra="--set model.tokenizer=/tmp/tok/gemma2"; mb=${MB:-4} ;;  # full 256k-vocab logits (soft-capped: no fused loss)
    phi-*) extra="--set model.tokenizer=/tmp/tok/phi3"; mb=${MB:-4} ;;  # 3.8B: 61 GB of weights + AdamW before activations
  esac
  case $p in
    *-7b*|*-8b*) ac=true; mb=${MB:-4} ;;
  esac
  CMD="rayft train examples/qwen2.5-1.5b.yaml --set model.name_or_path=$p $extra --set train.num_workers=$NG --set train.micro_batch_size=$mb --set train.max_steps=$STEPS --set train.lr=3e-4 --set train.warmup_steps=${WARMUP:-5} --set train.activation_checkpointing=$ac --set train.liger_kernels=$LIGER --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set train.log_every=1 --set checkpoint.storage_path=/tmp/runs --set checkpoint.name=fam-$p --set checkpoint.every_steps=null --set checkpoint.save_final=false"
  echo "=== $p: $CMD"
  # rayft's own planner decides whether the preset fits these GPUs (rayft train would refuse it too)
  if ! python3 -m rayft.cli fit ${CMD#rayft train } --gpus "${NG}xH200" > "$OUT/fit-$p.txt" 2>&1; then
    echo "$p: skipped: $(tail -1 "$OUT/fit-$p.txt")"
    python3 -c 'import json,sys; print(json.dumps({"preset": sys.argv[1], "skipped": open(sys.argv[2]).read().strip().splitlines()[-1]}))' "$p" "$OUT/fit-$p.txt" > "$OUT/families-$p-skipped.json"
    continue
  fi
  tail -1 "$OUT/fit-$p.txt"
  left=$(( END - $(date +%s) - 15 )); t=${TRAIN_TIMEOUT:-420}; [ "$left" -lt "$t" ] && t=$left
  [ "$t" -lt 60 ] && { echo "$p: not started: ${t}s left before DEADLINE_S"; continue; }
  timeout -k 30 "$t" python3 -m rayft.cli ${CMD#rayft } > "$OUT/train-$p.log" 2>&1
  echo "exit $?"; grep -E "model:|attention|loss|error|Error" "$OUT/train-$p.log" | tail -8
  python3 -m rayft.benchmarks.record "/tmp/runs/fam-$p" "$OUT/families-$p-${NG}xgpu.json" --command "$CMD" || echo "$p: no summary (see $OUT/train-$p.log)"
done
python3 - "$OUT" "$NG" <<'EOF'
import glob, json, sys
from rayft.benchmarks.record import write_result
out, ng = sys.argv[1], sys.argv[2]
rows = {}
for f in sorted(glob.glob(f"{out}/families-*-{ng}xgpu.json")) + sorted(glob.glob(f"{out}/families-*-skipped.json")):
    d = json.load(open(f))
    if "skipped" in d:
        rows[d["preset"]] = {"skipped": d["skipped"]}
        continue
    fig, curve, ex = d["figures"], d["loss_curve"], d.get("export_check", {})
    rows[f.split("families-")[1].rsplit(f"-{ng}xgpu", 1)[0]] = {
        "steps": fig["steps"], "first_loss": fig["first_loss"], "final_loss": fig["final_loss"],
        "loss_fell": fig["final_loss"] < fig["first_loss"], "median_tokens_per_s_per_gpu": fig["median_tokens_per_s_per_gpu"],
        "median_mfu": fig["median_mfu"], "peak_mem_gib": fig["peak_mem_gib"],
        "export_max_abs_logit_diff": ex.get("export_max_abs_logit_diff"), "export_tied": ex.get("export_tied"), "file": f.rsplit("/", 1)[1],
    }
print(write_result(f"{out}/families-{ng}xgpu.json", "bash bench/gpu/families.sh", rows))
print(json.dumps(rows, indent=1))
EOF

#!/bin/bash
# Issue 23, §32: the next step's micro-batches made under the device's work (the loop's prefetch,
# and collate in numpy), against the tree before them, alternating in one device call; TRL at its
# best beside the new tree. From the repo root, after staging TRL as bench_train.sh's header says and
#   git archive <old-sha> src examples | gzip > .gpu/old-src.tar.gz
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/prefetch_ab.sh
# `rayft bench train` on alpaca EN+ZH (the real workload), qwen2.5-1.5b, micro-batch 16, 1 GPU, 15
# steps (median of 6-15), §29's flags. Invocations (ARMS below): old, new + trl-best (the card's
# sustained bf16 rate measured there), old again, new again. "old" runs the
# whole bench from the archived src (PYTHONPATH first: the driver, its Ray workers and the recipes'
# subprocesses inherit it). Per invocation it prints the steps' median `time_data_s` (the host's
# time before each step's compute, the GPU idle) from the run's rayft_metrics.jsonl.
# Then the GPU tests, if the call has 30 s left.
# Writes under $OUT: old-1.json, new-1.json, old-2.json, new-2.json and each invocation's log.
set -uo pipefail
source bench/gpu/host_prelude.sh
rm -rf /tmp/old-src && mkdir -p /tmp/old-src && tar -xzf .gpu/old-src.tar.gz -C /tmp/old-src || exit 4
nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv
START=$(date +%s); LIMIT=${LIMIT:-575}
bench() {  # NAME TREE(old|new) RECIPES DEADLINE CEILING_S MICRO_BATCH RAYFT_MICRO_BATCH FLAGS
  local wd=/tmp/bench-$1 mb=${6:-16} rmb=${7:-${6:-16}} flags=${8:-} rset=""; rm -rf "$wd"
  case ",$3," in *,rayft,*|*,rayft-fp8,*) rset="--rayft-set train.micro_batch_size=$rmb --rayft-set parallel.reshard_after_forward=false";; esac
  case "$flags" in *=*)  # KEY=VALUE: one more rayft setting, where a rayft recipe runs
    [ -n "$rset" ] || { echo "== $1: $flags is a rayft setting and no rayft recipe runs: skipped"; return; }
    rset="$rset --rayft-set $flags"; flags="";; esac
  local pp="$PYTHONPATH"; [ "$2" = old ] && pp="/tmp/old-src/src:$PYTHONPATH"
  local cmd="bench train examples/qwen2.5-1.5b.yaml --workload real --recipes $3 ${flags:+--$flags} $rset --steps 15 --warmup-steps 5 --out $OUT/$1.json --work-dir $wd --timeout-s rayft=200,trl-best=${TRL_TIMEOUT_S:-150} --deadline-s $4 --ceiling-s $5 --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=1 --set train.micro_batch_size=$mb --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set data.cache_dir=null --set checkpoint.storage_path=$wd"
  echo "== $1 ($2 tree): rayft $cmd"
  local commit="${RAYFT_GIT_COMMIT:-}"; [ "$2" = old ] && commit="${OLD_COMMIT:-old}"
  RAYFT_GIT_COMMIT="$commit" PYTHONPATH="$pp" timeout -k 10 "$(( ${4%.*} + 20 ))" python3 -m rayft.cli $cmd > "$OUT/$1.log" 2>&1
  echo "rc=$? after $(( $(date +%s) - START )) s"; grep -E "tokens/s|^\| (rayft|trl)" "$OUT/$1.log" | tail -6
  python3 - "$wd" "$1" <<'PY'
import json, pathlib, statistics, sys
for f in sorted(pathlib.Path(sys.argv[1]).rglob("rayft_metrics.jsonl")):
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    rows = [r for r in rows if "step_time_s" in r]
    late = [r for r in rows if r["step"] >= 6]
    med = lambda k: statistics.median(r[k] for r in late) if late else None
    print(sys.argv[2], "steps 6+: median step_time_s", med("step_time_s"), "time_data_s", med("time_data_s"),
          "time_fwd_bwd_s", med("time_fwd_bwd_s"), "time_optim_s", med("time_optim_s"))
    for r in rows[:3]:
        print(sys.argv[2], {k: r.get(k) for k in ("step", "loss", "grad_norm", "weights", "peak_mem_gib", "time_data_s")})
PY
  rm -f "$OUT/$1.png" "$OUT/$1.md"
}
# ARMS: NAME:TREE:RECIPES:CEILING_S[:MICRO_BATCH[:RAYFT_MICRO_BATCH[:FLAG]]] ... (default: old, new +
# trl-best, old again, new again; micro-batch 16; RAYFT_MICRO_BATCH: the rayft recipes' own, default
# MICRO_BATCH; FLAG: one more `rayft bench train` flag without its dashes, e.g. trl-compile, or a
# KEY=VALUE for the rayft recipes, e.g. train.one_pass_adamw=true; an old-tree arm knows neither of
# those two); each arm after the first runs while the call has 120 s left.
ARMS=${ARMS:-"old-1:old:rayft:0 new-1:new:rayft,trl-best:15 old-2:old:rayft:0 new-2:new:rayft:0"}
first=1
for arm in $ARMS; do
  IFS=: read -r name tree recipes ceiling mb rmb flag <<< "$arm"
  left=$(( LIMIT - 15 - ($(date +%s) - START) ))
  if [ "$first" = 1 ]; then first=0; bench "$name" "$tree" "$recipes" $(( left < 300 ? left - 25 : 300 )) "$ceiling" "$mb" "$rmb" "$flag"
  elif [ "$left" -gt 120 ]; then bench "$name" "$tree" "$recipes" $(( left - 25 )) "$ceiling" "$mb" "$rmb" "$flag"
  else echo "no time for $name ($left s left)"; fi
done
left=$(( LIMIT + 15 - ($(date +%s) - START) ))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -5 | tee "$OUT/gpu-tests.log"
ls -la "$OUT"

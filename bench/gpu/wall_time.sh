#!/bin/bash
# Issue 23's wall-time target, on the GPU host (device tool), from the repo root, .gpu carried:
#   RAYFT_GIT_COMMIT=<sha> DEADLINE_S=560 bash bench/gpu/wall_time.sh
# DEADLINE_S: seconds from now that everything must fit in; give the device call's limit less ~30 s.
# The same `rayft train` twice on a fresh machine: the qwen2.5-1.5b preset (random init), 200 steps
# of ../shared/data alpaca EN + ZH on every local GPU, micro-batch 16, compiled layers, the example's
# periodic checkpoints (every 50 steps, async) and the end-of-run export with its check. The first run
# is cold (no compile cache, no tokenized store, nothing in the page cache); the second reuses what the
# first left (warm). One results file per run ($OUT/wall-time-{cold,warm}-NxGPU.json: wall_s per phase,
# overhead = total - steps) and the pair ($OUT/wall-time-NxGPU.json). Ray Train's own log of the worker
# group's start (its controller's, with each phase's seconds) is kept per run ($OUT/ray-train-*-RUN.log).
# RUNS="cold" runs the cold one only. Then, if STAGING_S (default 200; 0: never) seconds are left, bench/gpu/staging_alloc.py.
# PRECOMPILE (default 1): write the bundle's bytecode first (not part of any run's wall time): the
# bundle unpacks into /tmp/site as sources only, where an image's pip install leaves bytecode beside
# them (the host's own packages still import without: it sets PYTHONDONTWRITEBYTECODE, NOTES §22).
# PRECOMPILE=image: every module's bytecode, as a pip-installed image has it (pip compiles what it
# installs): the standard library, the host's site-packages, the bundle and src, compiled into
# PYTHONPYCACHEPREFIX=/tmp/pycache (exported for the runs; the host's packages are read-only to it).
# Each run's process wall time (the CLI's start and exit included, which the summary's wall_s
# leaves out) is measured here: process_s in the pair's file, and overhead_process_s = process_s - steps;
# with the summary's timeline_unix, cli_start_s (the process's start to the timeline's) and exit_s (its end to the process's).
# EXTRA: more `--set key=value` options for both runs (e.g. EXTRA="--set checkpoint.final_model_only=true").
# DISK_PROBE (default 1): after the runs, /tmp's write rate for 4 GiB, through the page cache to an
# fdatasync and with O_DIRECT ($OUT/disk-probe.txt): the floor under the end's checkpoint and export writes.
# IMPORT_TIMES=1 (default 0: ~100 s of the call on that host): before and after, the seconds a fresh
# process takes to import the workers' module, and (after) its -X importtime profile ($OUT/importtime.txt).
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "python env: $(env | grep -E '^PYTHON' | tr '\n' ' ')"
echo "bytecode files in /tmp/site: $(find /tmp/site -name '*.pyc' | wc -l)"
TIMEFORMAT='%R s'
IMPORT_TIMES=${IMPORT_TIMES:-0}
import_times() {  # $1: label
  [ "$IMPORT_TIMES" = 1 ] || return 0
  for i in 1 2; do echo -n "import rayft.train.loop, $1 ($i): "; { time python3 -c "import rayft.train.loop" >/dev/null 2>&1; } 2>&1; done
}
import_times "as unpacked"
if [ "${PRECOMPILE:-1}" = image ]; then
  export PYTHONPYCACHEPREFIX=/tmp/pycache
  dirs=$(python3 -c "import site, sysconfig; p = sysconfig.get_paths(); print(' '.join(sorted({p['stdlib'], p['platstdlib'], p['purelib'], p['platlib'], *site.getsitepackages()})))")
  echo -n "compileall into $PYTHONPYCACHEPREFIX ($dirs /tmp/site src): "
  { time python3 -m compileall -q -j 0 $dirs /tmp/site src >/dev/null 2>&1; } 2>&1
  echo "bytecode files in $PYTHONPYCACHEPREFIX: $(find $PYTHONPYCACHEPREFIX -name '*.pyc' | wc -l)"
  import_times "every module compiled"
elif [ "${PRECOMPILE:-1}" = 1 ]; then
  echo -n "compileall /tmp/site src: "; { time python3 -m compileall -q -j 0 /tmp/site src >/dev/null 2>&1; } 2>&1
  echo "bytecode files in /tmp/site: $(find /tmp/site -name '*.pyc' | wc -l)"
  import_times "compiled"
  if [ "$IMPORT_TIMES" = 1 ]; then
    python3 -X importtime -c "import rayft.train.loop" 2> "$OUT/importtime.txt" >/dev/null
    sort -t'|' -k2 -n -r "$OUT/importtime.txt" | head -25
  fi
fi
NG=$(nvidia-smi -L | wc -l)
D="$PWD/.gpu/data"; ls "$D" || exit 3
STEPS=${STEPS:-200}
END=$(( $(date +%s) + ${DEADLINE_S:?give the seconds this script may take} ))
STAGING_S=${STAGING_S:-200}
n=0
RUNS=${RUNS:-cold warm}
NRUNS=$(echo $RUNS | wc -w)
for run in $RUNS; do
  CMD="rayft train examples/qwen2.5-1.5b.yaml --set model.name_or_path=qwen2.5-1.5b --set train.num_workers=$NG --set train.micro_batch_size=16 --set train.max_steps=$STEPS --set train.epochs=20 --set train.activation_checkpointing=false --set data.train_files=[$D/alpaca_en_demo.json,$D/alpaca_zh_demo.json] --set train.log_every=10 --set checkpoint.storage_path=/tmp/runs --set checkpoint.name=wall-$run${EXTRA:+ $EXTRA}"
  echo "=== $run: $CMD"
  left=$(( END - STAGING_S - $(date +%s) )); t=$(( left / (NRUNS - n) - 10 )); n=$((n + 1))
  [ "$t" -lt 60 ] && { echo "$run: not started: ${t}s left"; continue; }
  t0=$(date +%s.%N)
  timeout -k 30 "$t" python3 -m rayft.cli ${CMD#rayft } > "$OUT/train-$run.log" 2>&1
  rc=$?; python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2), *sys.argv[1:])" "$t0" "$(date +%s.%N)" > "$OUT/process-s-$run.txt"
  echo "exit $rc; process wall, start, end (unix s): $(cat "$OUT/process-s-$run.txt")"; grep -E "wall time|HF export" -A3 "$OUT/train-$run.log" | head -12
  for f in /tmp/ray/session_latest/logs/train/ray-train-sys-controller-*.log; do
    [ -f "$f" ] && python3 -c "import json,sys; [print(d['asctime'], d['message'].splitlines()[0][:200]) for d in map(json.loads, open(sys.argv[1]))]" "$f" > "$OUT/ray-train-controller-$run.log"
  done
  du -sh ~/.cache/rayft/compile 2>/dev/null
  python3 -m rayft.benchmarks.record "/tmp/runs/wall-$run" "$OUT/wall-time-$run-${NG}xgpu.json" --command "$CMD" || echo "$run: no summary"
  cp /tmp/runs/wall-$run/rayft_summary.json "$OUT/summary-$run.json" 2>/dev/null
  rm -rf /tmp/runs/wall-$run  # its checkpoints (2 x 18.5 GB) and export: the host's 64 GiB disk cannot hold two runs'
done
python3 - "$OUT" "$NG" <<'EOF2'
import json, sys
from rayft.benchmarks.record import write_result
out, ng = sys.argv[1], sys.argv[2]
rows = {}
for run in ("cold", "warm"):
    try:
        s = json.load(open(f"{out}/summary-{run}.json"))
    except FileNotFoundError:
        continue
    w = s["wall_s"]
    process, *ends = map(float, open(f"{out}/process-s-{run}.txt").read().split())
    clock = s.get("timeline_unix") or {}
    rows[run] = {"wall_s": w, "overhead_s": w["total"] - w["steps"], "steps": s.get("steps"),
                 "process_s": process, "overhead_process_s": process - w["steps"],
                 # the process around the timeline: the CLI's start (Python, its imports) and its exit (Ray's shutdown)
                 "cli_start_s": clock["start"] - ends[0] if ends and clock else None,
                 "exit_s": ends[1] - clock["end"] if ends and clock else None,
                 "export_timings_s": (s.get("export") or {}).get("export_timings_s"),
                 "checkpoints": s.get("checkpoints", [])}
print(write_result(f"{out}/wall-time-{ng}xgpu.json", "bash bench/gpu/wall_time.sh", rows))
print(json.dumps({k: {"overhead_s": v["overhead_s"], "overhead_process_s": v["overhead_process_s"], "wall_s": v["wall_s"]} for k, v in rows.items()}, indent=1))
EOF2
if [ "${DISK_PROBE:-1}" = 1 ]; then
  for flag in conv=fdatasync oflag=direct conv=fdatasync oflag=direct; do echo -n "$flag: "; dd if=/dev/zero of=/tmp/disk-probe bs=64M count=64 $flag 2>&1 | tail -1; rm -f /tmp/disk-probe; done | tee "$OUT/disk-probe.txt"
fi
left=$(( END - $(date +%s) ))
if [ "$STAGING_S" -gt 0 ] && [ "$left" -ge "$STAGING_S" ]; then
  timeout -k 10 $(( left - 5 )) python3 bench/gpu/staging_alloc.py --preset qwen2.5-1.5b --out "$OUT/staging-alloc-${NG}xgpu.json"
else
  echo "staging_alloc: not started: ${left}s left"
fi

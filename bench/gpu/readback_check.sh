#!/bin/bash
# The export's read back on the GPU host (device tool, .gpu carried), from the repo root:
#   RAYFT_GIT_COMMIT=<sha> bash bench/gpu/readback_check.sh
# bench/gpu/readback_ab.py (before/after, alternating, one process), the GPU tests, then what
# wall_time.sh's PRECOMPILE=image costs and gives: compileall of every module into a
# PYTHONPYCACHEPREFIX, and the seconds a fresh process takes to import the workers' module with
# the bundle compiled only (PRECOMPILE=1) and with every module compiled.
set -uo pipefail
source .gpu/setup.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TIMEFORMAT='%R s'
python3 bench/gpu/readback_ab.py --out "$OUT/readback-ab-1xgpu.json" 2>&1 | grep -v Warning | tail -12
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/gpu-tests.log" 2>&1; echo "gpu tests rc=$?"; tail -3 "$OUT/gpu-tests.log"
{
  echo -n "compileall /tmp/site src: "; { time python3 -m compileall -q -j 0 /tmp/site src >/dev/null 2>&1; } 2>&1
  for i in 1 2; do echo -n "import rayft.train.loop, bundle compiled ($i): "; { time python3 -c "import rayft.train.loop" >/dev/null 2>&1; } 2>&1; done
  export PYTHONPYCACHEPREFIX=/tmp/pycache
  dirs=$(python3 -c "import site, sysconfig; p = sysconfig.get_paths(); print(' '.join(sorted({p['stdlib'], p['platstdlib'], p['purelib'], p['platlib'], *site.getsitepackages()})))")
  echo -n "compileall into $PYTHONPYCACHEPREFIX ($dirs /tmp/site src): "; { time python3 -m compileall -q -j 0 $dirs /tmp/site src >/dev/null 2>&1; } 2>&1
  echo "bytecode files: $(find $PYTHONPYCACHEPREFIX -name '*.pyc' | wc -l)"
  for i in 1 2; do echo -n "import rayft.train.loop, every module compiled ($i): "; { time python3 -c "import rayft.train.loop" >/dev/null 2>&1; } 2>&1; done
} 2>&1 | tee "$OUT/bytecode.txt"

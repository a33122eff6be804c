"""How late the driver's progress loop (``rayft.train.progress.show_progress``) sees Ray Train's ``fit``
return: this tree against ``--base``'s ``src`` (issue 23; bench/NOTES.md §42):
  python bench/progress_end_lag.py --base COMMIT --reps 20 --out bench/results/DATE-progress-end-lag-2cpu.json
Each sample, in a fresh process of each arm: a thread standing for ``fit`` ends after a random 0.3-0.8 s
(the same draws for both arms); the loop runs with an empty event channel and a plain console; the lag
is the loop's return minus the thread's end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rayft.benchmarks.record import commit_src, write_result

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = """
import io, json, random, sys, threading, time
from rich.console import Console
from rayft.train.progress import show_progress
class Empty:
    def drain(self):
        return []
rng = random.Random(int(sys.argv[1]))
lags = []
for _ in range(int(sys.argv[2])):
    ended = []
    wait = rng.uniform(0.3, 0.8)
    th = threading.Thread(target=lambda: (time.sleep(wait), ended.append(time.perf_counter())))
    th.start()
    show_progress(th, Empty(), 10, Console(file=io.StringIO()))
    lags.append(time.perf_counter() - ended[0])
print(json.dumps(lags))
"""


def sample(src: Path, seed: int, n: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", SAMPLE, str(seed), str(n)], capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"old": commit_src(ROOT, a.base, Path(tmp)), "new": ROOT / "src"}
        lags = {arm: [round(x, 4) for x in sample(srcs[arm], 0, a.reps)] for arm in ("old", "new")}
    figures = {
        "base": a.base,
        "lag_s": lags,
        "median_s": {arm: round(statistics.median(v), 4) for arm, v in lags.items()},
        "mean_s": {arm: round(statistics.mean(v), 4) for arm, v in lags.items()},
        "max_s": {arm: round(max(v), 4) for arm, v in lags.items()},
    }
    print(json.dumps({k: figures[k] for k in ("median_s", "mean_s", "max_s")}))
    command = f"python bench/progress_end_lag.py --base {a.base} --reps {a.reps} --out OUT.json"
    print(write_result(a.out, command, figures))


if __name__ == "__main__":
    main()

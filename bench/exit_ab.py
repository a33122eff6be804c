"""The `rayft train` command's exit after a finished run, this tree against ``--base``'s ``src``
(issue 23's wall time; bench/NOTES.md §48):
  python bench/exit_ab.py --base COMMIT --reps 3 --out bench/results/DATE-exit-ab-2cpu.json
Each run is a real quickstart-sized `rayft train` (2 steps) on an embedded Ray in a fresh process,
driven by the integration test's script (``RUN`` of tests/integration/test_workers_beside_data.py,
mode ``cli-train``: the command itself, its store hit on the second run of an arm). Figures per
run: ``exit_s``, from the end of the run's timeline (the summary's ``timeline_unix.end``) to the
process's end as this script sees it; the exit status; whether Ray was still up in the exit's
last handler (``ray_up_at_exit``: False where Ray's shutdown ran at exit). Arms alternate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rayft.benchmarks.record import commit_src, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_workers_beside_data import RUN, last_json  # noqa: E402 -- the scenario is the test's own script


def one(src: Path, tmp: Path, name: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONDONTWRITEBYTECODE")} | {"PYTHONPATH": str(src)}
    args = [sys.executable, "-c", RUN, "cli-train", str(tmp / "runs"), "0", f"data.cache_dir={tmp / 'store'}", f"checkpoint.name={name}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    ended = time.time()
    got = last_json(p.stdout)
    return {"exit_s": round(ended - got["end_unix"], 3), "exit_status": p.returncode, "ray_up_at_exit": got["ray_up_at_exit"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"old": commit_src(ROOT, a.base, Path(tmp)), "new": ROOT / "src"}
        for rep in range(a.reps):
            for arm in ("old", "new"):
                run_tmp = Path(tmp) / arm
                run_tmp.mkdir(exist_ok=True)
                rows[arm].append(one(srcs[arm], run_tmp, f"r{rep}"))
                print(arm, json.dumps(rows[arm][-1]), flush=True)
    medians = {arm: statistics.median(r["exit_s"] for r in runs) for arm, runs in rows.items()}
    command = " ".join(["python", "bench/exit_ab.py", *sys.argv[1:]])
    print(write_result(a.out, command, {"base": a.base, "reps": a.reps, "runs": rows, "median_exit_s": medians}))


if __name__ == "__main__":
    main()

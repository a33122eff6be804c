"""A run's fixed costs, this tree against an older commit's, on the quickstart (issue 23; bench/NOTES.md
§35, §42, §45):
  python bench/ray_start_ab.py --base COMMIT --reps 4 --out bench/results/DATE-NAME-2cpu.json [--set KEY=VALUE ...]
Runs `rayft train examples/quickstart.yaml` (its own embedded Ray, 10 steps) as a fresh process,
alternating this tree ("new") with ``--base``'s ``src`` (exported with ``git archive``, put first on
PYTHONPATH: "old"), after one unrecorded run of each (bytecode, the token store). Each row: the
process's wall time, the run summary's phases (``wall_s``), the seconds from the process's start to
the moment the driver called Ray Train's ``fit`` (``to_fit_s``) and to the moment rank 0 began its
set-up with its arguments (``to_setup_s``: every phase before ``worker_setup``, whichever timeline
the commit has). ``--set``: more overrides for every run; ``data.cache_dir=fresh`` gives each run
a token store of its own (the data tokenized every time: a cold data phase).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rayft.benchmarks.record import commit_src, write_result

ROOT = Path(__file__).resolve().parents[1]
SETS = ["train.max_steps=10", "checkpoint.every_steps=null"]


#: the phases from the worker's set-up on (the rest come before it, in either timeline)
FROM_SETUP = {"worker_setup", "first_step", "checkpoint_buffers", "steps", "end", "total"}


def one_run(arm: str, old_src: Path, runs: Path, tag: str, extra: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if arm == "old":
        env["PYTHONPATH"] = str(old_src)
    extra = [f"data.cache_dir={runs / 'stores' / tag}" if x == "data.cache_dir=fresh" else x for x in extra]
    sets = [*SETS, *extra, f"checkpoint.storage_path={runs}", f"checkpoint.name={tag}"]
    cmd = [sys.executable, "-m", "rayft.cli", "train", str(ROOT / "examples/quickstart.yaml"), *(a for s in sets for a in ("--set", s))]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{arm} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((runs / tag / "rayft_summary.json").read_text())
    wall, clock = summary["wall_s"], summary["timeline_unix"]
    return {
        "arm": arm,
        "process_s": round(end - t0, 2),
        "to_fit_s": round(clock["start"] + wall.get("data", 0.0) + wall["ray"] + wall["checks"] - t0, 2),
        "to_setup_s": round(clock["start"] + sum(v for k, v in wall.items() if k not in FROM_SETUP) - t0, 2),
        "overhead_process_s": round(end - t0 - wall["steps"], 2),
        "wall_s": {k: round(v, 2) for k, v in wall.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--set", action="append", default=[], dest="sets", help="KEY=VALUE for every run (data.cache_dir=fresh: see above)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_src = commit_src(ROOT, a.base, Path(tmp))
        runs = Path(tmp, "runs")
        for arm in ("old", "new"):
            one_run(arm, old_src, runs, f"warmup-{arm}", a.sets)
        rows = []
        for rep in range(a.reps):
            for arm in ("new", "old") if rep % 2 == 0 else ("old", "new"):
                rows.append({"rep": rep, **one_run(arm, old_src, runs, f"{arm}-{rep}", a.sets)})
                print(json.dumps(rows[-1]), flush=True)

    def mean(arm: str, key: str, phase: str | None = None) -> float:
        v = [r["wall_s"].get(phase, 0.0) if phase else r[key] for r in rows if r["arm"] == arm]
        return round(sum(v) / len(v), 2)

    keys = ("process_s", "to_fit_s", "to_setup_s", "overhead_process_s")
    phases = ("data", "ray", "checks", "workers_start", "data_wait", "worker_setup", "first_step", "end")
    figures = {
        "base": a.base,
        "rows": rows,
        "mean": {arm: {**{k: mean(arm, k) for k in keys}, **{p: mean(arm, "", p) for p in phases}} for arm in ("new", "old")},
    }
    print(json.dumps(figures["mean"]))
    print(
        write_result(
            a.out,
            f"python bench/ray_start_ab.py --base {a.base} --reps {a.reps} --out OUT.json" + "".join(f" --set {x}" for x in a.sets),
            figures,
        )
    )


if __name__ == "__main__":
    main()

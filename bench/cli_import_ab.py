"""The `rayft` command's own start: this tree against ``--base``'s ``src`` (issue 23; bench/NOTES.md §40):
  python bench/cli_import_ab.py --base COMMIT --reps 20 --out bench/results/DATE-cli-import-2cpu.json
Each sample is a fresh process: ``python -c 'import rayft.cli'`` timed inside (the import alone)
and ``python -m rayft.cli --version`` timed from outside (the interpreter's start, the import, the
exit: what every `rayft` command pays before its work). Alternating arms, after two unrecorded runs
of each (bytecode); the old arm's ``src`` comes from ``git archive`` and is put first on PYTHONPATH.
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
IMPORT = "import time; t = time.perf_counter(); import rayft.cli; print(time.perf_counter() - t)"


def sample(src: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(src)}
    inside = float(subprocess.run([sys.executable, "-c", IMPORT], capture_output=True, text=True, check=True, env=env).stdout)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rayft.cli", "--version"], capture_output=True, check=True, env=env)
    return {"import_s": round(inside, 4), "version_command_s": round(time.perf_counter() - t, 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"old": commit_src(ROOT, a.base, Path(tmp)), "new": ROOT / "src"}
        for arm in ("old", "new", "old", "new"):
            sample(srcs[arm])
        rows = []
        for rep in range(a.reps):
            for arm in ("new", "old") if rep % 2 == 0 else ("old", "new"):
                rows.append({"rep": rep, "arm": arm, **sample(srcs[arm])})
    median = {
        arm: {k: round(statistics.median(r[k] for r in rows if r["arm"] == arm), 4) for k in ("import_s", "version_command_s")}
        for arm in ("new", "old")
    }
    print(json.dumps(median))
    command = f"python bench/cli_import_ab.py --base {a.base} --reps {a.reps} --out OUT.json"
    print(write_result(a.out, command, {"base": a.base, "rows": rows, "median": median}))


if __name__ == "__main__":
    main()

"""A run that ends before training, this tree against ``--base``'s ``src`` (issue 23's §45 follow-up;
bench/NOTES.md §46):
  python bench/early_end.py --base COMMIT --reps 2 --out bench/results/DATE-early-end-2cpu.json
Two scenarios, each a real quickstart-sized ``rayft train`` on an embedded Ray in a fresh process,
driven by the integration test's script (``RUN`` of tests/integration/test_workers_beside_data.py):

* ``stop``: ``rayft stop`` as soon as the workers start beside the tokenization. Figures: the
  process's exit status (0: the script's own; Ray's shutdown under ``fit``'s thread made it 1),
  seconds from the request to the data phase's end and to ``run_training``'s return, and whether
  ``fit``'s thread was still alive at that return.
* ``worker-fail``: the workers' process group cannot start (``GLOO_SOCKET_IFNAME=bogus0``) while the
  tokenization runs 30 s longer, reporting its progress. Figures: seconds from the data phase's
  hook to its end, and the error's first words.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rayft.benchmarks.record import commit_src, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_workers_beside_data import RUN, last_json  # noqa: E402 -- the scenario is the test's own script


def one(src: Path, mode: str, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONDONTWRITEBYTECODE")} | {"PYTHONPATH": str(src)}
    if mode == "worker-fail":
        env["GLOO_SOCKET_IFNAME"] = "bogus0"
    args = [sys.executable, "-c", RUN, mode, str(tmp / "runs"), "0", f"data.cache_dir={tmp / 'store'}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    got = last_json(p.stdout)
    row = {"exit_status": p.returncode, "fit_alive_at_return": bool(got.get("fit_alive"))}
    if mode == "stop":
        row |= {
            "data_end_after_request_s": round(got["data_end_unix"] - got["requested_unix"], 2),
            "return_after_request_s": round(got["stopped_unix"] - got["requested_unix"], 2),
            "stopped": got.get("stopped"),
        }
    else:
        row |= {"data_phase_after_hook_s": round(got["data_end_unix"] - got["ingest_start_unix"], 2), "error": got["error"][:90]}
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    rows: dict[str, dict[str, list[dict]]] = {"stop": {"old": [], "new": []}, "worker-fail": {"old": [], "new": []}}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"old": commit_src(ROOT, a.base, Path(tmp)), "new": ROOT / "src"}
        for rep in range(a.reps):
            for mode in rows:
                for arm in ("old", "new"):  # alternating, each in a fresh process and a fresh store
                    run_tmp = Path(tmp) / f"{mode}-{arm}-{rep}"
                    run_tmp.mkdir()
                    rows[mode][arm].append(one(srcs[arm], mode, run_tmp))
                    print(mode, arm, json.dumps(rows[mode][arm][-1]), flush=True)
    command = " ".join(["python", "bench/early_end.py", *sys.argv[1:]])
    print(write_result(a.out, command, {"base": a.base, "reps": a.reps, "runs": rows}))


if __name__ == "__main__":
    main()

"""The `rayft train` process's own start and exit on a CPU machine (issue 23; bench/NOTES.md §30):
  python bench/driver_start_exit.py --reps 3 --out bench/results/DATE-driver-start-exit-2cpu.json
(1) Imports: a fresh process importing what the driver imports before its first phase, as it is now
(the CLI, the driver, Ray Train's TorchTrainer, rayft.train.worker_entry and step_plan), against
the same plus rayft.train.loop (what the driver imported when TorchTrainer got the loop's own
function). (2) Exit: a fresh process that imports torch, transformers' causal-LM classes, DCP and
Ray, starts and shuts down a local Ray, then ends, with and without gc.freeze() (what rayft.cli.run
does): the seconds from its last statement to the process's end. Alternating, fresh processes each.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from rayft.benchmarks.record import write_result

IMPORTS_NOW = (
    "import rayft.cli; from rayft.train.driver import run_training; from ray.train.torch import TorchTrainer; "
    "from rayft.train.worker_entry import train_func; from rayft.train.step_plan import make_plan"
)
IMPORTS_BEFORE = IMPORTS_NOW + "; import rayft.train.loop"

EXIT = """
import gc, sys, time
import torch, ray
from transformers import AutoModelForCausalLM
import torch.distributed.checkpoint
ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
ray.shutdown()
if sys.argv[1] == "freeze":
    gc.freeze()
print(time.time(), flush=True)
"""


def timed(code: str, *args: str) -> tuple[float, str]:
    t = time.time()
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return time.time() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for rep in range(a.reps):
        for arm in ("now", "before") if rep % 2 == 0 else ("before", "now"):
            s, _ = timed(IMPORTS_NOW if arm == "now" else IMPORTS_BEFORE)
            rows.append({"what": "driver imports", "rep": rep, "arm": arm, "s": round(s, 2)})
            print(rows[-1], flush=True)
        for arm in ("freeze", "plain") if rep % 2 == 0 else ("plain", "freeze"):
            t0 = time.time()
            proc = subprocess.run([sys.executable, "-c", EXIT, arm], capture_output=True, text=True, check=True)
            end = time.time()
            last = float(proc.stdout.strip().splitlines()[-1])
            rows.append({"what": "exit", "rep": rep, "arm": arm, "s": round(end - last, 2), "process_s": round(end - t0, 2)})
            print(rows[-1], flush=True)

    def mean(what: str, arm: str) -> float:
        v = [r["s"] for r in rows if r["what"] == what and r["arm"] == arm]
        return round(sum(v) / len(v), 2)

    figures = {
        "rows": rows,
        "driver_imports_s": {"now": mean("driver imports", "now"), "before": mean("driver imports", "before")},
        "exit_s": {"freeze": mean("exit", "freeze"), "plain": mean("exit", "plain")},
    }
    print(figures["driver_imports_s"], figures["exit_s"])
    print(write_result(a.out, f"python bench/driver_start_exit.py --reps {a.reps} --out OUT.json", figures))


if __name__ == "__main__":
    main()

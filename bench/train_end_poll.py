"""How long Ray Train takes to notice that the workers' train function returned (issue 23; bench/NOTES.md §31):
  python bench/train_end_poll.py --reps 4 --out bench/results/DATE-train-end-poll-2cpu.json
Ray Train's controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default 2 s),
so a run's end might wait up to that long for the next poll: is 0.5 s worth setting? Here: one
embedded local Ray, then TorchTrainer runs of one CPU worker whose train function records the wall
clock as it returns; the figure is the seconds from that return to `fit()` returning in the driver
(the poll's wait, then the worker group's shutdown). Alternating the interval between runs (the
controller reads it from the driver's environment at each fit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from rayft.benchmarks.record import write_result

INTERVAL_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def train_func(config: dict) -> None:
    """Return at once, after writing this moment's wall clock (unix s) to ``config["mark"]``."""
    Path(config["mark"]).write_text(repr(time.time()))


def one_run(interval: str, workdir: str, rep: int) -> float:
    """Seconds from the train function's return to ``fit()``'s with the poll interval ``interval`` (s)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    os.environ[INTERVAL_VAR] = interval
    mark = os.path.join(workdir, f"mark-{interval}-{rep}")
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"mark": mark},
        scaling_config=ray.train.ScalingConfig(num_workers=1, use_gpu=False),
        run_config=ray.train.RunConfig(name=f"poll-{interval}-{rep}", storage_path=workdir),
    )
    trainer.fit()
    return time.time() - float(Path(mark).read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--intervals", nargs=2, default=["2.0", "0.5"], help="The two intervals (s) to alternate.")
    a = ap.parse_args()
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for rep in range(a.reps):
            for interval in a.intervals if rep % 2 == 0 else a.intervals[::-1]:
                rows.append({"interval_s": float(interval), "rep": rep, "end_s": round(one_run(interval, workdir, rep), 3)})
                print(json.dumps(rows[-1]), flush=True)
    ray.shutdown()
    figures = {
        "runs": rows,
        "median_end_s": {i: statistics.median(r["end_s"] for r in rows if r["interval_s"] == float(i)) for i in a.intervals},
    }
    print(json.dumps(figures["median_end_s"]))
    print(write_result(a.out, f"python bench/train_end_poll.py --reps {a.reps} --out {a.out}", figures))


if __name__ == "__main__":
    main()

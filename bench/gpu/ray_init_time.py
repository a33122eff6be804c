"""How long the embedded Ray's start takes on this host, alone and beside the driver's imports
(issue 23; bench/NOTES.md §37-§38). Each arm in a fresh process, alternating, REPS times:
  python3 bench/gpu/ray_init_time.py --reps 2 --out OUT.json
alone: ``import ray`` and the RAY_INIT_IMPORTS, then :func:`connect_ray` on the main thread (what a
start after the data costs); beside: :class:`EmbeddedRayStart` begun, then the driver's imports
(transformers, torch, Ray Train's TorchTrainer) on the main thread, then the wait: the start's
length (its thread's), the imports' and what was left to wait after them."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ARM = r"""
import json, sys, time, threading
t0 = time.time()
import ray
from rayft.config import RayftConfig
from rayft.train.ray_start import RAY_INIT_IMPORTS, EmbeddedRayStart, preimport
assert all([preimport(m) for m in RAY_INIT_IMPORTS])  # as EmbeddedRayStart.begin does (a missing optional package passes)
cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}})
t1 = time.time()
if sys.argv[1] == "alone":
    from rayft.train.ray_cluster import connect_ray
    connect_ray(cfg)
    t2 = time.time()
    print(json.dumps({"arm": "alone", "imports_before_s": t1 - t0, "start_s": t2 - t1}))
else:
    start = EmbeddedRayStart.begin(cfg)
    ended = {}
    threading.Thread(target=lambda: (start.done.wait(), ended.setdefault("t", time.time())), daemon=True).start()
    import transformers, torch
    from ray.train.torch import TorchTrainer
    t2 = time.time()
    start.wait()
    t3 = time.time()
    time.sleep(0.05)
    print(json.dumps({"arm": "beside", "imports_before_s": t1 - t0, "start_s": ended["t"] - t1,
                      "driver_imports_s": t2 - t1, "left_to_wait_s": t3 - t2}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for _ in range(a.reps):
        for arm in ("alone", "beside"):
            t = time.time()
            p = subprocess.run([sys.executable, "-c", ARM, arm], capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                print(p.stderr[-2000:], file=sys.stderr)
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1]) | {"process_s": round(time.time() - t, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    from rayft.benchmarks.record import write_result

    print(write_result(a.out, " ".join(["python3", *sys.argv]), {"runs": rows}))


if __name__ == "__main__":
    main()

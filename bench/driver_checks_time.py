"""The driver's checks of a GPU run before its workers start (issue 23; bench/NOTES.md §41):
  python bench/driver_checks_time.py --base COMMIT --reps 6 --out bench/results/DATE-driver-checks-2cpu.json
What ``rayft train``'s ``checks`` phase runs on one GPU (``parallel.single_worker: auto``'s choice and
``train.fit_check``'s verdict, both from the memory planner) for the 1.5B preset as on one H200 (the
target as Ray's ``accelerator_type:H200`` names it), in a fresh process that first imports what the
driver holds by then (torch, transformers, Ray Train, the model's config). Arms, alternating:
``old`` (``--base``'s ``src``, which builds the model on the meta device each time), ``new-cold``
(this tree, an empty ``$RAYFT_CACHE``: the sizes counted, then remembered) and ``new-warm`` (this
tree, the sizes remembered by an earlier run).
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
CHECKS = """
import time
import torch, transformers, ray.train.torch
from rayft.config_load import load_config
from rayft.train.model_config import load_model_config
cfg = load_config("examples/qwen2.5-1.5b.yaml", ["model.name_or_path=qwen2.5-1.5b", "train.num_workers=1",
    "train.micro_batch_size=16", "train.activation_checkpointing=false"])
load_model_config(cfg.model)
from rayft.train import memory_plan
t = time.perf_counter()
kind = memory_plan.gpu_of_accelerator_type("accelerator_type:H200")
target = memory_plan.GpuTarget(1, kind.gpu_model, kind.gpu_memory_mib * 2**20, "H200", memory_plan.host_share(kind))
memory_plan.choose_single_worker(cfg, target, lambda s: None)
memory_plan.fit_problem(cfg, target)
print(time.perf_counter() - t)
"""


def checks_s(src: Path, cache: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(src), "RAYFT_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True, check=True, env=env, cwd=ROOT)
    return round(float(out.stdout.strip().splitlines()[-1]), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=6)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_src, new_src = commit_src(ROOT, a.base, Path(tmp)), ROOT / "src"
        warm_cache = Path(tmp, "warm")
        checks_s(new_src, warm_cache)  # remembers the sizes
        checks_s(old_src, Path(tmp, "unused"))  # bytecode of the old tree
        rows = []
        for rep in range(a.reps):
            arms = ["old", "new-cold", "new-warm"]
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                cache = Path(tmp, f"cold-{rep}") if arm == "new-cold" else warm_cache
                rows.append({"rep": rep, "arm": arm, "checks_s": checks_s(old_src if arm == "old" else new_src, cache)})
                print(json.dumps(rows[-1]), flush=True)
    median = {arm: statistics.median(r["checks_s"] for r in rows if r["arm"] == arm) for arm in ("old", "new-cold", "new-warm")}
    print(json.dumps(median))
    command = f"python bench/driver_checks_time.py --base {a.base} --reps {a.reps} --out OUT.json"
    print(write_result(a.out, command, {"base": a.base, "rows": rows, "median_checks_s": median}))


if __name__ == "__main__":
    main()

"""The host's time at the start of a compute-copies block (issue 23; bench/NOTES.md §33): entering
``ComputeCopies.computing()`` on a preset's module built on the meta device (no weights, so only the
Python work is timed: the walk over the slots, the version check, the swap, and the cast's launch
where it casts), in the three states a training forward can find, and ``refresh()`` itself:
  python bench/compute_copy_enter.py --out bench/results/DATE-compute-copy-enter-2cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from rayft.benchmarks.record import write_result
from rayft.config import ModelConfig
from rayft.train.compute_copy import ComputeCopies
from rayft.train.model import load_model_config


def timed(fn, reps: int) -> list[float]:
    """Seconds of ``fn()`` (which returns the seconds it measured itself, or None to time all of it)."""
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        inner = fn()
        out.append(inner if inner is not None else time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    conf = load_model_config(ModelConfig(name_or_path=a.preset), "sdpa")
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(conf)
    copies = ComputeCopies(module, torch.bfloat16)
    params = list(module.parameters())

    def enter() -> None:
        with copies.computing():
            pass

    def enter_after_a_change() -> float:  # a master written in place (a load): the block casts
        with torch.no_grad():
            params[0].add_(0)
        t = time.perf_counter()
        enter()
        return time.perf_counter() - t

    def enter_after_refresh() -> float:  # the training loop's case: refresh() after the optimizer step
        copies.refresh()
        t = time.perf_counter()
        enter()
        return time.perf_counter() - t

    enter()  # the copies made once
    cases = {
        "enter_casting_ms": timed(enter_after_a_change, a.reps),
        "enter_current_ms": timed(enter, a.reps),
        "enter_after_refresh_ms": timed(enter_after_refresh, a.reps),
        "refresh_ms": timed(copies.refresh, a.reps),
    }
    figures = {
        "preset": a.preset,
        "parameters": len(params),
        "reps": a.reps,
        **{k: {"best": 1e3 * min(v), "median": 1e3 * statistics.median(v)} for k, v in cases.items()},
    }
    out = write_result(a.out, " ".join(["python", *sys.argv]), figures)
    print(json.dumps(figures, indent=1), "\n", out)


if __name__ == "__main__":
    main()

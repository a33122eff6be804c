"""The host's share of handing the compute copies' gradients to their fp32 masters (issue 23;
bench/NOTES.md §34): one forward and backward of a preset's module built on the meta device (no
weights, so only the host's work is timed: Python, autograd's engine, the dispatcher), with the
copies of this tree (one pass at the backward's end) and of an older commit (``--old``: a Python hook
per parameter that casts or adds its gradient as autograd makes it), alternating, and the ATen
operators each dispatches in the backwards (a dispatch mode counts them; a GPU launches a kernel for
most of them), over a step of ``--micro-batches`` (2: the first micro-batch's gradients cast into
fresh fp32 ones, the second's added to them):
  python bench/compute_copy_grads.py --out bench/results/DATE-compute-copy-grads-2cpu.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from rayft.benchmarks.record import write_result
from rayft.config import ModelConfig
from rayft.train.compute_copy import ComputeCopies
from rayft.train.model import load_model_config


class OpCounter(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it, by name (``aten::copy_`` → ``copy_``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func._opname] += 1
        return func(*args, **(kwargs or {}))


CAUSAL = "bench_causal"


def causal_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain causal SDPA, registered with transformers without a mask function (as rayft's varlen
    attention is): no mask is built, so no check of the position ids reads a meta tensor."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def old_copies_class(commit: str) -> type:
    """``ComputeCopies`` as ``src/rayft/train/compute_copy.py`` was at ``commit`` (git show)."""
    text = subprocess.run(["git", "show", f"{commit}:src/rayft/train/compute_copy.py"], check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"compute_copy_{commit}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ComputeCopies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--old", default="e320978", help="the commit whose ComputeCopies is the old arm")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--micro-batches", type=int, default=2, help="forward and backward passes per step (grad accumulation)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from transformers import AttentionInterface

    AttentionInterface.register(CAUSAL, causal_attention)
    conf = load_model_config(ModelConfig(name_or_path=a.preset), CAUSAL)
    arms = {}
    for name, cls in (("new", ComputeCopies), ("old", old_copies_class(a.old))):
        with torch.device("meta"):
            module = AutoModelForCausalLM.from_config(conf)
        arms[name] = (module, cls(module, torch.bfloat16))
    ids = torch.zeros(1, a.tokens, dtype=torch.long, device="meta")

    def step(name: str, counter: OpCounter | None = None) -> float:
        """``--micro-batches`` forwards and backwards (the first casts into fresh fp32 gradients, the
        next add into them), then the masters' grads freed; the backwards' host seconds."""
        module, copies = arms[name]
        backward_s = 0.0
        for _ in range(a.micro_batches):
            with copies.computing():
                loss = module(input_ids=ids).logits.float().sum()
                t = time.perf_counter()
                with counter if counter is not None else contextlib.nullcontext():
                    loss.backward()
            backward_s += time.perf_counter() - t
        module.zero_grad(set_to_none=True)
        return backward_s

    ops = {}
    for name in arms:
        step(name)  # the copies made, first-call costs paid
        counter = OpCounter()
        step(name, counter)
        ops[name] = counter.counts
    times: dict[str, list[float]] = {"new": [], "old": []}
    for _ in range(a.reps):
        for name in ("new", "old"):
            times[name].append(step(name))
    grad_ops = ("copy_", "_to_copy", "add_", "add", "_foreach_copy_", "_foreach_add_", "empty_like", "empty")
    figures = {
        "preset": a.preset,
        "tokens": a.tokens,
        "micro_batches": a.micro_batches,
        "parameters": len(list(arms["new"][0].parameters())),
        "old_commit": a.old,
        "reps": a.reps,
        **{f"backward_host_ms_{name}": {"best": 1e3 * min(v), "median": 1e3 * statistics.median(v)} for name, v in times.items()},
        "backward_host_ms_saved_median": 1e3 * (statistics.median(times["old"]) - statistics.median(times["new"])),
        **{f"backward_ops_{name}": sum(c.values()) for name, c in ops.items()},
        **{f"backward_grad_ops_{name}": {k: c[k] for k in grad_ops if c[k]} for name, c in ops.items()},
    }
    out = write_result(a.out, " ".join(["python", *sys.argv]), figures)
    print(json.dumps(figures, indent=1), "\n", out)


if __name__ == "__main__":
    main()

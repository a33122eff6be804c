"""A short bus-bandwidth sweep of the collectives FSDP2 uses, run as Ray Train workers.

Each worker joins the same torch.distributed process group that ``rayft train`` sets up (Ray
Train's ``TorchTrainer``, NCCL on GPUs, gloo on CPU workers) and times ``all_reduce``,
``all_gather`` (into one tensor) and ``reduce_scatter`` (from one tensor) over a range of
message sizes: a few warm-up iterations, then timed ones. Rank 0 returns the figures.

Conventions, from NVIDIA nccl-tests ``doc/PERFORMANCE.md``
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

* ``size_bytes`` is the whole collective's data: the tensor reduced by all-reduce, the gathered
  output of all-gather, the input scattered by reduce-scatter (each rank holds ``size/n`` of the
  latter two).
* algorithm bandwidth ``algbw = size / time``;
* bus bandwidth ``busbw = algbw * 2(n-1)/n`` for all-reduce and ``algbw * (n-1)/n`` for
  all-gather and reduce-scatter, with ``n`` ranks: the rate at which data crosses the slowest
  link, comparable with the hardware's peak whatever ``n`` is.

Bandwidths are in GB/s with GB = 1e9 bytes (as nccl-tests prints them); times in milliseconds.
The time of one iteration is the mean over the timed iterations on the slowest rank (a
collective is done when its last rank is).

``python -m rayft.benchmarks.collectives CONFIG [--set ...] --out sweep.json`` runs the sweep with
the workers a training run of CONFIG would get (``train.num_workers``, ``train.use_gpu``,
``parallel.backend``, ``ray.address``), starting an embedded local Ray when no cluster is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter")
MiB = 2**20
GPU_SIZES = tuple(MiB * 4**k for k in range(6))  # 1 MiB, 4, 16, 64, 256 MiB, 1 GiB
CPU_SIZES = (64 * 1024, 256 * 1024, MiB, 4 * MiB)


class SweepError(RuntimeError):
    """The sweep could not run, or a collective returned a wrong result; the message says which."""


def bus_factor(op: str, n: int) -> float:
    """Bus-bandwidth factor of ``op`` on ``n`` ranks: ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for
    all-gather and reduce-scatter (nccl-tests ``doc/PERFORMANCE.md``).

    Raises:
        ValueError: an unknown op, or ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"number of ranks must be >= 1, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}")


def algbw_gb_s(size_bytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes per second): ``size_bytes / seconds``.

    Raises:
        ValueError: ``seconds <= 0``.
    """
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds} s")
    return size_bytes / seconds / 1e9


def busbw_gb_s(op: str, size_bytes: int, seconds: float, n: int) -> float:
    """Bus bandwidth in GB/s: :func:`algbw_gb_s` times :func:`bus_factor` (nccl-tests convention).

    Raises:
        ValueError: as :func:`bus_factor` and :func:`algbw_gb_s`.
    """
    return algbw_gb_s(size_bytes, seconds) * bus_factor(op, n)


def _collective(op: str):
    """The torch.distributed call for ``op`` taking ``(output, input)`` (newer torch names the
    single-tensor variants ``*_single``; older releases only have ``*_tensor``)."""
    import torch.distributed as dist

    if op == "all_gather":
        return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if op == "reduce_scatter":
        return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda out, inp: dist.all_reduce(out)


def _buffers(op: str, size_bytes: int, n: int, device, dtype):
    """(output, input) tensors of a collective moving ``size_bytes`` in total."""
    import torch

    count = max(n, size_bytes // torch.tensor([], dtype=dtype).element_size() // n * n)  # a multiple of n
    if op == "all_reduce":
        buf = torch.empty(count, dtype=dtype, device=device)
        return buf, buf
    if op == "all_gather":
        return torch.empty(count, dtype=dtype, device=device), torch.empty(count // n, dtype=dtype, device=device)
    return torch.empty(count // n, dtype=dtype, device=device), torch.empty(count, dtype=dtype, device=device)


def _check(op: str, run, out, inp, rank: int, n: int) -> dict[str, float]:
    """Run ``op`` once on known values and compare with the exact answer. Every rank contributes
    ``rank + 1``: all-reduce and reduce-scatter must give ``n(n+1)/2`` everywhere, all-gather
    chunk ``i`` must hold ``i + 1``.

    Returns ``{"expected_sum", "min", "max"}`` of the result (for all-gather, of chunk sums
    ``sum_i (i+1)``, i.e. the output's sum over chunks divided by the chunk length).
    """
    import torch

    inp.fill_(rank + 1)
    run(out, inp)
    expected = n * (n + 1) / 2
    if op == "all_gather":
        chunks = out.view(n, -1).double()
        want = torch.arange(1, n + 1, dtype=torch.float64, device=out.device).unsqueeze(1)
        ok = bool(torch.equal(chunks, want.expand_as(chunks)))
        per = chunks.sum(0)  # every column is sum_i (i+1)
        got_min, got_max = per.min().item(), per.max().item()
    else:
        got = out.double()
        got_min, got_max = got.min().item(), got.max().item()
        ok = got_min == expected and got_max == expected
    if not ok:
        raise SweepError(
            f"{op} on {n} ranks returned wrong values on rank {rank}: min {got_min}, max {got_max}, "
            f"expected {expected} (every rank contributed rank+1)"
        )
    return {"expected_sum": expected, "min": got_min, "max": got_max}


def sweep_worker(loop_config: dict[str, Any]) -> None:
    """Ray Train worker entry point: check and time each op at each size, report from rank 0.

    ``loop_config``: ``sizes_bytes`` (list of int), ``warmup_iters``, ``timed_iters``, ``dtype``
    (``"float32"`` or ``"bfloat16"``), ``results`` (a ``ray.util.queue.Queue``). Rank 0 puts its
    figures on the queue (see :func:`run_sweep` for the layout): Ray Train V2 keeps reported
    metrics only with a checkpoint.
    """
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    ctx = ray.train.get_context()
    rank, n = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = getattr(torch, loop_config["dtype"])
    warmup, iters = loop_config["warmup_iters"], loop_config["timed_iters"]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows, checks = [], {}
    for op in OPS:
        run = _collective(op)
        for size in loop_config["sizes_bytes"]:
            out, inp = _buffers(op, size, n, device, dtype)
            real_size = (out if op != "reduce_scatter" else inp).numel() * out.element_size()
            check = _check(op, run, out, inp, rank, n)
            if op not in checks:
                checks[op] = check
            inp.zero_()  # repeated in-place sums of zeros stay finite
            for _ in range(warmup):
                run(out, inp)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run(out, inp)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            sec = elapsed.item()
            rows.append(
                {
                    "op": op,
                    "size_bytes": real_size,
                    "time_ms": sec * 1e3,
                    "algbw_GB_s": algbw_gb_s(real_size, sec),
                    "busbw_GB_s": busbw_gb_s(op, real_size, sec, n),
                }
            )
            del out, inp
    peak = {op: max(r["busbw_GB_s"] for r in rows if r["op"] == op) for op in OPS}
    result = {
        "backend": dist.get_backend(),
        "world_size": n,
        "device": device.type if device.type != "cuda" else torch.cuda.get_device_name(device),
        "dtype": loop_config["dtype"],
        "warmup_iters": warmup,
        "timed_iters": iters,
        "results": rows,
        "peak_busbw_GB_s": peak,
        "checks": checks,
    }
    if rank == 0:
        ray.get(loop_config["results"].actor.put_nowait.remote(result))


def run_sweep(
    num_workers: int,
    use_gpu: bool,
    backend: str | None = None,
    sizes_bytes: list[int] | tuple[int, ...] | None = None,
    warmup_iters: int = 3,
    timed_iters: int = 10,
    dtype: str = "float32",
    cpus_per_worker: float = 1,
    env_vars: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the sweep on ``num_workers`` Ray Train workers of the connected Ray cluster.

    Args:
        num_workers: ranks (one per GPU with ``use_gpu``).
        use_gpu: one GPU per worker, else CPU workers.
        backend: torch.distributed backend; default ``nccl`` with GPUs, ``gloo`` without.
        sizes_bytes: total message sizes (see the module doc); default 1 MiB to 1 GiB on GPUs,
            64 KiB to 4 MiB on CPUs. Each is rounded down to a multiple of ``n`` elements.
        warmup_iters, timed_iters: iterations per op and size before and during timing.
        dtype: ``float32`` (nccl-tests' default type) or ``bfloat16``.
        env_vars: extra environment for the workers (e.g. ``NCCL_*`` on a remote cluster).

    Returns:
        Rank 0's figures: ``backend``, ``world_size``, ``device``, ``dtype``, ``warmup_iters``,
        ``timed_iters``, ``results`` (one row per op and size: ``op``, ``size_bytes``,
        ``time_ms``, ``algbw_GB_s``, ``busbw_GB_s``), ``peak_busbw_GB_s`` per op and ``checks``
        (per op, the smallest size's correctness check: ``expected_sum``, ``min``, ``max``).

    Raises:
        SweepError: bad arguments, or a worker failed (a wrong collective result included).
    """
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Empty, Queue

    if num_workers < 2:
        raise SweepError(f"a collectives sweep needs at least 2 workers, got {num_workers}")
    if warmup_iters < 0 or timed_iters < 1:
        raise SweepError(f"need warmup_iters >= 0 and timed_iters >= 1, got {warmup_iters} and {timed_iters}")
    if dtype not in ("float32", "bfloat16"):
        raise SweepError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    sizes = list(sizes_bytes or (GPU_SIZES if use_gpu else CPU_SIZES))
    if not sizes or min(sizes) < 1:
        raise SweepError(f"message sizes must be positive byte counts, got {sizes}")
    backend = backend or ("nccl" if use_gpu else "gloo")
    results = Queue()
    trainer = TorchTrainer(
        sweep_worker,
        train_loop_config={
            "sizes_bytes": sizes,
            "warmup_iters": warmup_iters,
            "timed_iters": timed_iters,
            "dtype": dtype,
            "results": results,
        },
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cpus_per_worker}),
        run_config=ray.train.RunConfig(
            name=f"rayft-collectives-{time.strftime('%Y%m%d-%H%M%S')}",
            worker_runtime_env={"env_vars": dict(env_vars or {})},
        ),
        torch_config=TorchConfig(backend=backend),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as e:
        raise SweepError(f"collectives sweep failed: {e}") from None
    try:
        return results.get(timeout=10)
    except Empty:
        raise SweepError("collectives sweep finished without rank 0's figures") from None
    finally:
        results.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m rayft.benchmarks.collectives CONFIG [--set K=V ...] --out FILE``; exit 1 on failure."""
    from rich.console import Console

    from rayft.config import ConfigError
    from rayft.config_load import load_config
    from rayft.train.errors import TrainError
    from rayft.train.ray_cluster import connect_ray, resolve_workers, worker_env_vars

    ap = argparse.ArgumentParser(prog="python -m rayft.benchmarks.collectives", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", "-s", dest="overrides", action="append", default=[])
    ap.add_argument("--out", required=True, help="where to write the figures (JSON)")
    ap.add_argument("--max-bytes", type=int, default=None, help="largest message size (default 1 GiB on GPUs, 4 MiB on CPUs)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args(argv)
    err = Console(stderr=True)
    try:
        cfg = load_config(Path(a.config), a.overrides)
        connect_ray(cfg)
        n, use_gpu = resolve_workers(cfg)
        sizes = list(GPU_SIZES if use_gpu else CPU_SIZES)
        if a.max_bytes:
            sizes = [s for s in sizes if s <= a.max_bytes] or [a.max_bytes]
        backend = cfg.parallel.backend if cfg.parallel.backend != "auto" else None
        err.print(f"collectives sweep: {n} {'GPU' if use_gpu else 'CPU'} workers, sizes {sizes[0]}..{sizes[-1]} bytes", highlight=False)
        figures = run_sweep(
            n, use_gpu, backend, sizes, a.warmup, a.iters, cpus_per_worker=cfg.train.cpus_per_worker, env_vars=worker_env_vars()
        )
    except (ConfigError, TrainError, SweepError) as e:
        err.print(f"error: {e}", markup=False, highlight=False)
        return 1
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(figures, indent=2) + "\n")
    for op, bw in figures["peak_busbw_GB_s"].items():
        err.print(f"{op}: peak bus bandwidth {bw:.2f} GB/s", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

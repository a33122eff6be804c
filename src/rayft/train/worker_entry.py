"""The Ray Train workers' entry point, importable without the training stack.

``TorchTrainer`` gets :func:`train_func`, which Ray pickles by reference: the driver imports this
module only, and each worker imports :mod:`rayft.train.loop` (torch.distributed's checkpointing
and FSDP, the export, the loss kernels) as it starts, which it needs anyway. Handing the loop's own
function to ``TorchTrainer`` made the driver import all of it before its first phase too: 10.3 s
of imports then, 5.8 s now, on a 2-core machine (bench/results/2026-12-04-driver-start-exit-2cpu.json).
"""

from __future__ import annotations

from typing import Any


def train_func(loop_config: dict[str, Any]) -> None:
    """Run :func:`rayft.train.loop.train_func` on this worker (``loop_config``: a :class:`~rayft.train.worker_args.WorkerArgs`'s)."""
    from rayft.train.loop import train_func as run

    run(loop_config)

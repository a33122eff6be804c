"""The Ray Train workers' entry point, importable without the training stack.

``TorchTrainer`` gets :func:`train_func`, which Ray pickles by reference: the driver imports this
module only, and each worker imports :mod:`rayft.train.loop` (torch.distributed's checkpointing
and FSDP, the export, the loss kernels) as it starts, which it needs anyway. Handing the loop's own
function to ``TorchTrainer`` made the driver import all of it before its first phase too: 10.3 s
of imports then, 5.8 s now, on a 2-core machine (bench/results/2026-12-04-driver-start-exit-2cpu.json).

The driver may start the workers before its data are ready (:mod:`rayft.train.worker_launch`): each worker
imports the loop, then waits for its arguments (:class:`~rayft.train.worker_args.PendingArgs`)
before anything touches its GPU. Ray Train's own torch context would make the worker's CUDA
context as the function starts (``torch.cuda.set_device``); the driver's
:class:`rayft.train.torch_config.DeviceDeferredTorchConfig` leaves that to the loop, which sets the device once
the arguments are there.
"""

from __future__ import annotations

import time
from typing import Any


def train_func(loop_config: dict[str, Any]) -> None:
    """Run :func:`rayft.train.loop.train_func` on this worker once its arguments are there
    (``loop_config``: a :class:`~rayft.train.worker_args.WorkerArgs`'s, or one holding a
    :class:`~rayft.train.worker_args.PendingArgs`). A run called off before training (its data or
    checks failed on the driver, a stop) returns without training."""
    from rayft.train.worker_args import LOOP_CONFIG_KEY, PendingArgs

    given = loop_config.get(LOOP_CONFIG_KEY)
    pending = isinstance(given, PendingArgs)
    if pending and (why_not := given.called_off()) is not None:  # called off already: the loop's imports not waited for
        return did_not_train(why_not)
    from rayft.train.loop import train_func as run

    ready_unix = time.time()  # the loop imported: this worker could start now
    if pending:
        args, why_not = given.wait()
        if args is None:
            return did_not_train(why_not)
        loop_config = args.loop_config()
    try:
        run(loop_config, start_unix={"worker_entry_unix": ready_unix, "worker_args_unix": time.time()})
    except Exception as e:  # Ray Train restarts the group (or fails the run) with its own error; the driver says which worker and why
        tell_driver_of_failure(loop_config, e)
        raise


def tell_driver_of_failure(loop_config: dict[str, Any], e: Exception) -> None:
    """Post :class:`~rayft.train.events.WorkerFailedEvent` for this worker's failure ``e`` on the
    run's progress channel, whatever this worker's rank; best effort, within 10 s: the failure
    itself is what Ray Train acts on."""
    import ray.train

    from rayft.train.events import WorkerFailedEvent, failure_text
    from rayft.train.worker_args import WorkerArgs

    try:
        event = WorkerFailedEvent(ray.train.get_context().get_world_rank(), failure_text(e), time.time())
        WorkerArgs.from_loop_config(loop_config).progress.send(event, wait=True, timeout_s=10)  # the channel, not rank 0's
    except Exception as again:  # noqa: BLE001 -- the run actor gone with its driver, say
        print(f"[rayft] this worker's failure could not be posted to the driver: {failure_text(again)}", flush=True)


def did_not_train(why: str) -> None:
    print(f"[rayft] this worker did not train: {why}", flush=True)

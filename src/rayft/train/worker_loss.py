"""Workers that Ray Train lost without a word from them, said on the driver.

A worker whose train function raises posts its own failure (:func:`rayft.train.worker_entry.tell_driver_of_failure`).
A worker killed outright cannot: a SIGKILL, the kernel's OOM killer, a segfault in a kernel, its
node lost. Ray Train's controller sees such a worker at its next poll (the poll task fails with Ray's
``ActorDiedError``, or hangs past ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``) and restarts the group
from the newest checkpoint while ``ray.max_failures`` allows. Before this module the driver showed
only the resume that followed, with no reason (bench/NOTES.md §47).

:class:`WorkerLossReport` is a ``ray.train.UserCallback`` (Ray Train's public callback API; it runs
in the controller's process): for each failed rank in a poll it posts a
:class:`~rayft.train.events.WorkerFailedEvent` with ``seen_by="ray_train"`` on the run's channel. A
rank whose train function raised is also in the controller's errors; the driver says that failure
once, from the worker's own post, which reaches the mailbox first (the worker waits for it before it
raises; :class:`rayft.train.progress.RunProgress`).
"""

from __future__ import annotations

import re
import time
from typing import Any

import ray.train

from rayft.train.events import ProgressChannel, WorkerFailedEvent, clip, failure_text

#: the sentence of Ray's ``ActorDiedError`` from which it says how the process ended (Ray 2.5x-2.60)
EXIT_DETAIL = re.compile(r"Worker exit type: .*", re.DOTALL)
PID = re.compile(r"\bpid[:=]\s*(\d+)")
IP = re.compile(r"\b(?:ip|node_ip)[:=]\s*'?([0-9a-fA-F.:]+)")


def lost_worker_text(error: BaseException, limit: int = 300) -> str:
    """How Ray Train lost a worker, on one line of at most ``limit`` characters.

    ``error``: what Ray Train's controller holds for the rank. For a dead process, Ray Train's
    ``WorkerHealthCheckFailedError`` whose ``health_check_failure`` is Ray's ``ActorDiedError``:
    ``"its process died (pid P on IP): Worker exit type: SYSTEM_ERROR Worker exit detail: ..."``.
    Anything else (a hung health check, another Ray's errors): ``"Type: first line of its message"``."""
    cause = getattr(error, "health_check_failure", None)
    text = str(cause if cause is not None else error)
    if (exit_detail := EXIT_DETAIL.search(text)) is not None:
        where = [f"pid {m.group(1)}" for m in [PID.search(text)] if m] + [f"on {m.group(1)}" for m in [IP.search(text)] if m]
        detail = " ".join(exit_detail.group(0).split())
        return clip(f"its process died ({' '.join(where)}): {detail}" if where else f"its process died: {detail}", limit)
    head = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return clip(f"{type(error).__name__}: {head}" if head else type(error).__name__, limit)


class WorkerLossReport(ray.train.UserCallback):
    """Ray Train's controller → the driver: each rank of a failed poll, as a
    :class:`~rayft.train.events.WorkerFailedEvent` with ``seen_by="ray_train"`` on ``channel`` (the
    run's :class:`~rayft.train.events.ProgressChannel`, pickled to the controller with the callback).

    Posts without waiting (the controller's loop must not block on the driver's mailbox) and never
    raises: a failure here must not turn a worker's restart into the run's failure."""

    def __init__(self, channel: ProgressChannel) -> None:
        self.channel = channel

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        now = time.time()
        for rank, error in sorted(worker_exceptions.items()):
            try:
                self.channel.send(WorkerFailedEvent(int(rank), lost_worker_text(error), now, seen_by="ray_train"))
            except Exception as e:  # noqa: BLE001 -- the run actor gone with its driver, say: the restart goes on
                print(f"[rayft] the loss of worker rank {rank} could not be posted to the driver: {failure_text(e)}", flush=True)

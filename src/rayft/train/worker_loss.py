"""Workers' failures as Ray Train's controller sees them, said on the driver.

A worker whose train function raises posts its own failure (:func:`rayft.train.worker_entry.tell_driver_of_failure`).
A worker killed outright cannot: a SIGKILL, the kernel's OOM killer, a segfault in a kernel, its
node lost. Nor can one that failed before that report's ``try`` (the loop's import), or whose post
timed out. Ray Train's controller sees every one at its next poll: a train function's exception
(Ray Train's ``UserExceptionWithTraceback`` around it), or a poll task that failed with Ray's
``ActorDiedError`` (Ray Train's ``WorkerHealthCheckFailedError`` around it) or hung past
``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``; it then restarts the group from the newest checkpoint
while ``ray.max_failures`` allows. Before this module a killed worker's restart showed on the driver
only as the resume that followed, with no reason (bench/NOTES.md §47-§48).

:class:`WorkerLossReport` is a ``ray.train.UserCallback`` (Ray Train's public callback API; it runs
in the controller's process): for each failed rank of a poll it posts a
:class:`~rayft.train.events.WorkerFailedEvent` with ``seen_by="ray_train"`` on the run's channel,
``lost`` for a process that died or hung. The driver drops one that repeats a worker's own report
(the same rank and text since the last resume: the worker's post reaches the mailbox first, as the
worker waits for it before it raises; :class:`rayft.train.progress.RunProgress`).
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


def failure_as_ray_train_saw_it(error: BaseException, limit: int = 300) -> tuple[str, bool]:
    """How Ray Train's controller saw a worker fail, on one line of at most ``limit`` characters, and
    whether the worker was lost (its process died or hung) rather than its train function raising.

    ``error``: what the controller holds for the rank.
    - a dead process: Ray Train's ``WorkerHealthCheckFailedError`` whose ``health_check_failure`` is
      Ray's ``ActorDiedError``: ``("its process died (pid P on IP): Worker exit type: SYSTEM_ERROR
      Worker exit detail: ...", True)``;
    - the train function's exception: Ray Train's ``UserExceptionWithTraceback``, whose text is the
      traceback: :func:`~rayft.train.events.failure_text` of the exception itself where Ray keeps it
      (``_base_exc``, Ray 2.5x-2.60), else the traceback's last line (``"ValueError: bad row"``), as the
      worker's own report says it; not lost;
    - anything else (a hung health check): ``("Type: first line of its message", True)``."""
    cause = getattr(error, "health_check_failure", None)
    text = str(cause if cause is not None else error)
    if (exit_detail := EXIT_DETAIL.search(text)) is not None:
        where = [f"pid {m.group(1)}" for m in [PID.search(text)] if m] + [f"on {m.group(1)}" for m in [IP.search(text)] if m]
        detail = " ".join(exit_detail.group(0).split())
        return clip(f"its process died ({' '.join(where)}): {detail}" if where else f"its process died: {detail}", limit), True
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback (most recent call last)"):  # the train function's own exception
        base = getattr(error, "_base_exc", None)
        return (failure_text(base, limit) if isinstance(base, BaseException) else clip(lines[-1], limit)), False
    return clip(f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__, limit), True


class WorkerLossReport(ray.train.UserCallback):
    """Ray Train's controller → the driver: each rank of a failed poll, as a
    :class:`~rayft.train.events.WorkerFailedEvent` with ``seen_by="ray_train"`` on ``channel`` (the
    run's :class:`~rayft.train.events.ProgressChannel`, pickled to the controller with the callback).

    The same rank and text are posted once: the controller may poll a failed worker again (a
    preempted one, Ray 2.60); a worker that dies again after a restart is a new process with
    another pid, so another text. Posts without waiting (the controller's loop must not block on
    the driver's mailbox) and never raises: a failure here must not turn a worker's restart into
    the run's failure."""

    def __init__(self, channel: ProgressChannel) -> None:
        self.channel = channel
        self.posted: set[tuple[int, str]] = set()

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        now = time.time()
        for rank, error in sorted(worker_exceptions.items()):
            try:
                text, lost = failure_as_ray_train_saw_it(error)
                if (int(rank), text) in self.posted:
                    continue
                self.posted.add((int(rank), text))
                self.channel.send(WorkerFailedEvent(int(rank), text, now, seen_by="ray_train", lost=lost))
            except Exception as e:  # noqa: BLE001 -- the run actor gone with its driver, say: the restart goes on
                print(f"[rayft] worker rank {rank}'s failure could not be posted to the driver: {failure_text(e)}", flush=True)

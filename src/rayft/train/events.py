"""What workers tell the driver during a run: typed progress events over one channel.

Rank 0 sends; the driver drains the channel into its live display and the run's summary. Why not
``ray.train.report`` for this: it waits for the Ray Train controller to consume each result (a
queue of one), which costs ~1.5 s per call — a whole step at 1.5B scale — so live metrics travel
through a mailbox of our own (the run's actor, :mod:`rayft.train.run_actor`), and
``ray.train.report`` is not used per step.

An event that is not one of the types below is an error on both sides, never taken for a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class StepEvent:
    """One finished step. ``metrics``: the step's record as written to ``rayft_metrics.jsonl``
    (``step``, ``loss``, ``tokens_per_s_per_gpu``, ...: :func:`rayft.train.loop.step_record`)."""

    metrics: dict[str, Any]


@dataclass(frozen=True)
class CheckpointEvent:
    """A checkpoint finished writing. ``timing``: its step, path and seconds
    (:meth:`rayft.train.checkpoint_writer.CheckpointWriter.save`)."""

    timing: dict[str, Any]


@dataclass(frozen=True)
class ResumedEvent:
    """The workers loaded a checkpoint: its ``step``, the world size it was saved at and the
    current one, and the load time ``load_s`` (seconds)."""

    step: int
    from_world_size: int
    world_size: int
    load_s: float


@dataclass(frozen=True)
class InitialEvalEvent:
    """The validation loss before the first step: ``eval_loss`` (nats per trainable token) and
    ``eval_tokens`` (trainable validation targets)."""

    eval_loss: float
    eval_tokens: float


@dataclass(frozen=True)
class ExportEvent:
    """The Hugging Face export was written and checked: ``export_dir``, ``export_written_by``,
    ``export_max_abs_weight_diff`` and ``export_tensors`` (sharded export), ``export_max_abs_logit_diff``
    (None when ``export_logit_check_skipped`` says why), ``export_tied``, ``trained_float8``."""

    info: dict[str, Any]


@dataclass(frozen=True)
class StoppedEvent:
    """The workers stopped early on a stop request (:mod:`rayft.train.stop`): ``steps_done``
    (steps finished), ``checkpoint_step`` (the newest checkpoint's step, from which ``--resume``
    continues; None when there is none) and the request's ``reason``. With
    ``checkpoint.on_signal`` (the default) the newest checkpoint holds every finished step."""

    steps_done: int
    checkpoint_step: int | None
    reason: str


@dataclass(frozen=True)
class WorkerFailedEvent:
    """A worker failed: its world ``rank``, ``error`` (on one line: :func:`failure_text`) and
    ``unix_time``. Ray Train then restarts the worker group from the newest checkpoint while
    ``ray.max_failures`` allows, else the run fails with Ray Train's error.

    ``seen_by``: ``"worker"``, posted by the failing worker itself when its train function raised,
    whatever its rank (every rank's channel drops the other events); ``"ray_train"``, posted by Ray
    Train's controller for each rank it found failed (:mod:`rayft.train.worker_loss`), which is
    how a worker killed outright (SIGKILL, the OOM killer, its node lost) is told: it posts nothing.
    ``lost``: the worker's process died or hung (Ray Train's report only), rather than raising."""

    rank: int
    error: str
    unix_time: float
    seen_by: str = "worker"
    lost: bool = False


def failure_text(e: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (its lines joined by `` / ``), cut to ``limit`` characters: a
    worker's failure as the driver says it (Ray Train's own error, with its traceback, stays in the
    workers' logs)."""
    try:
        message = " / ".join(line.strip() for line in str(e).splitlines() if line.strip())
    except Exception:  # an exception whose text fails: its type says enough
        message = ""
    return clip(f"{type(e).__name__}: {message}" if message else type(e).__name__, limit)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last one an ellipsis where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


ProgressEvent = Union[StepEvent, CheckpointEvent, ResumedEvent, InitialEvalEvent, ExportEvent, StoppedEvent, WorkerFailedEvent]
EVENT_TYPES = (StepEvent, CheckpointEvent, ResumedEvent, InitialEvalEvent, ExportEvent, StoppedEvent, WorkerFailedEvent)


class UnknownEventError(TypeError):
    """Something other than a :data:`ProgressEvent` was sent or received."""


def check_event(event: object) -> ProgressEvent:
    """``event`` itself when it is a progress event.

    Raises:
        UnknownEventError: any other object (a dict included: the old untyped messages).
    """
    if not isinstance(event, EVENT_TYPES):
        raise UnknownEventError(f"not a progress event: {type(event).__name__} {event!r:.200}")
    return event


@dataclass(frozen=True)
class ProgressChannel:
    """The driver↔rank-0 channel. Made on the driver over the run's mailbox (an
    :class:`~rayft.train.run_actor.ActorMailbox`: ``post(event, wait)`` and ``take() -> list``),
    pickled into the workers' arguments; a channel without a mailbox (:meth:`silent`, and every rank
    but 0 through :meth:`for_rank`) drops what it is sent."""

    mailbox: Any = None  # an ActorMailbox, or None

    @classmethod
    def silent(cls) -> ProgressChannel:
        return cls(None)

    def for_rank(self, rank: int) -> ProgressChannel:
        """This channel on rank 0, a silent one elsewhere (only rank 0 reports)."""
        return self if rank == 0 else ProgressChannel.silent()

    def send(self, event: ProgressEvent, wait: bool = False, timeout_s: float | None = None) -> None:
        """Post ``event`` without blocking; ``wait``: until the mailbox holds it (the last messages
        before a worker exits, which would otherwise be lost with it), at most ``timeout_s``.

        Raises:
            UnknownEventError: ``event`` is not a progress event.
        """
        check_event(event)
        if self.mailbox is not None:
            self.mailbox.post(event, wait=wait, timeout_s=timeout_s)

    def drain(self) -> list[ProgressEvent]:
        """Every event posted so far and not drained yet, oldest first (driver side; one call, no wait
        for new events).

        Raises:
            UnknownEventError: the mailbox held something that is not a progress event.
        """
        if self.mailbox is None:
            return []
        return [check_event(e) for e in self.mailbox.take()]

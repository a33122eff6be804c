"""The training layer's errors."""

from __future__ import annotations


class TrainError(RuntimeError):
    """The job cannot start or did not finish; the message says why."""


class TrainStopped(Exception):
    """A signal stopped the run, after its checkpoint and records were written (not a failure).

    Attributes: ``signal`` (``SIGTERM`` or ``SIGINT``), ``exit_code`` (143 or 130), ``run_dir``,
    ``checkpoint_step`` (the newest checkpoint's step, from which ``--resume`` continues; None:
    nothing to resume from), ``forced`` (the driver stopped waiting for the workers: the grace
    period ran out, or a second signal), ``before_training`` (no worker had started),
    ``steps_done``.
    """

    def __init__(
        self,
        signal: str,
        exit_code: int,
        run_dir: str,
        checkpoint_step: int | None,
        *,
        forced: bool = False,
        before_training: bool = False,
        steps_done: int = 0,
    ):
        self.signal, self.exit_code, self.run_dir = signal, exit_code, run_dir
        self.checkpoint_step, self.forced, self.before_training, self.steps_done = checkpoint_step, forced, before_training, steps_done
        where = "before training started" if before_training else f"after {steps_done} step(s)"
        held = f"checkpoint of step {checkpoint_step} in {run_dir}" if checkpoint_step is not None else "no checkpoint to resume from"
        super().__init__(f"stopped by {signal} {where}; {held}")

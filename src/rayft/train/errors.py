"""The training layer's errors."""

from __future__ import annotations


class TrainError(RuntimeError):
    """The job cannot start or did not finish; the message says why."""


class TrainStopped(Exception):
    """A signal stopped the run, after its checkpoint and records were written (not a failure).

    Attributes: ``signal`` (``SIGTERM`` or ``SIGINT``), ``exit_code`` (143 or 130), ``run_dir``,
    ``checkpoint_step`` (the newest checkpoint's step, from which ``--resume`` continues; None:
    nothing to resume from), ``forced`` (the driver stopped waiting for the workers: the grace
    period ran out, or a second signal), ``before_training`` (no worker had begun training: any that had started were called off),
    ``steps_done``, ``total_steps`` (the run's; None when not known).
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
        total_steps: int | None = None,
    ):
        self.signal, self.exit_code, self.run_dir = signal, exit_code, run_dir
        self.checkpoint_step, self.forced, self.before_training, self.steps_done = checkpoint_step, forced, before_training, steps_done
        self.total_steps = total_steps
        where = "before training started" if before_training else f"after {steps_done} step(s)"
        held = f"checkpoint of step {checkpoint_step} in {run_dir}" if checkpoint_step is not None else "no checkpoint to resume from"
        if self.finished:
            held += ", its last: nothing is left to resume"
        super().__init__(f"stopped by {signal} {where}; {held}")

    @property
    def finished(self) -> bool:
        """The newest checkpoint holds every step of the run (a stop forced while the run ended):
        ``--resume`` would refuse it; ``rayft export`` writes its model."""
        return self.checkpoint_step is not None and self.total_steps is not None and self.checkpoint_step >= self.total_steps

"""What every Ray Train worker receives from the driver: one picklable, typed object.

Ray Train hands ``train_loop_config`` (a dict) to the training function; rayft puts a single
:class:`WorkerArgs` in it under ``"args"`` so that the fields are named and typed on both sides.
A run's driver may start its workers before its data are ready (:mod:`rayft.train.worker_launch`), so what it
puts there is a :class:`PendingArgs`: where the workers wait for their :class:`WorkerArgs`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rayft.config import RayftConfig
from rayft.train.events import ProgressChannel

LOOP_CONFIG_KEY = "args"


@dataclass(frozen=True)
class WorkerArgs:
    """Everything a worker needs besides Ray Train's context.

    Fields:
        config: the resolved :class:`RayftConfig` as JSON-compatible data (validated again on the
            worker, so a worker never runs an unvalidated config).
        dataset: ``ray.ObjectRef`` of the training data: a :class:`~rayft.data.token_view.StoreView`
            (``data.synthetic``: a :class:`~rayft.data.tokenize.TokenizedDataset`).
        validation: ``ray.ObjectRef`` of the validation view, or None.
        plan: ``ray.ObjectRef`` of the run's :class:`~rayft.data.packing.StepPlan`, made once by
            the driver (:func:`rayft.train.step_plan.make_plan`) for this worker group's size.
        pad_id: the tokenizer's padding token id.
        data_fingerprint: the training selection's fingerprint
            (:func:`rayft.data.prepare.selection_fingerprint`; a resume refuses a checkpoint of other data).
        tokenizer: the tokenizer's name or directory (written into checkpoints and the export).
        run_dir: the run directory (a local path or an ``s3://`` URI).
        progress: the channel to the driver's display (:class:`ProgressChannel`).
        resume_from: the checkpoint ``--resume`` chose, or None.
        stop_flag: the run's :class:`~rayft.train.run_actor.RunActor` handle (its stop flag), or None.
    """

    config: dict[str, Any]
    dataset: Any
    validation: Any
    plan: Any
    pad_id: int
    data_fingerprint: str
    tokenizer: str
    run_dir: str
    progress: ProgressChannel
    resume_from: str | None = None
    stop_flag: Any = None

    def parsed_config(self) -> RayftConfig:
        return RayftConfig.model_validate(self.config)

    def loop_config(self) -> dict[str, WorkerArgs]:
        """Ray Train's ``train_loop_config`` carrying these arguments."""
        return {LOOP_CONFIG_KEY: self}

    @staticmethod
    def from_loop_config(loop_config: dict[str, Any]) -> WorkerArgs:
        """The arguments inside ``train_loop_config``.

        Raises:
            TypeError: ``loop_config`` does not carry a :class:`WorkerArgs`.
        """
        args = loop_config.get(LOOP_CONFIG_KEY)
        if not isinstance(args, WorkerArgs):
            raise TypeError(f"train_loop_config[{LOOP_CONFIG_KEY!r}] must be a WorkerArgs, got {type(args).__name__}")
        return args


@dataclass(frozen=True)
class PendingArgs:
    """A worker's :class:`WorkerArgs`, to come from the run's actor (:class:`~rayft.train.run_actor.RunActor`)
    once the driver's data are ready. ``run_actor``: the actor's handle; ``poll_s``: seconds between
    two questions to it at first (each a small actor call, ~1 ms), doubled after each unanswered one
    up to ``max_poll_s``: a long data phase costs the actor five calls a second per worker, not 20."""

    run_actor: Any
    poll_s: float = 0.05
    max_poll_s: float = 0.2

    def wait(self) -> tuple[WorkerArgs | None, str | None]:
        """Block until the driver gives the arguments or calls the run off. Returns ``(args, None)``,
        or ``(None, reason)`` when the run was called off before training or the actor has died (its
        driver ended). An actor that is only unreachable for a moment (``ActorUnavailableError``: a
        network blip between nodes) is asked again: one rank going home alone would leave the others
        waiting in their first collective."""
        pause = self.poll_s
        while True:
            state, value = self.ask()
            if state == "args":
                return value, None
            if state == "cancelled":
                return None, value
            time.sleep(pause)
            pause = min(2 * pause, self.max_poll_s)

    def called_off(self) -> str | None:
        """Ask once, without waiting: the reason the run was called off before training, or None
        (the arguments are there, or still to come). A worker asks before its imports, which a
        cancelled run need not wait for."""
        state, value = self.ask()
        return value if state == "cancelled" else None

    def ask(self) -> tuple[str, Any]:
        """One question to the run's actor: ``("args", WorkerArgs)``, ``("cancelled", reason)`` (a
        dead actor counts as called off), or ``("waiting", None)`` (an unreachable one too)."""
        import ray
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        try:
            return ray.get(self.run_actor.worker_args.remote(rank))
        except ray.exceptions.ActorUnavailableError:
            return "waiting", None
        except ray.exceptions.RayActorError:
            return "cancelled", "the driver stopped before training (the run's actor has died)"

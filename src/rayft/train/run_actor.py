"""The one small actor each run creates, on the driver's node: rank 0's progress mailbox, the
run's stop flag, and the workers' arguments, handed over once the driver's data are ready.

Every Ray actor is a worker process of its own (about 1.5 CPU-s and a second or more to start on a
busy head node), so the run's two small jobs share one: rank 0 posts its progress events to it
(:class:`rayft.train.events.ProgressChannel`) and polls its stop request
(:class:`rayft.train.stop.StopPoll`); the driver takes the events every 0.25 s, all of them in one
call, and sets the stop request on a signal; ``rayft stop`` finds it by its name
(:func:`rayft.train.stop.stop_actor_name`). Until 2026-12-03 these were two actors: a
``ray.util.queue.Queue`` (an async actor read one call per event) and a stop flag.

The workers may start while the driver tokenizes the data (:mod:`rayft.train.worker_launch`), so
their :class:`~rayft.train.worker_args.WorkerArgs`, which hold the data's references, reach them
here: the driver gives them (:meth:`RunActor.give_args`) or calls the run off before training
(:meth:`RunActor.cancel`); each worker polls :meth:`RunActor.worker_args` until one of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayft.train.stop import STOP_NAMESPACE, stop_actor_name


class RunActor:
    """A run's stop request and its undelivered progress events (the actor's state; every method
    is one call, run in the order each caller sent them)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.events: list = []
        self.args: Any = None
        self.cancelled: str | None = None
        self.asked: set[int] = set()

    def request(self, reason: str) -> None:
        """Ask the run to stop; the first reason given is kept."""
        if self.reason is None:
            self.reason = reason

    def requested(self) -> str | None:
        """The stop request's reason, or None: go on."""
        return self.reason

    def post(self, event: Any) -> None:
        """Keep ``event`` (rank 0's progress event) until the driver takes it."""
        self.events.append(event)

    def take(self) -> list:
        """Every event posted since the last call, oldest first."""
        events, self.events = self.events, []
        return events

    def give_args(self, args: Any) -> None:
        """Keep the workers' arguments (a :class:`~rayft.train.worker_args.WorkerArgs`) for every
        worker that asks, a restarted worker group's too."""
        self.args = args

    def cancel(self, reason: str) -> None:
        """Call the run off before training (the driver's data or checks failed, or it was stopped):
        every worker still waiting for its arguments returns without training."""
        if self.args is None and self.cancelled is None:
            self.cancelled = reason

    def worker_args(self, rank: int) -> tuple[str, Any]:
        """``("args", WorkerArgs)`` once given, ``("cancelled", reason)`` once called off, else
        ``("waiting", None)``; ``rank``: the asking worker's world rank."""
        self.asked.add(rank)
        if self.args is not None:
            return "args", self.args
        if self.cancelled is not None:
            return "cancelled", self.cancelled
        return "waiting", None

    def waiting_ranks(self) -> list[int]:
        """The world ranks of the workers that have asked for their arguments so far (they are up,
        their imports done), ascending."""
        return sorted(self.asked)


def create_run_actor(run_name: str):
    """A new :class:`RunActor` named for ``run_name`` (``rayft-stop-<run_name>`` in namespace
    ``rayft``; needs a connected Ray; zero CPUs), placed on the driver's node: it lives and dies
    with the driver, not with a worker node.

    Raises:
        ValueError: an actor of that name is alive on the cluster (Ray's error for a taken name).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(num_cpus=0)(RunActor)
    return actor.options(name=stop_actor_name(run_name), namespace=STOP_NAMESPACE, scheduling_strategy=here).remote()


@dataclass(frozen=True)
class ActorMailbox:
    """The progress mailbox of a :class:`RunActor`, as :class:`rayft.train.events.ProgressChannel`
    uses it: ``post`` on rank 0, ``take`` on the driver. ``actor``: the actor's handle (picklable)."""

    actor: Any

    def post(self, event: Any, wait: bool = False, timeout_s: float | None = None) -> None:
        """Post ``event`` without blocking; ``wait``: until the actor holds it (at most ``timeout_s``).

        Raises:
            ray.exceptions.RayActorError: with ``wait``, the actor is gone (its driver ended).
            ray.exceptions.GetTimeoutError: with ``wait``, not held within ``timeout_s``.
        """
        sent = self.actor.post.remote(event)
        if wait:
            import ray

            ray.get(sent, timeout=timeout_s)

    def take(self) -> list:
        """Every event posted and not taken yet, oldest first (one call to the actor).

        Raises:
            ray.exceptions.RayActorError: the actor is gone.
        """
        import ray

        return ray.get(self.actor.take.remote())

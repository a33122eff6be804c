"""How a run's Ray Train ``TorchTrainer`` ends: two waits of its controller shortened.

When the workers' train function returns, ``fit()`` returned ~2.0 s later on the 2-core development
machine, where ~0.25 s is Ray Train's own work (a one-worker run, bench/NOTES.md §42). The rest is two
waits of Ray Train's controller:

* **Its poll.** The controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (default
  2 s) and takes one queued ``ray.train.report`` per worker per poll; a worker with a report still
  queued counts as running. So the run's end is seen only at the first poll after both the return and
  the last checkpoint's report have been taken: up to two intervals when the export after that report
  is short (a small model), up to one when it is long. :func:`set_poll_interval` makes it 0.5 s unless
  the user set it. Each poll is one short actor call per worker; one that does not answer in time
  counts as running (Ray Train marks a worker dead only after ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``,
  10 minutes), and the test suite has run at 0.2 s since 2026-12-02.
* **Its placement-group cleaner.** Ray Train starts a detached ``PlacementGroupCleaner`` actor per run,
  which removes the run's placement group if the controller dies without doing so. At the end the
  controller stops it and waits for its thread, which looks at a queue with a 1 s timeout and then
  asks Ray's state API whether the controller lives: up to ~1 s more. On an embedded Ray the cluster
  lives only as long as the driver, which stops it at exit, so nothing can outlive the controller
  there: :func:`trainer_class` leaves the cleaner out. That also takes a wait out of the workers'
  start: once the worker group is up, the callback registers its placement group with the cleaner
  (``ray.get``) before the train function is launched, so the cleaner actor's process start and
  imports lay on that path (the workers' start −2.0 s in a 2-core quickstart, §42). On a cluster Ray
  Train's default is kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from rayft.train.ray_cluster import EMBEDDED

#: Ray Train's controller reads its worker-poll interval (seconds) from this variable, which it copies
#: from the driver's environment to its own (``ray.train.v2._internal.constants.ENV_VARS_TO_PROPAGATE``)
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
#: rayft's default for it (Ray Train's: 2.0)
POLL_INTERVAL_S = "0.5"


def set_poll_interval() -> Callable[[], None]:
    """Set :data:`POLL_INTERVAL_ENV` in this process's environment to :data:`POLL_INTERVAL_S` unless it
    is set already (a user's value wins). Call before ``fit()``, which copies it to the controller as
    it starts it. Returns what puts the environment back as it was (for a process that goes on to use
    Ray Train itself after the run)."""
    if POLL_INTERVAL_ENV in os.environ:
        return lambda: None
    os.environ[POLL_INTERVAL_ENV] = POLL_INTERVAL_S
    return lambda: os.environ.pop(POLL_INTERVAL_ENV, None)


def trainer_class(embedded: bool) -> type:
    """The ``TorchTrainer`` class for a run: on an embedded Ray (``embedded``), a subclass whose
    default callbacks leave out Ray Train's ``PlacementGroupCleanerCallback``; else ``TorchTrainer``.

    Both names are Ray Train's private ones: where this Ray has no such callback class, or no
    ``_create_default_callbacks`` to override, ``TorchTrainer`` is returned or the override is never
    called, and the run ends as Ray Train ends it (tests/unit/test_ray_trainer.py fails on such a Ray)."""
    from ray.train.torch import TorchTrainer

    if not embedded:
        return TorchTrainer
    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:  # a Ray without it: nothing to leave out
        return TorchTrainer

    class EmbeddedRayTorchTrainer(TorchTrainer):
        """``TorchTrainer`` without the placement-group cleaner (see :mod:`rayft.train.ray_trainer`)."""

        def _create_default_callbacks(self):
            return [c for c in super()._create_default_callbacks() if not isinstance(c, PlacementGroupCleanerCallback)]

    return EmbeddedRayTorchTrainer


def make_trainer(where: str, cleanup: contextlib.ExitStack, train_func: Callable, **kwargs: Any):
    """The run's trainer: :func:`trainer_class` for ``where`` (what :func:`rayft.train.ray_cluster.connect_ray`
    returned: :data:`~rayft.train.ray_cluster.EMBEDDED` for an embedded Ray) built with ``train_func`` and
    ``kwargs`` (``TorchTrainer``'s), after :func:`set_poll_interval`, whose undoing ``cleanup`` runs."""
    cleanup.callback(set_poll_interval())
    return trainer_class(embedded=where == EMBEDDED)(train_func, **kwargs)

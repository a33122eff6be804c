"""The run's workers started from inside the driver's data phase: Ray, the checks before any worker,
the run's actor and Ray Train's ``fit`` on a thread of its own.

The driver's data phase runs from the run's start, beside the embedded Ray's start
(:mod:`rayft.train.ray_start`). Where it tokenizes its inputs on this node (a store miss without Ray
Data), it calls :meth:`WorkerLaunch.before_ingest` as soon as it knows, and the workers start there:
Ray Train's controller, their processes, imports and process group (12.6 s of a warm 1.5B run on one
H200, bench/NOTES.md §39) run while the inputs are tokenized. Each worker imports the loop, then
waits for its arguments (:class:`~rayft.train.worker_args.PendingArgs`), which hold the data's
references, and touches no GPU until then (:mod:`rayft.train.torch_config`). Everywhere else the
workers start after the data phase (:meth:`WorkerLaunch.start`):

* on a store hit there is nothing to tokenize: the rest of the data phase is short, and its errors
  come before any worker starts;
* a Ray Data ingest needs the CPUs the workers' placement group would hold;
* where the Ray outlives the run (``connect_ray`` says ``existing``: a notebook's, a test session's),
  a run that fails before training would leave its Ray Train run holding that cluster's resources.

Ray Train's idiom passes everything in ``train_loop_config`` at ``fit()``; the run's actor carries
the arguments instead so that the data phase need not come first.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rayft.config import RayftConfig
from rayft.train.errors import TrainError
from rayft.train.ray_cluster import (
    EMBEDDED,
    EXISTING,
    check_gpu_memory,
    check_worker_environment,
    choose_single_worker,
    connect_ray,
    resolve_workers,
    shared_store_root,
    worker_env_vars,
)
from rayft.train.ray_start import EmbeddedRayStart, start_autoscaling_coordinator
from rayft.train.ray_trainer import make_trainer
from rayft.train.run_actor import create_run_actor
from rayft.train.stop import SignalStop, StopRequestWatch

#: the name of the thread that runs Ray Train's ``fit`` (:meth:`WorkerLaunch.start`)
FIT_THREAD = "rayft-fit"


def process_group_backend(cfg: RayftConfig, use_gpu: bool) -> str:
    """torch.distributed's backend for the run: ``parallel.backend``, or with ``auto`` NCCL for GPU
    workers and gloo for CPU ones; with ``parallel.cpu_offload`` on GPUs, ``cpu:gloo,cuda:nccl``."""
    backend = cfg.parallel.backend if cfg.parallel.backend != "auto" else ("nccl" if use_gpu else "gloo")
    if backend == "nccl" and cfg.parallel.cpu_offload:
        # offloaded shards are CPU tensors: their collectives (the gradient norm's all-reduce) go through gloo
        backend = "cpu:gloo,cuda:nccl"
    return backend


class WorkerLaunch:
    """One run's way to its workers (see the module), in three idempotent steps the driver's thread
    takes in order, from the data phase's hook or after it: :meth:`connect` (Ray), :meth:`ready`
    (the checks before any worker, the run's actor, the stop watch), :meth:`start` (``fit`` on a
    thread). ``marks`` (unix s) gets ``ray_wait`` and ``ray_ready`` (the wait for Ray),
    ``checks_start`` and ``fit_called``; ``outcome`` gets ``result`` or ``error`` when ``fit`` ends.

    Attributes after :meth:`ready`: ``where`` (connect_ray's answer), ``n_workers``, ``use_gpu``,
    ``backend``, ``run_actor``; after :meth:`start`: ``thread``; after :meth:`cancel`: ``abandoned``
    (``fit``'s thread outlived the wait for it).
    """

    def __init__(
        self,
        cfg: RayftConfig,
        console: Console,
        name: str,
        run_dir: str,
        resume: str | None,
        signals: SignalStop,
        run_id: str,
        cleanup: contextlib.ExitStack,
        ray_start: EmbeddedRayStart | None,
        marks: dict[str, float],
    ):
        self.cfg, self.console, self.name, self.run_dir, self.resume = cfg, console, name, run_dir, resume
        self.signals, self.run_id, self.cleanup, self.ray_start, self.marks = signals, run_id, cleanup, ray_start, marks
        self.where: str | None = None
        self.run_actor = None
        self.thread: threading.Thread | None = None
        self.outcome: dict[str, Any] = {}
        self.watch: StopRequestWatch | None = None
        self.abandoned = False

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def connect(self) -> str:
        """Wait for the embedded Ray's start, or join the configured cluster; returns where."""
        if self.where is None:
            self.marks["ray_wait"] = time.time()
            self.where = self.ray_start.wait() if self.ray_start is not None else connect_ray(self.cfg)
            self.signals.install()  # ray.init replaces our SIGTERM handler: put it back
            self.marks["ray_ready"] = time.time()  # with an embedded Ray: what was left of its start
        return self.where

    def locate(self, root: str) -> str:
        """The token store's root on storage every node reads (the data phase's ``locate``)."""
        if self.ray_start is not None:  # an embedded Ray: one node, which sees the store where it is
            return root
        return shared_store_root(self.cfg, root, self.run_dir, self.connect, say=self.say)

    def ready(self) -> None:
        """Ray, then the checks made before any worker (the workers' resources and environment, the
        GPU memory plan), then the run's actor, and the stop watch on it until :meth:`close`.

        Raises:
            TrainError: impossible resources, a config the workers' GPUs cannot hold.
        """
        if self.run_actor is not None:
            return
        import ray

        where = self.connect()
        self.marks["checks_start"] = time.time()
        embedded = where == EMBEDDED  # Ray started by this process, stopped at its exit
        if embedded:
            start_autoscaling_coordinator()  # what Ray Train's controller waits for first, started while it starts
        cfg = self.cfg
        self.n_workers, self.use_gpu = resolve_workers(cfg)
        check_worker_environment(cfg, self.use_gpu)
        if self.use_gpu:
            choose_single_worker(cfg, self.n_workers, embedded=embedded, say=self.say)
        if self.use_gpu and self.resume is None and cfg.train.fit_check != "off":  # a resumed run was judged when it started
            check_gpu_memory(cfg, self.n_workers, embedded=embedded, say=self.say)
        self.backend = process_group_backend(cfg, self.use_gpu)
        # the run's one actor: rank 0's progress mailbox, the stop flag and the workers' arguments (rayft.train.run_actor)
        self.run_actor = create_run_actor(f"{self.name}-{self.run_id}")
        self.cleanup.callback(ray.kill, self.run_actor)  # it lives as long as the run (`rayft stop --wait` waits for that)
        self.watch = StopRequestWatch(self.run_actor, self.signals).__enter__()

    def before_ingest(self, uses_ray_data: bool) -> None:
        """The data phase's hook (:func:`rayft.data.prepare.prepare_data`): it is about to tokenize,
        through Ray Data or not. Starts the workers where they may run beside it (see the module)."""
        if not uses_ray_data and self.connect() != EXISTING:
            self.ready()
            self.start()

    def check_started(self) -> None:
        """Raises, once ``fit`` has returned before the workers got their arguments: they failed at
        their start (their process group, an import, their node: :func:`workers_failed`), or Ray
        Train's run did before them (its controller: the run's storage, say).

        Raises:
            TrainError: naming which, with Ray Train's error.
        """
        if self.thread is not None and not self.thread.is_alive():
            error = self.outcome.get("error", "fit returned before the workers had their arguments")
            who = "the workers failed at their start" if workers_failed(error) else "Ray Train's run failed before training"
            raise TrainError(f"{who}, while the data were tokenized: {error}")

    def start(self) -> threading.Thread:
        """Start Ray Train's ``TorchTrainer.fit()`` on a thread of its own (once) and return it.

        Every module ``fit`` uses is imported here, on the calling thread, before the thread starts:
        the caller may go on importing and tokenizing meanwhile, and a module imported from two
        threads at once failed a run (bench/NOTES.md §31); tests/integration/test_workers_beside_data.py
        checks that the thread imports nothing."""
        if self.thread is not None:
            return self.thread
        self.ready()
        import ray.train
        from ray.data import DataContext
        from ray.train.torch import TorchTrainer  # noqa: F401 -- see above

        from rayft.train.events import ProgressChannel
        from rayft.train.run_actor import ActorMailbox
        from rayft.train.torch_config import DeviceDeferredTorchConfig
        from rayft.train.worker_args import LOOP_CONFIG_KEY, PendingArgs
        from rayft.train.worker_entry import train_func
        from rayft.train.worker_loss import WorkerLossReport

        DataContext.get_current()  # its first use imports Ray Data's issue detectors: fit() copies it for the workers (Ray 2.60)
        cfg = self.cfg
        # TorchTrainer, whose end is seen sooner: the controller's poll, and (embedded) no placement-group cleaner to stop
        trainer = make_trainer(
            self.where,
            self.cleanup,
            train_func,
            train_loop_config={LOOP_CONFIG_KEY: PendingArgs(self.run_actor)},
            scaling_config=ray.train.ScalingConfig(
                num_workers=self.n_workers, use_gpu=self.use_gpu, resources_per_worker={"CPU": cfg.train.cpus_per_worker}
            ),
            run_config=ray.train.RunConfig(
                name=self.name,
                storage_path=cfg.checkpoint.storage_path
                if "://" in cfg.checkpoint.storage_path
                else str(Path(cfg.checkpoint.storage_path).resolve()),
                failure_config=ray.train.FailureConfig(max_failures=cfg.ray.max_failures),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
                worker_runtime_env={"env_vars": worker_env_vars(cfg, self.run_dir, self.use_gpu)},
                # a worker lost without its own report (SIGKILL, the OOM killer, its node): Ray Train's controller says it
                callbacks=[WorkerLossReport(ProgressChannel(ActorMailbox(self.run_actor)))],
            ),
            torch_config=DeviceDeferredTorchConfig(backend=self.backend),  # no CUDA context before the arguments
        )

        def fit() -> None:
            try:
                self.outcome["result"] = trainer.fit()
            except Exception as e:  # surfaced on the driver after the progress loop
                self.outcome["error"] = e

        self.thread = threading.Thread(target=fit, daemon=True, name=FIT_THREAD)
        self.marks["fit_called"] = time.time()
        self.thread.start()
        return self.thread

    def close(self) -> None:
        """End the stop watch: from here the driver's progress loop reads stop requests."""
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
            self.watch = None

    def cancel(self, e: BaseException) -> None:
        """The driver stops before training (``e``): workers already started are called off and
        return without training, and this waits for ``fit`` to return, up to
        ``checkpoint.signal_grace_s`` from the first signal (or from now, without one). From here a
        signal only records itself (``signals.calling_off``); a second one ends the wait. Sets
        ``abandoned`` when ``fit``'s thread outlives the wait.

        Why wait: ``fit``'s thread blocks in a ``ray.get`` on Ray Train's controller. Were Ray shut
        down under it (at the process's exit), that ``ray.get`` would return into a core worker that
        is gone, and Ray's C++ core worker ends the process with status 1 (a SIGTERM's 143 lost; CI
        caught it, 2026-12-05). Where the wait runs out, the CLI exits without Ray's shutdown at exit
        (:func:`fit_running`), as after a forced stop during training."""
        self.signals.calling_off = True
        if self.thread is not None:  # called off first: the stop watch's end may take a poll
            self.run_actor.cancel.remote(f"the driver stopped before training ({type(e).__name__}: {e})")
        self.close()
        if self.thread is None:
            return
        start = time.monotonic()
        deadline = min(start, self.signals.first_at or start) + self.cfg.checkpoint.signal_grace_s
        while self.thread.is_alive() and not self.signals.forced and time.monotonic() < deadline:
            self.signals.poll()  # its notes (no stop to pass on before training)
            self.thread.join(0.1)
        self.signals.poll()
        self.abandoned = self.thread.is_alive()
        if self.abandoned:
            self.say("the workers did not return in time: exiting without waiting for them")


def workers_failed(error: object) -> bool:
    """Whether Ray Train's error from ``fit`` is its workers' own: a ``WorkerGroupError`` (their
    train function), or a ``ControllerError`` around a call into a worker that failed: Ray Train's
    controller sets up the workers' process group through their actors (Ray 2.60), so a worker's
    failure there (a ``RayTaskError``, a dead actor) reaches ``fit`` as the controller's."""
    import ray.exceptions
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(error, WorkerGroupError):
        return True
    cause = error.controller_failure if isinstance(error, ControllerError) else None
    return isinstance(cause, (ray.exceptions.RayTaskError, ray.exceptions.RayActorError))


def fit_running() -> bool:
    """Whether a run's ``fit`` thread (:meth:`WorkerLaunch.start`) is still alive in this process:
    then the process must end without Ray's shutdown at exit (``os._exit``), which would end it with
    status 1 under that thread (see :meth:`WorkerLaunch.cancel`)."""
    return any(t.name == FIT_THREAD and t.is_alive() for t in threading.enumerate())


class WorkersStartWatch:
    """The data phase's progress reports (:class:`rayft.data.prepare.Progress`: every 256 records
    of a local tokenization, and each task's end) while the workers start beside it
    (:meth:`WorkerLaunch.before_ingest`): each looks whether they have failed already
    (:meth:`WorkerLaunch.check_started`, a thread's liveness) and raises their error at once,
    instead of after the whole tokenization, minutes of it on a large corpus."""

    def __init__(self, launch: WorkerLaunch):
        self.launch = launch

    def start(self, total_bytes: int) -> None:
        self.launch.check_started()

    def advance(self, nbytes: int, records: int, tokens: int) -> None:
        self.launch.check_started()

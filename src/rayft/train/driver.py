"""The driver: one run from start to end — Ray, the workers' start and beside it the data, progress, records.

The steps live in their own modules: the data (:mod:`rayft.data.prepare`), reaching Ray and
checking its resources (:mod:`rayft.train.ray_cluster`), the run directory
(:mod:`rayft.train.run_dir`), the live display (:mod:`rayft.train.progress`) and the summary
(:mod:`rayft.train.summary`). Data problems surface before any worker trains or touches a GPU
(the workers start beside the data phase and wait for it: :func:`train_run`). The
tokenized data stay in the token store (:mod:`rayft.data.token_store`), on storage every node
reads; the workers receive small views of it (:class:`rayft.data.token_view.StoreView`) through
the Ray object store and read only their examples' shards.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rayft.config import RayftConfig
from rayft.data.examples import DataError
from rayft.data.prepare import PreparedData, open_tokenizer, prepare_data
from rayft.tracking import Trackers
from rayft.train.errors import TrainError, TrainStopped
from rayft.train.progress import show_progress
from rayft.train.ray_cluster import (
    EMBEDDED,
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
from rayft.train.run_actor import ActorMailbox, create_run_actor
from rayft.train.run_dir import (
    MetricsLog,
    check_resume_data,
    check_resume_steps,
    copy_skipped_records,
    newest_checkpoint_step,
    newest_remote_state,
    prepare_run_dir,
    resolve_run,
    write_metrics,
    write_run_records,
)
from rayft.train.run_lock import RunLock
from rayft.train.stop import EXIT_CODES, SignalStop
from rayft.train.summary import build_summary, stop_record, wall_timeline
from rayft.train.transport_check import TransportCheck

__all__ = ["TrainError", "TrainStopped", "load_run_data", "run_training"]

#: seconds a run that ends before its embedded Ray has started waits for that start to end (so that
#: Ray's shutdown at exit stops all of it); past them the process ends without waiting, and Ray's
#: processes end with it (rayft.train.ray_start). A start takes ~4 s; Ray's own retry can take 60.
SETTLE_S = 10.0


def load_run_data(
    cfg: RayftConfig,
    console: Console,
    tokenizer=None,
    connect=None,
    run_dir: str | None = None,
    locate=None,
    timings: dict[str, float] | None = None,
    before_ingest=None,
) -> PreparedData:
    """The run's data (:func:`rayft.data.prepare.prepare_data`) with the model's tokenizer, which
    is loaded here unless given (``tokenizer``: the one :func:`default_tokenizer` names).
    ``run_dir``: the run directory (the store's root with ``data.cache_dir: null``); ``locate`` and
    ``before_ingest``: see :func:`~rayft.data.prepare.prepare_data` (the driver's cluster-storage
    check; where it starts its workers).
    ``timings`` gets the wall seconds of the parts: ``imports`` (the model-config helpers, with
    transformers), ``tokenizer`` (its load), ``store`` (the token store: its key, then opened or built).

    Raises:
        TrainError: the data layer's :class:`DataError`, with its message.
    """
    timings = {} if timings is None else timings
    t = time.perf_counter()
    from rayft.train.model_config import default_tokenizer, load_model_config

    name = default_tokenizer(cfg.model)
    timings["imports"] = time.perf_counter() - t
    try:
        t = time.perf_counter()
        if tokenizer is None:
            tokenizer = open_tokenizer(name, cfg.model.revision, cfg.model.trust_remote_code)
        timings["tokenizer"] = time.perf_counter() - t
        t = time.perf_counter()
        vocab = load_model_config(cfg.model).vocab_size if cfg.data.synthetic is not None else None
        data = prepare_data(
            cfg,
            console,
            tokenizer,
            name,
            vocab_size=vocab,
            connect=connect or (lambda: connect_ray(cfg)),
            run_dir=run_dir,
            locate=locate,
            before_ingest=before_ingest,
        )
        timings["store"] = time.perf_counter() - t
        return data
    except DataError as e:
        raise TrainError(str(e)) from None


def packing_line(plan, ds, seq_len: int) -> str:
    """The report line of a packed plan (:class:`~rayft.data.packing.StepPlan`): rows, steps,
    epochs and packing efficiency."""
    return (
        f"packing: {plan.n_rows:,} rows of {seq_len} tokens over {len(plan)} steps ({plan.epochs(len(ds)):.2f} epochs of the data), "
        f"efficiency {100 * plan.packing_efficiency(ds, seq_len):.1f}% (non-padding / row tokens)"
    )


def run_training(cfg: RayftConfig, resume: str | None = None, console: Console | None = None) -> dict:
    """Run the whole job and return the final summary (metrics of the last step, export check).

    The run directory is locked for the run (:mod:`rayft.train.run_lock`); SIGTERM and SIGINT stop
    it gracefully (:mod:`rayft.train.stop`).

    Raises:
        TrainError: bad data, impossible resources, a run directory in use, or a failed run (with
            the worker's error).
        TrainStopped: a signal stopped the run (after its checkpoint and records were written).
    """
    console = console or Console(stderr=True, soft_wrap=True)
    name, run_dir = resolve_run(cfg, resume)

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    from rayft.train.hub import offline_when_unreachable

    # one line, not the hub client's retries; before Ray starts: its processes copy HF_HUB_OFFLINE from this one
    offline_when_unreachable([cfg.model.name_or_path, cfg.model.tokenizer], say)
    signals = SignalStop(cfg.checkpoint.signal_grace_s, say=say)
    try:
        with signals, RunLock(run_dir, say=say) as lock, contextlib.ExitStack() as cleanup:
            # An embedded Ray starts now, beside the imports and the data (rayft.train.ray_start; None: a
            # cluster's is joined later). Begun inside `signals`: its thread puts back their handlers once Ray's
            # core worker replaced them; settled before they are undone.
            ray_start = EmbeddedRayStart.begin(cfg)
            try:
                return train_run(cfg, resume, console, name, run_dir, signals, lock, cleanup, ray_start)
            except KeyboardInterrupt as interrupt:
                if (e := signals.stop_before_training(interrupt)) is None:
                    raise
                local = "://" not in run_dir
                held = newest_checkpoint_step(run_dir) if local else None  # a --resume run keeps its resume point
                if local and not resume and Path(run_dir, "rayft.yaml").exists():  # a new run whose directory was prepared
                    stop = stop_record(signals.name, None, [], held, forced=False)
                    write_run_records(run_dir, [], {"run_dir": run_dir, "steps": 0, "stopped": stop}, resumed=False)
                raise TrainStopped(signals.name, EXIT_CODES[e.signum], run_dir, held, before_training=True) from None
            finally:
                if ray_start is not None:
                    ray_start.settle(SETTLE_S)
    except KeyboardInterrupt as interrupt:  # in the moment before the lock was held
        if (e := signals.stop_before_training(interrupt)) is None:
            raise
        held = newest_checkpoint_step(run_dir) if "://" not in run_dir else None
        raise TrainStopped(signals.name, EXIT_CODES[e.signum], run_dir, held, before_training=True) from None


def process_group_backend(cfg: RayftConfig, use_gpu: bool) -> str:
    """torch.distributed's backend for the run: ``parallel.backend``, or with ``auto`` NCCL for GPU
    workers and gloo for CPU ones; with ``parallel.cpu_offload`` on GPUs, ``cpu:gloo,cuda:nccl``."""
    backend = cfg.parallel.backend if cfg.parallel.backend != "auto" else ("nccl" if use_gpu else "gloo")
    if backend == "nccl" and cfg.parallel.cpu_offload:
        # offloaded shards are CPU tensors: their collectives (the gradient norm's all-reduce) go through gloo
        backend = "cpu:gloo,cuda:nccl"
    return backend


def start_workers(
    cfg: RayftConfig,
    name: str,
    run_dir: str,
    where: str,
    n_workers: int,
    use_gpu: bool,
    backend: str,
    pending,
    cleanup: contextlib.ExitStack,
    outcome: dict[str, Any],
    marks: dict[str, float],
) -> threading.Thread:
    """Start the run's Ray Train ``TorchTrainer.fit()`` on a thread of its own and return the thread;
    ``outcome`` gets ``result`` (what ``fit`` returned) or ``error`` (what it raised) when it ends.
    ``backend``: the process group's (:func:`process_group_backend`); ``pending``: the workers'
    :class:`~rayft.train.worker_args.PendingArgs`; ``marks`` gets ``fit_called`` (unix s).

    Every module ``fit`` uses is imported here, on the calling thread, before the thread starts: the
    caller goes on importing and tokenizing the data meanwhile, and a module imported from two
    threads at once failed a run (bench/NOTES.md §31); tests/integration/test_workers_beside_data.py
    checks that the thread imports nothing."""
    import ray.train
    from ray.data import DataContext
    from ray.train.torch import TorchTrainer  # noqa: F401 -- see above

    DataContext.get_current()  # its first use imports Ray Data's issue detectors: fit() copies it for the workers (Ray 2.60)

    from rayft.train.torch_config import DeviceDeferredTorchConfig
    from rayft.train.worker_args import LOOP_CONFIG_KEY
    from rayft.train.worker_entry import train_func

    # TorchTrainer, whose end is seen sooner: the controller's poll, and (embedded) no placement-group cleaner to stop
    trainer = make_trainer(
        where,
        cleanup,
        train_func,
        train_loop_config={LOOP_CONFIG_KEY: pending},
        scaling_config=ray.train.ScalingConfig(
            num_workers=n_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cfg.train.cpus_per_worker}
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=cfg.checkpoint.storage_path
            if "://" in cfg.checkpoint.storage_path
            else str(Path(cfg.checkpoint.storage_path).resolve()),
            failure_config=ray.train.FailureConfig(max_failures=cfg.ray.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            worker_runtime_env={"env_vars": worker_env_vars(cfg, run_dir, use_gpu)},
        ),
        torch_config=DeviceDeferredTorchConfig(backend=backend),  # no CUDA context before the arguments (rayft.train.torch_config)
    )

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except Exception as e:  # surfaced on the driver after the progress loop
            outcome["error"] = e

    th = threading.Thread(target=fit, daemon=True, name="rayft-fit")
    marks["fit_called"] = time.time()
    th.start()
    return th


def ready_worker_args(
    cfg: RayftConfig,
    resume: str | None,
    console: Console,
    run_dir: str,
    where: str,
    n_workers: int,
    run_actor,
    marks: dict[str, float],
    before_ingest=None,
):
    """The data phase and every check that needs the data, while the workers start: the data read
    and tokenized (or the token store opened), the step plan, the run directory prepared, the resume
    checks. Returns ``(args, total_steps, resumed_state, data_timings)``: the workers'
    :class:`~rayft.train.worker_args.WorkerArgs`, the run's step count, the resumed checkpoint's
    state (None: a new run) and the data phase's parts (seconds: ``imports``, ``tokenizer``,
    ``store``, their ``total``, then ``plan_and_checks``: the step plan, the run directory, the
    workers' arguments). ``marks`` gets ``data_start``, ``data_ready`` and ``args_ready`` (unix s).
    ``before_ingest``: :func:`~rayft.data.prepare.prepare_data`'s.

    Raises:
        TrainError: bad data, a config the data cannot satisfy (warm-up or profiled steps past the
            run's end), a run directory that holds another run, a resume of other data.
    """
    import ray

    from rayft.train.events import ProgressChannel
    from rayft.train.step_plan import make_plan
    from rayft.train.worker_args import WorkerArgs

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    def locate(root: str) -> str:  # the token store on a multi-node cluster: storage every node reads
        if where == EMBEDDED:  # one node, which sees the store where it is
            return root
        return shared_store_root(cfg, root, run_dir, lambda: None, say=say)

    data_timings: dict[str, float] = {}  # the data phase's parts, in the summary (data_timings_s)
    marks["data_start"] = time.time()
    data = load_run_data(
        cfg, console, connect=lambda: None, run_dir=run_dir, locate=locate, timings=data_timings, before_ingest=before_ingest
    )
    marks["data_ready"] = time.time()
    data_timings["total"] = marks["data_ready"] - marks["data_start"]
    ds = data.train
    plan = make_plan(cfg, ds, n_workers)
    total = len(plan)
    if cfg.data.packing:
        console.print(packing_line(plan, ds, cfg.data.seq_len), highlight=False)
    if cfg.train.warmup_steps >= total:
        raise TrainError(f"train.warmup_steps={cfg.train.warmup_steps} but the run has only {total} steps: the LR never reaches train.lr")
    if cfg.train.profile_steps and cfg.train.profile_steps[1] > total:
        raise TrainError(
            f"train.profile_steps={list(cfg.train.profile_steps)} but the run has only {total} steps: nothing would be written"
        )
    local = "://" not in run_dir
    resume_from = prepare_run_dir(run_dir, resume, cfg, console) if local else None
    data_fingerprint = data.fingerprint  # of the selection (store key, part, example ids): no token read
    if local and data.skipped_file:
        copy_skipped_records(data.skipped_file, run_dir)
    from rayft.train.checkpoint_files import read_state

    resumed_state = read_state(resume_from) if resume_from is not None else None  # read once: checked here, its step below
    if resume_from is not None:
        check_resume_data(resume_from, data_fingerprint, resumed_state)
        check_resume_steps(resume_from, total, resumed_state)
    elif resume and not local and (remote := newest_remote_state(run_dir)) is not None:  # what Ray Train will hand the workers
        checkpoint_uri, state = remote
        check_resume_data(checkpoint_uri, data_fingerprint, state)
        check_resume_steps(checkpoint_uri, total, state)
    args = WorkerArgs(
        config=cfg.model_dump(mode="json"),
        # Ray Train's idiom is a Ray Data dataset per worker (get_dataset_shard), a stream; but the step
        # plan packs examples across the whole set, so each worker needs random access to its rows:
        # a small view of the store (ids and lengths, no token), put once, read by every worker
        dataset=ray.put(ds),
        validation=ray.put(data.validation) if data.validation is not None else None,
        # The plan is put, not recomputed by each worker: it is planned once here (linear, but seconds
        # at 10M examples) instead of at every worker's start and restart. Ray Train's idiom for data
        # is a Ray Dataset streamed in shards, but every worker needs the whole plan, a few flat numpy
        # arrays: one object-store copy per node, read zero-copy. A worker-group restart gets the same
        # ref (the same world size); a --resume plans afresh for its own world size.
        plan=ray.put(plan),
        pad_id=data.tokenizer.pad_token_id,
        data_fingerprint=data_fingerprint,
        tokenizer=data.tokenizer_name,
        run_dir=run_dir,
        progress=ProgressChannel(ActorMailbox(run_actor)),
        resume_from=resume_from,
        stop_flag=run_actor,
    )
    marks["args_ready"] = time.time()
    data_timings["plan_and_checks"] = marks["args_ready"] - marks["data_ready"]
    return args, total, resumed_state, data_timings


def workers_and_data(
    cfg: RayftConfig,
    resume: str | None,
    console: Console,
    name: str,
    run_dir: str,
    where: str,
    n_workers: int,
    use_gpu: bool,
    run_actor,
    signals: SignalStop,
    cleanup: contextlib.ExitStack,
    marks: dict[str, float],
    outcome: dict[str, Any],
):
    """Ready the workers' arguments (:func:`ready_worker_args`) and start the workers
    (:func:`start_workers`): beside the data phase where it tokenizes the inputs on this node, as soon
    as it knows it will (``before_ingest``: the tokenizer loaded, the inputs listed, the store
    missed), else after it:

    * on a store hit there is nothing to tokenize: the rest of the data phase (the examples' views,
      the step plan, the checks) is short, and its errors come before any worker starts;
    * a Ray Data ingest needs the CPUs the workers' placement group would hold;
    * where the Ray outlives the run (``where`` is ``existing``: one this process had initialised, a
      notebook's, a test session's), a run that fails before training would leave its Ray Train run
      holding that cluster's resources while its workers start, then return (~12 s on 2 cores).

    Returns ``(fit thread, backend, ready_worker_args's tuple)``; ``marks`` gets ``fit_called``.
    While the data phase runs, a stop asked through the run's actor stops the driver
    (:class:`~rayft.train.stop.StopRequestWatch`). When anything fails after the workers started,
    they are called off (they return without training) and the error is raised; the driver's exit
    then ends its Ray job.

    Raises:
        TrainError: as :func:`ready_worker_args`.
        StopBeforeTraining: a signal or a stop request.
    """
    from rayft.train.stop import StopRequestWatch
    from rayft.train.worker_args import PendingArgs

    backend = process_group_backend(cfg, use_gpu)
    started: list[threading.Thread] = []

    def start() -> None:
        pending = PendingArgs(run_actor)
        started.append(start_workers(cfg, name, run_dir, where, n_workers, use_gpu, backend, pending, cleanup, outcome, marks))

    def before_ingest(uses_ray_data: bool) -> None:
        if not uses_ray_data and where != "existing":
            start()

    try:
        with StopRequestWatch(run_actor, signals):
            ready = ready_worker_args(cfg, resume, console, run_dir, where, n_workers, run_actor, marks, before_ingest)
        if not started:
            start()
    except BaseException as e:  # a data error, a check, a signal, a stop: the waiting workers return without training
        if started:
            run_actor.cancel.remote(f"the driver stopped before training ({type(e).__name__}: {e})")
        raise
    return started[0], backend, ready


def train_run(
    cfg: RayftConfig,
    resume: str | None,
    console: Console,
    name: str,
    run_dir: str,
    signals: SignalStop,
    lock: RunLock,
    cleanup: contextlib.ExitStack,
    ray_start: EmbeddedRayStart | None = None,
) -> dict:
    """:func:`run_training` inside its lock and signal handling: Ray, checks, the workers' start and,
    beside it, the data. ``cleanup`` runs when the run ends, however it ends. ``ray_start``: the
    embedded Ray's start under way, waited for here (else :func:`connect_ray` connects here).

    The workers start (Ray Train's controller, their processes, imports and process group: 12.6 s
    of a warm 1.5B run on one H200, bench/NOTES.md §39) while this thread reads, tokenizes and
    checks the data; they wait for their arguments, which hold the data's references, and touch no
    GPU until then (:mod:`rayft.train.worker_entry`). A data error calls them off: it is raised here
    as before, with no CUDA context made on any GPU. Ray Train's idiom passes everything in
    ``train_loop_config`` at ``fit()``; the run's actor carries the arguments instead so that the
    data phase need not come first. Only a data phase that tokenizes on this node runs beside the
    workers' start; on a store hit, a Ray Data ingest, or where the Ray outlives the run, the data
    come first, as before (:func:`workers_and_data`)."""
    marks = {"start": time.time()}  # wall clock (unix s) of the run's phases, for the summary's wall_s
    import ray
    import ray.train

    import rayft.data.tokenizer  # noqa: F401 -- the data phase's imports (transformers, torch), made while Ray starts: see start_workers

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    where = ray_start.wait() if ray_start is not None else connect_ray(cfg)
    signals.install()  # ray.init replaces our SIGTERM handler: put it back
    embedded = where == EMBEDDED  # Ray started by this process, stopped at its exit
    marks["ray_ready"] = time.time()  # with an embedded Ray: what was left of its start after the imports
    if embedded:
        start_autoscaling_coordinator()  # what Ray Train's controller waits for first, started while it starts
    n_workers, use_gpu = resolve_workers(cfg)
    check_worker_environment(cfg, use_gpu)
    if use_gpu:
        choose_single_worker(cfg, n_workers, embedded=embedded, say=say)
    if use_gpu and resume is None and cfg.train.fit_check != "off":  # a resumed run was judged when it started
        check_gpu_memory(cfg, n_workers, embedded=embedded, say=say)
    # the run's one actor: rank 0's progress mailbox, the stop flag and the workers' arguments (rayft.train.run_actor)
    run_actor = create_run_actor(f"{name}-{lock.holder.run_id}")
    cleanup.callback(ray.kill, run_actor)  # it lives as long as the run (`rayft stop --wait` waits for that)
    outcome: dict[str, Any] = {}
    th, backend, ready = workers_and_data(
        cfg, resume, console, name, run_dir, where, n_workers, use_gpu, run_actor, signals, cleanup, marks, outcome
    )
    args, total, resumed_state, data_timings = ready
    say(f"ray: {where}; {n_workers} {'GPU' if use_gpu else 'CPU'} worker(s), backend {backend}; {total} steps; run {run_dir}")
    progress = args.progress
    # the Ray job recorded for `rayft doctor --run`; after a finished run, ray.verify_transport judged (after the summary)
    cleanup.enter_context(TransportCheck(cfg, run_dir, say=say))
    resumed_step = int(resumed_state["step"]) if resumed_state is not None else None
    local = "://" not in run_dir
    metrics_log = MetricsLog(run_dir, resumed_step) if local else None  # lines appended as they arrive: they survive any stop
    # TensorBoard / MLflow / W&B (tracking:): fed from the driver only; closed with the run's outcome
    trackers = cleanup.enter_context(Trackers.open(cfg, run_dir, name, say=say))
    signals.on_stop = lambda reason: run_actor.request.remote(reason)
    signals.training_started()
    run_actor.give_args.remote(args)  # the workers go on from here

    def watch_lock() -> None:  # a lease another run took over (see run_lock): stop writing into its directory
        if lock.lost and not signals.signum and not lost_sent:
            lost_sent.append(True)
            run_actor.request.remote(lock.lost)

    lost_sent: list[bool] = []

    def on_step(record: dict) -> None:
        if metrics_log:
            metrics_log.append(record)
        trackers.log_step(record)

    reported = show_progress(th, progress, total, console, signals, on_step=on_step, tick=watch_lock)
    forced = signals.signum is not None and th.is_alive()  # past the grace (or a second signal): do not wait
    if not forced:
        th.join()
    marks["fit_returned"] = time.time()
    history = reported.history
    if "error" in outcome and not forced:
        if local and history:
            write_metrics(run_dir, history, resumed=bool(resume))  # the appended lines, without re-run steps
        raise TrainError(f"training failed: {outcome['error']}")
    if lock.lost:
        raise TrainError(f"{lock.lost}; this run stopped after step {history[-1]['step'] if history else 0}")
    wall = wall_timeline(marks, history)
    data_parts = {k: round(v, 3) for k, v in data_timings.items()}  # the data phase's parts, in the summary
    clock = {"start": marks["start"], "end": marks["fit_returned"]}
    # stopped: the workers said so (a signal here, or `rayft stop`: a pod's preStop hook), or did not finish in time.
    # A signal after the last step's stop vote lets the run complete: it then ends as a finished run.
    if reported.stopped is not None or forced:
        held = newest_checkpoint_step(run_dir) if local else max((c["step"] for c in reported.checkpoints), default=None)
        stop = stop_record(signals.name, reported.stopped, history, held, forced)
        summary = build_summary(history, reported.extra(), run_dir, total, console, wall, stop, clock)
        summary["data_timings_s"] = data_parts
        if local:
            write_run_records(run_dir, history, summary, resumed=bool(resume))
        trackers.log_summary(summary)
        code = signals.exit_code or EXIT_CODES[signal.SIGTERM]  # a stop from outside: as a pod's SIGTERM
        raise TrainStopped(
            stop["signal"], code, run_dir, stop["checkpoint_step"], forced=forced, steps_done=stop["steps_done"], total_steps=total
        )
    summary = build_summary(history, reported.extra(), run_dir, total, console, wall, clock=clock)
    summary["data_timings_s"] = data_parts
    if local:
        write_run_records(run_dir, history, summary, resumed=bool(resume))
    trackers.log_summary(summary)
    if local and summary["export"]:
        trackers.log_artifact(summary["export"]["export_dir"], "hf")
    return summary

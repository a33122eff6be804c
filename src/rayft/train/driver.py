"""The driver: one run from start to end — data, Ray, workers, progress, records.

The steps live in their own modules: the data (:mod:`rayft.data.prepare`), reaching Ray and
checking its resources (:mod:`rayft.train.ray_cluster`), the run directory
(:mod:`rayft.train.run_dir`), the live display (:mod:`rayft.train.progress`) and the summary
(:mod:`rayft.train.summary`); the workers' start, from inside the data phase where it tokenizes
(:mod:`rayft.train.worker_launch`). Data problems surface before any worker trains or touches a
GPU. The tokenized data stay in the token store (:mod:`rayft.data.token_store`), on storage every node
reads; the workers receive small views of it (:class:`rayft.data.token_view.StoreView`) through
the Ray object store and read only their examples' shards.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from rayft.config import RayftConfig
from rayft.data.examples import DataError
from rayft.data.prepare import PreparedData, open_tokenizer, prepare_data
from rayft.tracking import Trackers
from rayft.train.errors import TrainError, TrainStopped
from rayft.train.progress import RunProgress, progress_failure, show_progress
from rayft.train.ray_cluster import connect_ray
from rayft.train.ray_start import EmbeddedRayStart
from rayft.train.run_actor import ActorMailbox
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
from rayft.train.worker_launch import WorkerLaunch, WorkersStartWatch

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
    progress=None,
) -> PreparedData:
    """The run's data (:func:`rayft.data.prepare.prepare_data`) with the model's tokenizer, which
    is loaded here unless given (``tokenizer``: the one :func:`default_tokenizer` names).
    ``run_dir``: the run directory (the store's root with ``data.cache_dir: null``); ``locate`` and
    ``before_ingest``, ``progress``: see :func:`~rayft.data.prepare.prepare_data` (the driver's
    cluster-storage check; where it starts its workers; its look at them while it tokenizes).
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
            progress=progress,
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
            marks = {"start": time.time()}  # wall clock (unix s) of the run's phases, for the summary's wall_s
            launch = WorkerLaunch(cfg, console, name, run_dir, resume, signals, lock.holder.run_id, cleanup, ray_start, marks)
            try:
                return train_run(cfg, resume, console, run_dir, signals, lock, cleanup, launch)
            except KeyboardInterrupt as interrupt:
                if (e := signals.stop_before_training(interrupt)) is None:
                    raise
                local = "://" not in run_dir
                held = newest_checkpoint_step(run_dir) if local else None  # a --resume run keeps its resume point
                by = "rayft stop" if signals.asked is not None else signals.name  # as a stop during training names it
                if local and not resume and Path(run_dir, "rayft.yaml").exists():  # a new run whose directory was prepared
                    stop = stop_record(by, None, [], held, forced=launch.abandoned, reason=signals.asked)
                    write_run_records(run_dir, [], {"run_dir": run_dir, "steps": 0, "stopped": stop}, resumed=False)
                raise TrainStopped(by, EXIT_CODES[e.signum], run_dir, held, before_training=True, forced=launch.abandoned) from None
            finally:
                if ray_start is not None:
                    ray_start.settle(SETTLE_S)
    except KeyboardInterrupt as interrupt:  # in the moment before the lock was held
        if (e := signals.stop_before_training(interrupt)) is None:
            raise
        held = newest_checkpoint_step(run_dir) if "://" not in run_dir else None
        raise TrainStopped(signals.name, EXIT_CODES[e.signum], run_dir, held, before_training=True) from None


def worker_args_for(
    cfg: RayftConfig,
    data: PreparedData,
    resume: str | None,
    console: Console,
    run_dir: str,
    n_workers: int,
    run_actor,
):
    """Every check that needs the data, then the workers' arguments: the step plan, the run
    directory prepared, the resume checks. Returns ``(args, total_steps, resumed_state)``: the
    workers' :class:`~rayft.train.worker_args.WorkerArgs`, the run's step count and the resumed
    checkpoint's state (None: a new run).

    Raises:
        TrainError: a config the data cannot satisfy (warm-up or profiled steps past the run's end),
            a run directory that holds another run, a resume of other data.
    """
    import ray

    from rayft.train.events import ProgressChannel
    from rayft.train.step_plan import make_plan
    from rayft.train.worker_args import WorkerArgs

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
    return args, total, resumed_state


def train_run(
    cfg: RayftConfig,
    resume: str | None,
    console: Console,
    run_dir: str,
    signals: SignalStop,
    lock: RunLock,
    cleanup: contextlib.ExitStack,
    launch: WorkerLaunch,
) -> dict:
    """:func:`run_training` inside its lock and signal handling: the data phase beside the embedded
    Ray's start, the workers' start beside the data's tokenization where it runs on this node
    (``launch``: :mod:`rayft.train.worker_launch`), then the progress and the records. ``cleanup``
    runs when the run ends, however it ends."""
    marks = launch.marks

    def say(text: str) -> None:
        console.print(text, highlight=False, markup=False)

    data_timings: dict[str, float] = {}  # the data phase's parts, in the summary (data_timings_s)
    try:
        data = load_run_data(
            cfg,
            console,
            connect=launch.connect,
            run_dir=run_dir,
            locate=launch.locate,
            timings=data_timings,
            before_ingest=launch.before_ingest,
            progress=WorkersStartWatch(launch),  # the workers' failure at their start, seen as it tokenizes
        )
        marks["data_ready"] = time.time()
        launch.ready()
        t_args = time.time()
        args, total, resumed_state = worker_args_for(cfg, data, resume, console, run_dir, launch.n_workers, launch.run_actor)
        data_timings["plan_and_checks"] = time.time() - t_args
        launch.start()
        run_actor, th = launch.run_actor, launch.thread
        say(
            f"ray: {launch.where}; {launch.n_workers} {'GPU' if launch.use_gpu else 'CPU'} worker(s), backend {launch.backend}; "
            f"{total} steps; run {run_dir}"
        )
        # the Ray job recorded for `rayft doctor --run`; after a finished run, ray.verify_transport judged (after the summary)
        cleanup.enter_context(TransportCheck(cfg, run_dir, say=say))
        resumed_step = int(resumed_state["step"]) if resumed_state is not None else None
        local = "://" not in run_dir
        metrics_log = MetricsLog(run_dir, resumed_step) if local else None  # lines appended as they arrive: they survive any stop
        # TensorBoard / MLflow / W&B (tracking:): fed from the driver only; closed with the run's outcome
        trackers = cleanup.enter_context(Trackers.open(cfg, run_dir, launch.name, say=say))
        launch.close()
        signals.on_stop = lambda reason: run_actor.request.remote(reason)
        signals.training_started()
        run_actor.give_args.remote(args)  # the workers go on from here
    except BaseException as e:  # a data error, a check, a signal, a stop: workers already started return without training
        launch.cancel(e)
        raise
    data_timings["total"] = marks["data_ready"] - marks["start"]
    if marks["fit_called"] < marks["data_ready"]:  # the workers' start from the data phase's hook: not the data's time
        for part in ("store", "total"):
            data_timings[part] -= marks["fit_called"] - marks["ray_wait"]
    progress = args.progress
    outcome = launch.outcome

    def watch_lock() -> None:  # a lease another run took over (see run_lock): stop writing into its directory
        if lock.lost and not signals.signum and not lost_sent:
            lost_sent.append(True)
            run_actor.request.remote(lock.lost)

    lost_sent: list[bool] = []

    failed: list[str] = []  # the driver's own failure: the first one's reason (see driver_failed)
    unrecorded: list[bool] = []  # the metrics log failed: no more lines appended (rewritten whole at the end)

    def driver_failed(reason: str) -> None:  # the workers stop as on `rayft stop` (before, they trained on unseen)
        if not failed:
            failed.append(reason)
            run_actor.request.remote(reason)  # first: the line below may fail on a failing console
            say(f"{reason}: asking the workers to stop")

    def on_step(record: dict) -> None:
        trackers.log_step(record)  # a tracker's own failure is its warning (rayft.tracking)
        if metrics_log is None or unrecorded:
            return
        try:
            metrics_log.append(record)
        except Exception as e:  # a full disk, say
            unrecorded.append(True)
            driver_failed(f"the driver could not record step {record['step']} ({type(e).__name__}: {e})")

    def write_records(write: Callable[[], None]) -> None:  # after the metrics log failed, a failed rewrite is said, not raised
        try:
            write()
        except OSError as e:
            if not unrecorded:
                raise
            say(f"the run's records could not be written either ({type(e).__name__}: {e})")

    reported = RunProgress()  # what arrived, kept where the loop fails
    try:
        show_progress(th, progress, total, console, signals, on_step=on_step, tick=watch_lock, run=reported)
    except (Exception, SystemExit) as e:  # any: else the workers train on, unseen, until the process's exit kills them
        driver_failed(progress_failure(e, console))
        try:  # the steps' records and the workers' stop still arrive through the channel
            show_progress(th, progress, total, console, signals, on_step=on_step, tick=watch_lock, run=reported)
        except (Exception, SystemExit) as again:  # the channel too: the workers were asked to stop; wait for them as on a signal
            th.join(cfg.checkpoint.signal_grace_s)
            raise TrainError(
                f"{failed[0]}; the workers were asked to stop, then their progress was lost too ({type(again).__name__}: {again}); "
                f"the newest checkpoint in {run_dir} is the one to resume from"
            ) from again
    forced = signals.signum is not None and th.is_alive()  # past the grace (or a second signal): do not wait
    if not forced:
        th.join()
    marks["fit_returned"] = time.time()
    history = reported.history
    if "error" in outcome and not forced:
        if local and history:  # the appended lines, without re-run steps
            write_records(lambda: write_metrics(run_dir, history, resumed=bool(resume)))
        raise TrainError(f"training failed: {outcome['error']}" + (f" (after this: {failed[0]})" if failed else ""))
    if lock.lost:
        raise TrainError(f"{lock.lost}; this run stopped after step {history[-1]['step'] if history else 0}")
    wall = wall_timeline(marks, history)
    data_parts = {k: round(v, 3) for k, v in data_timings.items()}  # the data phase's parts, in the summary
    clock = {"start": marks["start"], "end": marks["fit_returned"]}
    # stopped: the workers said so (a signal here, or `rayft stop`: a pod's preStop hook), or did not finish in time.
    # A signal after the last step's stop vote lets the run complete: it then ends as a finished run.
    if reported.stopped is not None or forced:
        held = newest_checkpoint_step(run_dir) if local else max((c["step"] for c in reported.checkpoints), default=None)
        # the workers stopped for the driver's failure, and no signal came: the run's error, not a stop from outside
        driver_stop = bool(failed) and signals.signum is None and reported.stopped is not None and reported.stopped.reason == failed[0]
        stop = stop_record(DRIVER_FAILURE if driver_stop else signals.name, reported.stopped, history, held, forced)
        summary = build_summary(history, reported.extra(), run_dir, total, console, wall, stop, clock)
        summary["data_timings_s"] = data_parts
        if local:
            write_records(lambda: write_run_records(run_dir, history, summary, resumed=bool(resume)))
        trackers.log_summary(summary)
        if driver_stop:
            raise driver_failure_error(failed[0], stop, run_dir)
        code = signals.exit_code or EXIT_CODES[signal.SIGTERM]  # a stop from outside: as a pod's SIGTERM
        raise TrainStopped(
            stop["signal"], code, run_dir, stop["checkpoint_step"], forced=forced, steps_done=stop["steps_done"], total_steps=total
        )
    summary = build_summary(history, reported.extra(), run_dir, total, console, wall, clock=clock)
    summary["data_timings_s"] = data_parts
    if local:
        write_records(lambda: write_run_records(run_dir, history, summary, resumed=bool(resume)))
    if failed:  # the run ended before the workers' stop landed
        say(f"{failed[0]}; the run had finished all its steps (its records are rewritten at the end)")
    trackers.log_summary(summary)
    if local and summary["export"]:
        trackers.log_artifact(summary["export"]["export_dir"], "hf")
    return summary


#: the summary's ``stopped.signal`` for a run its driver stopped (a step it could not record, a progress it could not show)
DRIVER_FAILURE = "the driver's failure"


def driver_failure_error(reason: str, stop: dict, run_dir: str) -> TrainError:
    """The error of a run stopped by its driver's failure (``reason``; ``stop``: the summary's
    :func:`~rayft.train.summary.stop_record`): the steps done and the checkpoint to resume from,
    which holds fewer steps where ``checkpoint.on_signal`` is off."""
    done, held = stop["steps_done"], stop["checkpoint_step"]
    if held is None:
        return TrainError(f"{reason}; the workers stopped after step {done}; no checkpoint to resume from")
    lost = f"step {done} is" if held + 1 == done else f"steps {held + 1}-{done} are"
    behind = f" ({lost} not in it: checkpoint.on_signal is off)" if held < done else ""
    return TrainError(
        f"{reason}; the workers stopped after step {done}; newest checkpoint: step {held}{behind}; "
        f"resume with: rayft train <the run's config> --resume {run_dir}"
    )

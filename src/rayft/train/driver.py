"""The driver: one run from start to end — data, Ray, workers, progress, records.

The steps live in their own modules: the data (:mod:`rayft.data.prepare`), reaching Ray and
checking its resources (:mod:`rayft.train.ray_cluster`), the run directory
(:mod:`rayft.train.run_dir`), the live display (:mod:`rayft.train.progress`) and the summary
(:mod:`rayft.train.summary`). Data problems surface before any worker (or GPU) starts. The
tokenized dataset travels to the workers through the Ray object store, so it works the same on one
machine and on a cluster.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rayft.config import RayftConfig
from rayft.data.formats import DataError
from rayft.data.prepare import PreparedData, open_tokenizer, prepare_data
from rayft.train.errors import TrainError
from rayft.train.progress import show_progress
from rayft.train.ray_cluster import check_worker_environment, connect_ray, resolve_workers, worker_env_vars
from rayft.train.run_dir import prepare_run_dir, run_dir_of, write_run_records
from rayft.train.summary import build_summary, wall_timeline

__all__ = ["TrainError", "load_run_data", "run_training"]


def load_run_data(cfg: RayftConfig, console: Console, tokenizer=None, connect=None) -> PreparedData:
    """The run's data (:func:`rayft.data.prepare.prepare_data`) with the model's tokenizer, which
    is loaded here unless given (``tokenizer``: the one :func:`default_tokenizer` names).

    Raises:
        TrainError: the data layer's :class:`DataError`, with its message.
    """
    from rayft.train.model import default_tokenizer, load_model_config

    name = default_tokenizer(cfg.model)
    try:
        if tokenizer is None:
            tokenizer = open_tokenizer(name, cfg.model.revision, cfg.model.trust_remote_code)
        vocab = load_model_config(cfg.model).vocab_size if cfg.data.synthetic is not None else None
        return prepare_data(cfg, console, tokenizer, name, vocab_size=vocab, connect=connect or (lambda: connect_ray(cfg)))
    except DataError as e:
        raise TrainError(str(e)) from None


def packing_line(plan, ds, seq_len: int) -> str:
    """The report line of a packed plan: rows, steps, epochs and packing efficiency."""
    n_rows = sum(map(len, plan.rows))
    return (
        f"packing: {n_rows:,} rows of {seq_len} tokens over {len(plan)} steps ({plan.epochs(len(ds)):.2f} epochs of the data), "
        f"efficiency {100 * plan.packing_efficiency(ds, seq_len):.1f}% (non-padding / row tokens)"
    )


def run_training(cfg: RayftConfig, resume: str | None = None, console: Console | None = None) -> dict:
    """Run the whole job and return the final summary (metrics of the last step, export check).

    Raises:
        TrainError: bad data, impossible resources, or a failed run (with the worker's error).
    """
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from rayft.data.tokenize import fingerprint
    from rayft.train.events import ProgressChannel
    from rayft.train.loop import make_plan, train_func
    from rayft.train.worker_args import WorkerArgs

    console = console or Console(stderr=True, soft_wrap=True)
    marks = {"start": time.time()}  # wall clock (unix s) of the run's phases, for the summary's wall_s
    if resume:
        name = Path(resume.rstrip("/")).name
        if "/" in resume:
            cfg.checkpoint.storage_path = resume.rstrip("/").rsplit("/", 1)[0]
        run_dir = run_dir_of(cfg, name)
        if "://" not in run_dir and not Path(run_dir).is_dir():  # fail before any data or Ray work
            raise TrainError(f"--resume {resume}: no run directory at {run_dir}")
    else:
        name = cfg.checkpoint.name or f"rayft-{dt.datetime.now():%Y%m%d-%H%M%S}"
    reached: list[str] = []
    data = load_run_data(cfg, console, connect=lambda: reached.append(connect_ray(cfg)))  # Ray only if tokenizing there
    ds = data.train
    marks["data_ready"] = time.time()
    where = reached[0] if reached else connect_ray(cfg)
    marks["ray_ready"] = time.time()
    n_workers, use_gpu = resolve_workers(cfg)
    check_worker_environment(cfg, use_gpu)
    run_dir = run_dir_of(cfg, name)
    plan = make_plan(cfg, ds, n_workers)
    total = len(plan)
    if cfg.data.packing:
        console.print(packing_line(plan, ds, cfg.data.seq_len), highlight=False)
    if cfg.train.warmup_steps >= total:
        raise TrainError(f"train.warmup_steps={cfg.train.warmup_steps} but the run has only {total} steps: the LR never reaches train.lr")
    resume_from = prepare_run_dir(run_dir, resume, cfg, console) if "://" not in run_dir else None
    backend = cfg.parallel.backend if cfg.parallel.backend != "auto" else ("nccl" if use_gpu else "gloo")
    console.print(
        f"ray: {where}; {n_workers} {'GPU' if use_gpu else 'CPU'} worker(s), backend {backend}; {total} steps; run {run_dir}",
        highlight=False,
    )
    progress = ProgressChannel.open()
    args = WorkerArgs(
        config=cfg.model_dump(mode="json"),
        dataset=ray.put(ds),
        validation=ray.put(data.validation) if data.validation is not None else None,
        pad_id=data.tokenizer.pad_token_id,
        data_fingerprint=fingerprint(ds),
        tokenizer=data.tokenizer_name,
        run_dir=run_dir,
        progress=progress,
        resume_from=resume_from,
    )
    trainer = TorchTrainer(
        train_func,
        train_loop_config=args.loop_config(),
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
            worker_runtime_env={"env_vars": worker_env_vars()},
        ),
        torch_config=TorchConfig(backend=backend),
    )
    outcome: dict[str, Any] = {}

    def _fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except Exception as e:  # surfaced on the driver below
            outcome["error"] = e

    th = threading.Thread(target=_fit, daemon=True)
    marks["fit_called"] = time.time()
    th.start()
    reported = show_progress(th, progress, total, console)
    th.join()
    marks["fit_returned"] = time.time()
    if "error" in outcome:
        raise TrainError(f"training failed: {outcome['error']}")
    history = reported.history
    summary = build_summary(history, reported.extra(), run_dir, total, console, wall_timeline(marks, history))
    if "://" not in run_dir:
        write_run_records(run_dir, history, summary, resumed=bool(resume))
    return summary

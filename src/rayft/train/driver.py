"""The driver: read and tokenize the data, reach Ray, start the workers, show progress.

Data problems surface here, before any worker (or GPU) starts. The tokenized dataset travels to
the workers through the Ray object store, so it works the same on one machine and on a cluster.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text
from rich.table import Table

from rayft.config import RayftConfig, dump_config


class TrainError(RuntimeError):
    """The job cannot start or did not finish; the message says why."""


def prepare_dataset(cfg: RayftConfig, console: Console):
    """Load, validate and tokenize the training data on the driver.

    With ``data.on_bad_record: skip`` the skipped records are printed first, per reason category
    with the first ``file:line`` of each.

    Returns:
        ``(tokenizer, tokenizer name, TokenizedDataset)``.
    Raises:
        TrainError: a bad record (``file:line: reason``, policy ``error``), an unreadable file, or
            nothing left to train on (also when every record was skipped as bad).
    """
    from rayft.data.formats import DataError, TextDocument, load_conversations
    from rayft.data.tokenize import tokenize_dataset
    from rayft.data.tokenizer import load_tokenizer
    from rayft.train.model import default_tokenizer

    tok_name = default_tokenizer(cfg.model)
    tokenizer = load_tokenizer(tok_name, revision=cfg.model.revision, trust_remote_code=cfg.model.trust_remote_code)
    try:
        loaded = load_conversations(cfg.data.train_files, cfg.data.format, cfg.data.on_bad_record, cfg.data.columns.mapping())
    except DataError as e:
        raise TrainError(str(e)) from None
    for line in [*(f"data: {n}" for n in loaded.notes), *loaded.skip_summary()]:
        console.print(line, highlight=False, markup=False)
    if not loaded:
        why = f"all {loaded.records} records were bad and skipped" if loaded.skipped else "no record"
        raise TrainError(f"empty dataset: {why} in {cfg.data.train_files}")
    convs = list(loaded)
    if cfg.data.max_examples:
        convs = convs[: cfg.data.max_examples]
    try:
        ds = tokenize_dataset(tokenizer, convs, cfg.data.seq_len)
    except DataError as e:
        raise TrainError(str(e)) from None
    n_text = sum(isinstance(c, TextDocument) for c in convs)
    kinds = f" ({len(convs) - n_text} conversations, {n_text} text documents)" if n_text else ""
    split = f"; text documents split into {cfg.data.seq_len}-token chunks: {ds.split_documents}" if n_text else ""
    console.print(
        f"data: {len(convs)} records{kinds} → {len(ds)} examples, {int(ds.trainable.sum()):,} trainable of {len(ds.tokens):,} tokens; "
        f"truncated to {cfg.data.seq_len}: {ds.truncated}{split}; dropped (no trainable token left): {ds.dropped_no_trainable}",
        highlight=False,
    )
    if len(ds) == 0:
        raise TrainError(f"empty dataset: no example with a trainable token in {cfg.data.train_files}")
    return tokenizer, tok_name, ds


def connect_ray(cfg: RayftConfig) -> str:
    """Join the cluster at ray.address / RAY_ADDRESS, else start an embedded local Ray. Returns which."""
    import ray

    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    kwargs: dict[str, Any] = dict(
        logging_level="ERROR", log_to_driver=cfg.ray.log_to_driver, include_dashboard=False,
        configure_logging=True,
    )  # fmt: skip
    if ray.is_initialized():
        return "existing"
    if address:
        if address.startswith(("http://", "https://")):
            raise TrainError(
                f"Ray address {address} is a dashboard (job submission) URL: use `rayft submit` with it, or give "
                "the cluster's GCS address (host:6379, or `auto` on a cluster node) to `rayft train`"
            )
        ray.init(address=address, **kwargs)
        return address
    ray.init(address="local", num_cpus=cfg.ray.num_cpus, **kwargs)  # never attach to a `ray start` cluster by accident
    return "embedded local Ray"


def resolve_workers(cfg: RayftConfig) -> tuple[int, bool]:
    """(number of workers, use GPUs) from the config and the cluster's resources.

    ``num_workers: auto`` is every GPU in the cluster, or one CPU worker when there is none.

    Raises:
        TrainError: more GPUs (or CPUs) requested than the cluster has — at once, never a silent wait.
    """
    import ray

    res = ray.cluster_resources()
    gpus, cpus = int(res.get("GPU", 0)), res.get("CPU", 0)
    use_gpu = gpus > 0 if cfg.train.use_gpu == "auto" else bool(cfg.train.use_gpu)
    n = cfg.train.num_workers
    if n == "auto":
        n = gpus if use_gpu else 1
    if use_gpu and n > gpus:
        raise TrainError(
            f"train.num_workers={n} needs {n} GPUs but the Ray cluster has {gpus}; "
            f"lower train.num_workers or add GPU nodes"
        )
    free_gpus = int(ray.available_resources().get("GPU", 0))
    if use_gpu and n > free_gpus:
        print(f"warning: {n} GPUs needed, {free_gpus} free now (others are in use): the run waits until they are released")
    need_cpu = n * cfg.train.cpus_per_worker
    if need_cpu > cpus:
        raise TrainError(
            f"{n} workers × train.cpus_per_worker={cfg.train.cpus_per_worker} need {need_cpu:g} CPUs "
            f"but the Ray cluster has {cpus:g}"
        )
    return n, use_gpu


def nodes_missing_storage(storage_path: str) -> list[str]:
    """Addresses of live Ray nodes that cannot see ``storage_path`` (a local path).

    A marker with a random token is written from one node and read back on every other node, so a
    node-local directory that merely exists everywhere is told apart from a shared file system.
    Returns ``[]`` for URIs (``s3://``) and single-node clusters.
    """
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if "://" in storage_path or len(nodes) <= 1:
        return []
    token = uuid.uuid4().hex
    marker = os.path.join(os.path.abspath(storage_path), f".rayft-shared-{token}")

    @ray.remote(num_cpus=0)
    def probe(path: str, action: str) -> bool:
        if action == "write":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(token)
            return True
        if action == "remove":
            os.remove(path)
            return True
        try:
            with open(path) as f:
                return f.read() == token
        except OSError:
            return False

    def on(node):
        return probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))

    first, rest = nodes[0], nodes[1:]
    ray.get(on(first).remote(marker, "write"))
    try:
        seen = ray.get([on(n).remote(marker, "read") for n in rest])
    finally:
        ray.get(on(first).remote(marker, "remove"))
    return [n["NodeManagerAddress"] for n, ok in zip(rest, seen) if not ok]


def worker_env_vars() -> dict[str, str]:
    """Environment variables the Ray Train workers get on top of their node's.

    ``TOKENIZERS_PARALLELISM=false``, plus every ``NCCL_*`` variable set in the driver's
    environment: on an embedded local Ray the workers inherit them anyway, on a remote cluster
    this is how ``NCCL_DEBUG=INFO rayft train ...`` (or ``NCCL_NET=Socket``) reaches the workers.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def run_dir_of(cfg: RayftConfig, name: str) -> str:
    sp = cfg.checkpoint.storage_path
    return f"{sp.rstrip('/')}/{name}" if "://" in sp else str(Path(sp).resolve() / name)


def run_training(cfg: RayftConfig, resume: str | None = None, console: Console | None = None) -> dict:
    """Run the whole job and return the final summary (metrics of the last step, export check).

    Raises:
        TrainError: bad data, impossible resources, or a failed run (with the worker's error).
    """
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Queue

    from rayft.data.tokenize import fingerprint
    from rayft.train.loop import make_plan, train_func

    console = console or Console(stderr=True)
    tokenizer, tok_name, ds = prepare_dataset(cfg, console)
    where = connect_ray(cfg)
    n_workers, use_gpu = resolve_workers(cfg)
    if resume:
        name = Path(resume.rstrip("/")).name
        if "/" in resume:
            cfg.checkpoint.storage_path = resume.rstrip("/").rsplit("/", 1)[0]
    else:
        name = cfg.checkpoint.name or f"rayft-{dt.datetime.now():%Y%m%d-%H%M%S}"
    blind = nodes_missing_storage(cfg.checkpoint.storage_path)
    if blind:
        raise TrainError(
            f"checkpoint.storage_path={cfg.checkpoint.storage_path} is node-local: Ray nodes {', '.join(blind)} cannot "
            "see it, so checkpoints could not be resumed there. Use a file system mounted on every node "
            "(e.g. FSx for Lustre at /fsx) or an s3://bucket/prefix URI."
        )
    run_dir = run_dir_of(cfg, name)
    total = len(make_plan(cfg, ds, n_workers))
    if cfg.train.warmup_steps >= total:
        raise TrainError(f"train.warmup_steps={cfg.train.warmup_steps} but the run has only {total} steps: the LR never reaches train.lr")
    resume_from = _prepare_run_dir(run_dir, resume, cfg, console) if "://" not in run_dir else None
    backend = cfg.parallel.backend if cfg.parallel.backend != "auto" else ("nccl" if use_gpu else "gloo")
    console.print(
        f"ray: {where}; {n_workers} {'GPU' if use_gpu else 'CPU'} worker(s), backend {backend}; "
        f"{total} steps; run {run_dir}",
        highlight=False,
    )
    progress = Queue()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={
            "config": cfg.model_dump(mode="json"),
            "dataset": ray.put(ds),
            "pad_id": tokenizer.pad_token_id,
            "data_fingerprint": fingerprint(ds),
            "tokenizer": tok_name,
            "run_dir": run_dir,
            "progress": progress,
            "resume_from": resume_from,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=n_workers, use_gpu=use_gpu, resources_per_worker={"CPU": cfg.train.cpus_per_worker}
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=cfg.checkpoint.storage_path if "://" in cfg.checkpoint.storage_path else str(Path(cfg.checkpoint.storage_path).resolve()),
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
    th.start()
    history, extra = _show_progress(th, progress, total, console)
    th.join()
    if "error" in outcome:
        raise TrainError(f"training failed: {outcome['error']}")
    summary = _summary(history, extra, run_dir, total, console)
    if "://" not in run_dir:
        metrics_file = Path(run_dir) / "rayft_metrics.jsonl"
        earlier = [json.loads(x) for x in metrics_file.read_text().splitlines()] if resume and metrics_file.exists() else []
        first = history[0]["step"] if history else float("inf")
        merged = [h for h in earlier if h["step"] < first] + history  # a resumed run keeps the original curve
        metrics_file.write_text("".join(json.dumps(h) + "\n" for h in merged))
        (Path(run_dir) / "rayft_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _prepare_run_dir(run_dir: str, resume: str | None, cfg: RayftConfig, console: Console) -> str | None:
    """Create a new run directory, or check a resumed one; returns the checkpoint to resume from.

    Raises:
        TrainError: a new run whose directory already holds a run (Ray Train would silently
            continue it), or ``--resume`` of a directory without a complete checkpoint.
    """
    from rayft.train.checkpoint import find_checkpoints, is_complete

    d = Path(run_dir)
    if not resume:
        if d.is_dir() and (any(d.glob("checkpoint_*")) or (d / "checkpoint_manager_snapshot.json").exists()):
            raise TrainError(f"{run_dir} already holds a run: continue it with --resume {run_dir}, or pick another checkpoint.name")
        d.mkdir(parents=True, exist_ok=True)
        (d / "rayft.yaml").write_text(dump_config(cfg))
        return None
    if not d.is_dir():
        raise TrainError(f"--resume {resume}: no run directory at {run_dir}")
    for c in sorted(d.glob("checkpoint_*")):
        if not is_complete(c):
            console.print(Text.assemble(("warning", "yellow"), f": skipping incomplete checkpoint {c} (interrupted save?)"))
    done = find_checkpoints(d)
    if not done:
        raise TrainError(f"--resume {resume}: no complete checkpoint in {run_dir}")
    console.print(f"resuming {run_dir} from its checkpoint of step {done[-1][0]}", highlight=False)
    return str(done[-1][1])


def _show_progress(th: threading.Thread, queue, total: int, console: Console) -> tuple[list[dict], dict]:
    from ray.util.queue import Empty
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    history: list[dict] = []
    export: dict = {}
    checkpoints: list[dict] = []
    resumes: list[dict] = []
    cols = [TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]  # fmt: skip
    with Progress(*cols, console=console, transient=False, refresh_per_second=4) as bar:
        task = bar.add_task("train", total=total, info="starting workers…")
        while True:
            alive = th.is_alive()
            drained = False
            while True:
                try:
                    m = queue.get_nowait()
                except Empty:
                    break
                drained = True
                if "export" in m:
                    export = m["export"]
                    continue
                if "checkpoint" in m:
                    checkpoints.append(m["checkpoint"])
                    continue
                if "resumed" in m:
                    r = m["resumed"]
                    resumes.append(r)
                    bar.console.print(
                        f"resumed from the checkpoint of step {r['step']} (world size {r['from_world_size']} → {r['world_size']}; "
                        f"loaded in {r.get('load_s', 0):.1f} s)"
                    )
                    continue
                # After a restart the steps since the last checkpoint run again: keep the latest.
                while history and history[-1]["step"] >= m["step"]:
                    history.pop()
                history.append(m)
                unit = "GPU" if m["gpu"] != "cpu" else "worker"
                info = f"loss {m['loss']:.4f}  {m['tokens_per_s_per_gpu']:,.0f} tok/s/{unit}"
                if m.get("mfu"):
                    info += f"  MFU {100 * m['mfu']:.1f}%"
                bar.update(task, completed=m["step"], info=info)
            if not alive and not drained:
                break
            time.sleep(0.25)
    return history, {"export": export, "checkpoints": checkpoints, "resumes": resumes}


def _summary(history: list[dict], extra: dict, run_dir: str, total: int, console: Console) -> dict:
    if not history:
        raise TrainError("training finished without reporting a step")
    last = history[-1]
    steady = history[min(3, len(history) - 1) :]
    tps = sorted(h["tokens_per_s_per_gpu"] for h in steady)
    med = tps[len(tps) // 2]
    summary = {
        "run_dir": run_dir,
        "steps": last["step"],
        "total_steps": total,
        "first_loss": history[0]["loss"],
        "final_loss": last["loss"],
        "median_tokens_per_s_per_gpu": med,
        "median_mfu": sorted(h["mfu"] for h in steady)[len(steady) // 2] if last.get("mfu") is not None else None,
        "peak_mem_gib": max((h["peak_mem_gib"] or 0) for h in history) if last.get("peak_mem_gib") else None,
        "gpu": last["gpu"],
        "world_size": last["world_size"],
        "export": extra["export"],
        "checkpoints": extra["checkpoints"],
        "resumes": extra["resumes"],
    }
    export = extra["export"]
    t = Table(title="rayft run summary", show_header=False)
    t.add_row("run", run_dir)
    t.add_row("steps", f"{last['step']}/{total}")
    t.add_row("loss", f"{history[0]['loss']:.4f} → {last['loss']:.4f}")
    t.add_row(f"tokens/s/{'GPU' if last['gpu'] != 'cpu' else 'worker'} (median)", f"{med:,.0f}")
    if summary["median_mfu"] is not None:
        t.add_row("MFU (median)", f"{100 * summary['median_mfu']:.1f}% of {last['peak_flops'] / 1e12:.0f} TFLOP/s")
    if summary["peak_mem_gib"]:
        t.add_row("peak GPU memory", f"{summary['peak_mem_gib']:.1f} GiB")
    t.add_row("workers", f"{last['world_size']} × {last['gpu']}")
    if export:
        t.add_row("HF export", f"{export['export_dir']} (max |Δlogit| {export['export_max_abs_logit_diff']:.2e})")
    console.print(t)
    return summary

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.text import Text
from rich.table import Table

from rayft.config import RayftConfig, dump_config


class TrainError(RuntimeError):
    """The job cannot start or did not finish; the message says why."""


@dataclass
class PreparedData:
    """The driver's tokenized data: ``train`` and ``validation`` (None without a validation set)
    :class:`~rayft.data.tokenize.TokenizedDataset`, the tokenizer and its name, and whether the
    tokenized data came from ``data.cache_dir`` (``cache``: ``"hit"``, ``"miss"`` or ``"off"``)."""

    tokenizer: Any
    tokenizer_name: str
    train: Any
    validation: Any = None
    cache: str = "off"


def prepare_dataset(cfg: RayftConfig, console: Console):
    """:func:`prepare_data`'s training part: ``(tokenizer, tokenizer name, TokenizedDataset)``."""
    d = prepare_data(cfg, console)
    return d.tokenizer, d.tokenizer_name, d.train


def prepare_data(cfg: RayftConfig, console: Console, connect: Callable[[], Any] | None = None) -> PreparedData:
    """Load, validate and tokenize the training (and validation) data on the driver.

    With ``data.cache_dir`` set, a cache entry for the same inputs, tokenizer and settings
    (:mod:`rayft.data.cache`) is used instead, and the report lines of the run that wrote it are
    printed again; otherwise the data are read and tokenized and the result cached. A corrupt
    entry is reported as a warning and rebuilt. With ``data.on_bad_record: skip`` the skipped
    records are printed first, per reason category with the first ``file:line`` of each.

    Tokenization runs in this process or with Ray Data over the cluster (``data.preprocess``,
    :func:`rayft.data.parallel.use_ray`); ``connect`` is called first to reach Ray (default
    :func:`connect_ray`).

    Raises:
        TrainError: a bad record (``file:line: reason``, policy ``error``), an unreadable file, or
            nothing left to train on (also when every record was skipped as bad), an empty
            validation set, or a ``data.validation_fraction`` that leaves no training record.
    """
    from rayft.data import cache as cache_lib
    from rayft.data.formats import DataError
    from rayft.data.tokenizer import load_tokenizer
    from rayft.train.model import default_tokenizer

    dc = cfg.data
    tok_name = default_tokenizer(cfg.model)
    try:
        tokenizer = load_tokenizer(tok_name, revision=cfg.model.revision, trust_remote_code=cfg.model.trust_remote_code)
    except OSError as e:  # hub unreachable, no such repo or directory
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainError(
            f"tokenizer {tok_name!r} (model.tokenizer / model.name_or_path) cannot be loaded: {first}. Give a local directory, "
            "make the hub reachable (or pre-fill the Hugging Face cache), or use a preset such as qwen2.5-1.5b"
        ) from None
    if dc.synthetic is not None:
        from rayft.data.synthetic import random_dataset
        from rayft.train.model import load_model_config

        vocab = load_model_config(cfg.model).vocab_size
        ds = random_dataset(dc.synthetic.rows, dc.seq_len, vocab, dc.synthetic.seed)
        console.print(f"data: synthetic, {len(ds)} rows of {dc.seq_len} random token ids in [0, {vocab}) (seed {dc.synthetic.seed}), every token trainable",
                      highlight=False, markup=False)
        return PreparedData(tokenizer, tok_name, ds, None, "off")
    key = key_parts = None
    if dc.cache_dir:
        try:
            stamps = cache_lib.input_stamps(dc)  # before the key's hashing: a change after it is caught below
            key, key_parts = cache_lib.cache_key(dc, tokenizer, tok_name)
        except DataError as e:
            raise TrainError(str(e)) from None
        try:
            hit = cache_lib.load(dc.cache_dir, key)
        except cache_lib.CacheError as e:
            console.print(Text.assemble(("warning", "yellow"), f": ignoring a corrupt tokenized-data cache entry: {e}"), highlight=False)
            hit = None
        if hit is not None:
            for line in hit.info.get("lines", []):
                console.print(line, highlight=False, markup=False)
            console.print(f"data: used the tokenized cache {cache_lib.entry_dir(dc.cache_dir, key)} (no file read or tokenized)", highlight=False, markup=False)
            return PreparedData(tokenizer, tok_name, hit.parts["train"], hit.parts.get("validation"), "hit")
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        console.print(line, highlight=False, markup=False)

    try:
        train_ex = _load_examples(dc.train_files, dc, say, "data.train_files")
        if dc.max_examples:
            train_ex = train_ex[: dc.max_examples]
        val_ex, val_from = None, ""
        if dc.validation_fraction:
            train_ex, val_ex = split_validation(train_ex, dc.validation_fraction, dc.seed)
            val_from = f"data.validation_fraction={dc.validation_fraction} of the training records, seed {dc.seed}"
        elif dc.validation_files:
            val_ex = _load_examples(dc.validation_files, dc, say, "data.validation_files")
            val_from = "data.validation_files"
        ds = _tokenize(tokenizer, train_ex, cfg, connect, console)
        val = _tokenize(tokenizer, val_ex, cfg, connect, console) if val_ex is not None else None
    except DataError as e:
        raise TrainError(str(e)) from None
    say(_data_line("data", train_ex, ds, dc.seq_len))
    if len(ds) == 0:
        raise TrainError(f"empty dataset: no example with a trainable token in {dc.train_files}")
    if val is not None:
        say(_data_line(f"validation ({val_from})", val_ex, val, dc.seq_len))
        if len(val) == 0:
            raise TrainError(f"empty validation set: no example with a trainable token ({val_from})")
    if key is not None and cache_lib.input_stamps(dc) != stamps:
        console.print(Text.assemble(("warning", "yellow"), ": an input file changed while it was read; the tokenized data were not cached"), highlight=False)
        key = None
    if key is not None:
        parts = {"train": ds, **({"validation": val} if val is not None else {})}
        try:
            where = cache_lib.save(dc.cache_dir, key, cache_lib.CachedData(parts, {"lines": lines}), key_parts)
            console.print(f"data: cached the tokenized data in {where}", highlight=False, markup=False)
        except OSError as e:
            console.print(Text.assemble(("warning", "yellow"), f": could not write the tokenized-data cache (data.cache_dir): {e}"), highlight=False)
    return PreparedData(tokenizer, tok_name, ds, val, "miss" if key is not None else "off")


def _load_examples(files: list[str], dc, say: Callable[[str], None], key: str) -> list:
    """Read ``files`` (printing notes and skips); raises TrainError when nothing is left."""
    from rayft.data.formats import load_conversations

    loaded = load_conversations(files, dc.format, dc.on_bad_record, dc.columns.mapping())
    for line in [*(f"data: {n}" for n in loaded.notes), *loaded.skip_summary()]:
        say(line)
    if not loaded:
        why = f"all {loaded.records} records were bad and skipped" if loaded.skipped else "no record"
        raise TrainError(f"empty dataset: {why} in {files}" + ("" if key == "data.train_files" else f" ({key})"))
    return list(loaded)


def split_validation(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """``(train, validation)``: ``max(1, round(fraction × n))`` examples chosen at random with
    ``np.random.default_rng([seed, 0x7661])`` (a stream of its own, not the shuffle's), both parts
    in their original order.

    Raises:
        TrainError: fewer than 2 examples (nothing would be left to train on).
    """
    import numpy as np

    n = len(examples)
    n_val = max(1, round(fraction * n))
    if n - n_val < 1:
        raise TrainError(f"data.validation_fraction={fraction} of {n} record(s) leaves no training record")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng([seed, 0x7661]).permutation(n)[:n_val]] = True
    return [e for e, h in zip(examples, held) if not h], [e for e, h in zip(examples, held) if h]


def _tokenize(tokenizer, examples: list, cfg: RayftConfig, connect: Callable[[], Any] | None, console: Console):
    from rayft.data.parallel import tokenize_dataset_ray, use_ray
    from rayft.data.tokenize import tokenize_dataset

    mode = cfg.data.preprocess
    if use_ray(mode, len(examples), None):
        import ray

        (connect or (lambda: connect_ray(cfg)))()
        cpus = ray.cluster_resources().get("CPU", 0)
        if use_ray(mode, len(examples), cpus):
            t0 = time.perf_counter()
            ds = tokenize_dataset_ray(tokenizer, examples, cfg.data.seq_len)
            console.print(f"data: tokenized {len(examples):,} records with Ray Data on {cpus:g} CPUs in {time.perf_counter() - t0:.1f} s", highlight=False)
            return ds
    return tokenize_dataset(tokenizer, examples, cfg.data.seq_len)


def _data_line(label: str, examples: list, ds, seq_len: int) -> str:
    from rayft.data.formats import TextDocument

    n_text = sum(isinstance(c, TextDocument) for c in examples)
    kinds = f" ({len(examples) - n_text} conversations, {n_text} text documents)" if n_text else ""
    split = f"; text documents split into {seq_len}-token chunks: {ds.split_documents}" if n_text else ""
    return (
        f"{label}: {len(examples)} records{kinds} → {len(ds)} examples, {int(ds.trainable.sum()):,} trainable of {len(ds.tokens):,} tokens; "
        f"truncated to {seq_len}: {ds.truncated}{split}; dropped (no trainable token left): {ds.dropped_no_trainable}"
    )


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
    data = prepare_data(cfg, console, connect=lambda: reached.append(connect_ray(cfg)))  # Ray only if tokenizing there
    tokenizer, tok_name, ds = data.tokenizer, data.tokenizer_name, data.train
    marks["data_ready"] = time.time()
    where = reached[0] if reached else connect_ray(cfg)
    marks["ray_ready"] = time.time()
    n_workers, use_gpu = resolve_workers(cfg)
    if cfg.train.gpu_memory_limit_gib is not None and not use_gpu:
        raise TrainError(f"train.gpu_memory_limit_gib={cfg.train.gpu_memory_limit_gib:g} caps GPU workers' memory, "
                         "but this run's workers are CPU workers (no GPU in the Ray cluster, or train.use_gpu: false)")  # fmt: skip
    if cfg.train.float8:  # the driver's environment stands for the workers' (embedded Ray, or the same image)
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            raise TrainError("train.float8 needs the torchao package (in a clone: pip install -e '.[fp8]')") from None
    blind = nodes_missing_storage(cfg.checkpoint.storage_path)
    if blind:
        raise TrainError(
            f"checkpoint.storage_path={cfg.checkpoint.storage_path} is node-local: Ray nodes {', '.join(blind)} cannot "
            "see it, so checkpoints could not be resumed there. Use a file system mounted on every node "
            "(e.g. FSx for Lustre at /fsx) or an s3://bucket/prefix URI."
        )
    run_dir = run_dir_of(cfg, name)
    plan = make_plan(cfg, ds, n_workers)
    total = len(plan)
    if cfg.data.packing:
        efficiency = plan.packing_efficiency(ds, cfg.data.seq_len)
        n_rows = sum(map(len, plan.rows))
        console.print(
            f"packing: {n_rows:,} rows of {cfg.data.seq_len} tokens over {total} steps ({plan.epochs(len(ds)):.2f} epochs of the data), "
            f"efficiency {100 * efficiency:.1f}% (non-padding / row tokens)",
            highlight=False,
        )
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
            "validation": ray.put(data.validation) if data.validation is not None else None,
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
    marks["fit_called"] = time.time()
    th.start()
    history, extra = _show_progress(th, progress, total, console)
    th.join()
    marks["fit_returned"] = time.time()
    if "error" in outcome:
        raise TrainError(f"training failed: {outcome['error']}")
    summary = _summary(history, extra, run_dir, total, console, wall_timeline(marks, history))
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
    extra_eval: dict = {}
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
                if "eval_initial" in m:
                    extra_eval["eval_initial"] = m["eval_initial"]
                    bar.console.print(f"eval loss before training: {m['eval_initial']['eval_loss']:.4f}", highlight=False)
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
                if "eval_loss" in m:
                    info += f"  eval {m['eval_loss']:.4f}"
                bar.update(task, completed=m["step"], info=info)
            if not alive and not drained:
                break
            time.sleep(0.25)
    return history, {"export": export, "checkpoints": checkpoints, "resumes": resumes, **extra_eval}


def wall_timeline(marks: dict[str, float], history: list[dict]) -> dict[str, float] | None:
    """Where a run's wall time went, in seconds, from the driver's clock marks (unix seconds:
    ``start``, ``data_ready``, ``ray_ready``, ``fit_called``, ``fit_returned``) and the first and
    last step's metrics (``worker_entry_unix``, ``time_setup_s``, ``step_time_s``, ``unix_time``).

    Returns:
        ``data`` (read + tokenize, or the cache), ``ray`` (connect / start Ray), ``workers_start``
        (fit called → rank 0 enters the training function: the Ray Train controller, worker
        processes, process group), ``worker_setup`` (model build, weight load, optimizer, resume),
        ``first_step`` (with compilation), ``steps`` (the other steps, with checkpoint saves and
        evaluations), ``end`` (last step's end → fit returns: the final save, export, shutdown),
        ``total``; None when the metrics lack the marks (a run of an older rayft). Clocks of other
        nodes are compared as they are: on a cluster, differences carry their clock offset.
    """
    if not history or "worker_entry_unix" not in history[0] or "unix_time" not in history[-1]:
        return None
    first, last = history[0], history[-1]
    return {
        "data": marks["data_ready"] - marks["start"],
        "ray": marks["ray_ready"] - marks["data_ready"],
        "workers_start": first["worker_entry_unix"] - marks["fit_called"],
        "worker_setup": first["time_setup_s"],
        "first_step": first["step_time_s"],
        "steps": last["unix_time"] - first["unix_time"],
        "end": marks["fit_returned"] - last["unix_time"],
        "total": marks["fit_returned"] - marks["start"],
    }


def _summary(history: list[dict], extra: dict, run_dir: str, total: int, console: Console, wall: dict | None = None) -> dict:
    if not history:
        raise TrainError("training finished without reporting a step")
    last = history[-1]
    steady = history[min(3, len(history) - 1) :]
    tps = sorted(h["tokens_per_s_per_gpu"] for h in steady)
    evals = [h for h in history if "eval_loss" in h]
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
        "eval_loss_initial": extra.get("eval_initial", {}).get("eval_loss"),
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_step": evals[-1]["step"] if evals else None,
        "wall_s": wall,
    }
    export = extra["export"]
    t = Table(title="rayft run summary", show_header=False)
    t.add_row("run", run_dir)
    t.add_row("steps", f"{last['step']}/{total}")
    t.add_row("loss", f"{history[0]['loss']:.4f} → {last['loss']:.4f}")
    if evals:
        before = f"{summary['eval_loss_initial']:.4f} → " if summary["eval_loss_initial"] is not None else ""
        t.add_row("eval loss", f"{before}{evals[-1]['eval_loss']:.4f} (step {evals[-1]['step']})")
    t.add_row(f"tokens/s/{'GPU' if last['gpu'] != 'cpu' else 'worker'} (median)", f"{med:,.0f}")
    if summary["median_mfu"] is not None:
        t.add_row("MFU (median)", f"{100 * summary['median_mfu']:.1f}% of {last['peak_flops'] / 1e12:.0f} TFLOP/s")
    if summary["peak_mem_gib"]:
        t.add_row("peak GPU memory", f"{summary['peak_mem_gib']:.1f} GiB")
    t.add_row("workers", f"{last['world_size']} × {last['gpu']}")
    if wall:
        t.add_row("wall time", f"{wall['total']:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in wall.items() if k != "total"))
    if export:
        vs = ", float8-trained model vs the export" if export.get("trained_float8") else ""
        t.add_row("HF export", f"{export['export_dir']} (max |Δlogit| {export['export_max_abs_logit_diff']:.2e}{vs})")
    console.print(t)
    return summary

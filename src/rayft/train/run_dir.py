"""The run directory on the driver: where it is, creating or checking it, and the records the
driver writes there (``rayft.yaml``, ``rayft_metrics.jsonl``, ``rayft_summary.json``)."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from rich.console import Console
from rich.text import Text

from rayft.config import RayftConfig
from rayft.config_load import dump_config
from rayft.train.errors import TrainError


def run_dir_of(cfg: RayftConfig, name: str) -> str:
    """``checkpoint.storage_path/name``: an absolute local path, or a URI under an ``s3://`` storage path."""
    sp = cfg.checkpoint.storage_path
    return f"{sp.rstrip('/')}/{name}" if "://" in sp else str(Path(sp).resolve() / name)


def resolve_run(cfg: RayftConfig, resume: str | None) -> tuple[str, str]:
    """The run's name and directory; ``--resume RUN`` (a name, or a run directory whose parent
    becomes ``checkpoint.storage_path``) must exist.

    Raises:
        TrainError: ``--resume`` of a missing local run directory (before any data or Ray work).
    """
    if resume:
        name = Path(resume.rstrip("/")).name
        if "/" in resume:
            cfg.checkpoint.storage_path = resume.rstrip("/").rsplit("/", 1)[0] or "/"  # a run at the root: "/name"
        run_dir = run_dir_of(cfg, name)
        if "://" not in run_dir and not Path(run_dir).is_dir():
            raise TrainError(f"--resume {resume}: no run directory at {run_dir}")
        return name, run_dir
    name = cfg.checkpoint.name or f"rayft-{dt.datetime.now():%Y%m%d-%H%M%S}"
    return name, run_dir_of(cfg, name)


def newest_checkpoint_step(run_dir: str) -> int | None:
    """The step of the newest complete checkpoint in a local ``run_dir`` (None: none)."""
    from rayft.train.checkpoint_files import find_checkpoints  # not rayft.train.checkpoint: no torch on the way out of a stop

    done = find_checkpoints(run_dir) if Path(run_dir).is_dir() else []
    return done[-1][0] if done else None


def prepare_run_dir(run_dir: str, resume: str | None, cfg: RayftConfig, console: Console) -> str | None:
    """Create a new run directory, or check a resumed one; returns the checkpoint to resume from.

    For ``--resume`` that is the newest complete checkpoint whose files match the digests its state
    file records (:func:`rayft.train.checkpoint_files.newest_intact`: reads each candidate once,
    newest first). Incomplete checkpoints are skipped with a warning, and so is a corrupt one
    (naming it, the file, the expected and the actual digest); one written without digests (an
    earlier rayft) is taken with a note that it cannot be verified.

    Raises:
        TrainError: a new run whose directory already holds a run (Ray Train would silently
            continue it), or ``--resume`` of a directory without a complete checkpoint, or with
            only corrupt ones.
    """
    from rayft.train.checkpoint_files import CheckpointCheck, checkpoint_dirs, find_checkpoints, is_complete, newest_intact

    d = Path(run_dir)
    if not resume:
        if d.is_dir() and (any(d.glob("checkpoint_*")) or (d / "checkpoint_manager_snapshot.json").exists()):
            raise TrainError(f"{run_dir} already holds a run: continue it with --resume {run_dir}, or pick another checkpoint.name")
        d.mkdir(parents=True, exist_ok=True)
        (d / "rayft.yaml").write_text(dump_config(cfg))
        return None
    if not d.is_dir():
        raise TrainError(f"--resume {resume}: no run directory at {run_dir}")
    for c in checkpoint_dirs(d):
        if not is_complete(c):
            console.print(Text.assemble(("warning", "yellow"), f": skipping incomplete checkpoint {c} (interrupted save?)"))
    if not find_checkpoints(d):
        raise TrainError(f"--resume {resume}: no complete checkpoint in {run_dir}")

    def report(check: CheckpointCheck) -> None:
        label = ("note", "cyan") if check.status == "unverifiable" else ("warning", "yellow")
        console.print(Text.assemble(label, f": {check.remark()}"), highlight=False)

    found = newest_intact(d, report)
    if found is None:
        raise TrainError(f"--resume {resume}: no intact checkpoint in {run_dir} (every complete one is corrupt)")
    console.print(f"resuming {run_dir} from its checkpoint of step {found[0]}", highlight=False)
    return str(found[1])


def copy_skipped_records(src: str, run_dir: str) -> None:
    """Copy the token store's ``skipped_records.jsonl`` (every record ``data.on_bad_record: skip``
    skipped: where, kind, reason) into a local run directory."""
    import pyarrow.fs as pafs

    from rayft.data.sources import arrow_fs

    fs, path = arrow_fs(src)
    pafs.copy_files(path, str(Path(run_dir) / "skipped_records.jsonl"), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def newest_remote_state(run_dir: str) -> tuple[str, dict] | None:
    """On object storage (``s3://``): the newest checkpoint directory of ``run_dir`` that has its
    state file (written last: complete) and that file's fields, as ``(its URI, fields)``; None when
    there is none. Ray Train resumes from its newest registered checkpoint, which is this one unless
    the run died between writing a checkpoint and registering it.

    Raises:
        TrainError: the storage cannot be listed or read (the message names the run directory), or
            the state file is not JSON (the message names it).
    """
    import pyarrow.fs as pafs

    from rayft.data.sources import arrow_fs
    from rayft.train.checkpoint_files import STATE_FILE, step_of_dir

    scheme = run_dir.split("://", 1)[0] + "://"
    try:
        fs, root = arrow_fs(run_dir)
        found = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        dirs = sorted((i.path for i in found if i.type == pafs.FileType.Directory and step_of_dir(i.path) >= 0), key=step_of_dir)
        for d in reversed(dirs):
            state_file = f"{d}/{STATE_FILE}"
            if fs.get_file_info(state_file).type != pafs.FileType.File:
                continue  # an interrupted save
            with fs.open_input_stream(state_file) as f:
                raw = f.read()
            try:
                return scheme + d, json.loads(raw)
            except ValueError as e:
                raise TrainError(f"--resume {run_dir}: {scheme}{state_file} is not a JSON state file ({e})") from None
    except OSError as e:
        raise TrainError(f"--resume {run_dir}: cannot read its checkpoints ({e})") from None
    return None


def check_resume_data(checkpoint: str, data_fingerprint: str, state: dict | None = None) -> None:
    """Refuse, before any worker trains or touches a GPU, to resume ``checkpoint`` with other training data (the
    workers check it again after a restart). ``state``: its state file's fields, when already read
    (else read here, from a local or mounted directory).

    Raises:
        TrainError: the checkpoint's recorded data fingerprint differs from ``data_fingerprint``.
    """
    from rayft.train.checkpoint import CheckpointError, check_same_data, read_state

    try:
        check_same_data(checkpoint, (state if state is not None else read_state(checkpoint)).get("data_fingerprint"), data_fingerprint)
    except CheckpointError as e:
        raise TrainError(str(e)) from None


def check_resume_steps(checkpoint: str, total_steps: int, state: dict | None = None) -> None:
    """Refuse, before any worker trains or touches a GPU, a ``--resume`` with nothing to train: a checkpoint that
    already holds all ``total_steps`` steps of the run; and one that holds the model only
    (``checkpoint.final_model_only``), which has no optimizer state to continue with. ``state``: as
    for :func:`check_resume_data`.

    Raises:
        TrainError: either, naming the checkpoint and what to do instead; or a state file whose
            ``contents`` is neither rayft's model-only nor its full value.
    """
    from rayft.train.checkpoint_files import MODEL_AND_OPTIMIZER, MODEL_ONLY, STATE_FILE, holds_optimizer, model_only_refusal, read_state

    state = state if state is not None else read_state(checkpoint)
    if state.get("contents", MODEL_AND_OPTIMIZER) not in (MODEL_ONLY, MODEL_AND_OPTIMIZER):
        raise TrainError(
            f"--resume: {checkpoint}/{STATE_FILE}: contents {state['contents']!r} is neither {MODEL_ONLY!r} nor {MODEL_AND_OPTIMIZER!r}"
        )
    if state["step"] >= total_steps:
        raise TrainError(
            f"--resume: {checkpoint} already holds step {state['step']} of this run's {total_steps}: nothing to train "
            "(raise train.max_steps or train.epochs to train further; `rayft export RUN_DIR` writes its model)"
        )
    if not holds_optimizer(state):
        raise TrainError(model_only_refusal(checkpoint, state["step"], total_steps))


class MetricsLog:
    """``rayft_metrics.jsonl`` written as steps arrive (one JSON line each, flushed), so that any
    stop keeps them; :func:`write_run_records` rewrites it at the end without re-run steps. A new
    run (``resumed_step`` None) starts the file empty; a run resumed from the checkpoint of step
    ``resumed_step`` keeps the earlier lines up to that step and drops those after it (the steps it
    runs again), then appends."""

    def __init__(self, run_dir: str, resumed_step: int | None):
        self.path = Path(run_dir) / "rayft_metrics.jsonl"
        if resumed_step is None or not self.path.exists():
            self.path.write_text("")
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a hard stop: dropped
            if step <= resumed_step:
                kept.append(line + "\n")
        self.path.write_text("".join(kept))

    def append(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def write_metrics(run_dir: str, history: list[dict], resumed: bool) -> None:
    """Rewrite ``rayft_metrics.jsonl`` from ``history`` (the latest record of each step); a resumed
    run keeps the original run's lines before its first step."""
    metrics_file = Path(run_dir) / "rayft_metrics.jsonl"
    earlier = [json.loads(x) for x in metrics_file.read_text().splitlines()] if resumed and metrics_file.exists() else []
    first = history[0]["step"] if history else float("inf")
    merged = [h for h in earlier if h["step"] < first] + history  # a resumed run keeps the original curve
    replace_text(metrics_file, "".join(json.dumps(h) + "\n" for h in merged))


def write_run_records(run_dir: str, history: list[dict], summary: dict, resumed: bool) -> None:
    """Write ``rayft_metrics.jsonl`` (:func:`write_metrics`) and ``rayft_summary.json`` into a local ``run_dir``."""
    write_metrics(run_dir, history, resumed)
    replace_text(Path(run_dir) / "rayft_summary.json", json.dumps(summary, indent=2))


def replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and ``os.replace``: a write that
    fails (a full disk) leaves the old file whole, where ``write_text`` would have emptied it first."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

"""A checkpoint directory on disk: its state file, whether it is complete, and whether its files
still hold the bytes that were written (checked against the digests its state file records).

The directory ``checkpoint_NNNNNNN`` holds every rank's DCP shard files (``__R_I.distcp``), the DCP
``.metadata``, the model's ``config.json`` and ``rayft_state.json`` (:data:`STATE_FILE`), written
last. Nothing here raises for a bad checkpoint: :func:`verify_checkpoint` returns a verdict
(:class:`CheckpointCheck`) whose ``problem`` the caller raises or prints.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rayft.train.digests import ALGORITHM, Mismatch, compare

STATE_FILE = "rayft_state.json"


def why_incomplete(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a finished checkpoint (no state file, no readable DCP metadata, a shard
    file the metadata names absent or shorter than its data), or None when it is one."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        return f"no {STATE_FILE} (interrupted save?)"
    if not (path / ".metadata").is_file():
        return "no .metadata"
    import torch.distributed.checkpoint as dcp  # here: the driver imports this module before any checkpoint exists

    try:
        meta = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as e:
        return f".metadata unreadable ({type(e).__name__})"
    need: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for f, n in sorted(need.items()):
        if not (path / f).is_file():
            return f"{f} is missing"
        if (path / f).stat().st_size < n:
            return f"{f} is shorter than its data ({(path / f).stat().st_size} < {n} bytes)"
    return None


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a finished checkpoint: the state file (written last), the DCP
    metadata, and every shard file the metadata names, each at least as long as its data."""
    return why_incomplete(path) is None


def read_state(path: str | os.PathLike) -> dict:
    with open(Path(path) / STATE_FILE) as f:
        return json.load(f)


#: the state file's ``contents`` of a checkpoint without the optimizer's state (``checkpoint.final_model_only``)
MODEL_ONLY = "model"
#: ... and of a full one (a state file without ``contents``, from an earlier rayft, is full too)
MODEL_AND_OPTIMIZER = "model+optimizer"


def holds_optimizer(state: dict) -> bool:
    """Whether a checkpoint whose state file holds ``state`` has the optimizer's state (a run can
    resume training from it), not only the model's weights."""
    return state.get("contents", MODEL_AND_OPTIMIZER) != MODEL_ONLY


def model_only_refusal(path: str | os.PathLike, step: int, total_steps: int) -> str:
    """Why no run of ``total_steps`` steps can continue from the model-only checkpoint ``path`` of ``step``."""
    return (
        f"{path} holds the model's weights only (checkpoint.final_model_only): it has no optimizer state, so training "
        f"cannot continue from its step {step} to {total_steps}; start a new run from its export instead "
        "(model.name_or_path: the run's hf/ directory, or `rayft export` of this checkpoint), or, to go on with the "
        "optimizer's state, move this checkpoint out of the run directory so that --resume takes an earlier, full one"
    )


def step_of_dir(path: str | os.PathLike) -> int:
    """The step in a checkpoint directory's name (``checkpoint_0000040`` → 40), -1 for another name."""
    tail = Path(path).name.rpartition("_")[2]
    return int(tail) if tail.isdigit() else -1


def directory_bytes(path: str | os.PathLike) -> int:
    """Bytes in the files directly inside ``path`` (a checkpoint directory is flat); stat only."""
    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())


@dataclass(frozen=True)
class CheckpointCheck:
    """What :func:`verify_checkpoint` found in one checkpoint directory.

    ``status`` is ``"intact"`` (``files`` files hashed, each matching the digest its state file
    records), ``"corrupt"`` (``mismatches``: the files whose bytes differ, or ``detail``),
    ``"incomplete"`` (``detail`` says what is missing) or ``"unverifiable"`` (complete, but its state
    file records no digests: written by an earlier rayft; ``detail`` says so). ``step``: the state file's, else the
    directory name's.
    """

    path: Path
    step: int
    status: str
    files: int = 0
    detail: str = ""
    mismatches: tuple[Mismatch, ...] = ()

    @property
    def problem(self) -> str | None:
        """Why a corrupt or incomplete checkpoint is refused (the directory, each bad file, its
        expected and its actual digest); None for an intact or unverifiable one."""
        if self.status == "corrupt":
            what = "; ".join(f"{self.path / m.file}: expected {ALGORITHM} {m.expected}, got {m.got}" for m in self.mismatches)
            return f"checkpoint {self.step} is corrupt ({what or f'{self.path}: {self.detail}'})"
        if self.status == "incomplete":
            return f"checkpoint {self.step} is incomplete ({self.path}: {self.detail})"
        return None

    def remark(self) -> str:
        """The sentence a resume prints about a checkpoint it skips (corrupt, incomplete) or cannot verify."""
        if self.status == "unverifiable":
            return f"checkpoint {self.step} ({self.path}) cannot be verified: {self.detail}"
        return f"{self.problem}: skipping it" if self.problem else f"checkpoint {self.step} ({self.path}) is intact"

    def line(self) -> str:
        """One line of ``rayft checkpoint verify``."""
        head = f"step {self.step} ({self.path.name}): {self.status}"
        if self.status == "intact":
            return f"{head} ({self.files} files match their {ALGORITHM} digests)"
        if self.status == "corrupt" and self.mismatches:
            return f"{head}: " + "; ".join(f"{m.file} expected {m.expected}, got {m.got}" for m in self.mismatches)
        return f"{head}: {self.detail}"


def verify_checkpoint(path: str | os.PathLike) -> CheckpointCheck:
    """Check one checkpoint directory: complete (:func:`why_incomplete`), then every file its state
    file records a digest for hashed again and compared (the whole checkpoint read once, files in
    parallel; see ``docs/checkpoints.md`` for the time per GB). A file the DCP metadata names
    without a recorded digest makes the checkpoint corrupt: every byte a load reads is checked.
    A bad checkpoint is reported in the verdict, never raised."""
    path = Path(path)
    step = step_of_dir(path)
    if (why := why_incomplete(path)) is not None:
        return CheckpointCheck(path, step, "incomplete", detail=why)
    try:
        state = read_state(path)
    except (OSError, ValueError) as e:
        return CheckpointCheck(path, step, "corrupt", detail=f"{STATE_FILE} unreadable ({e})")
    step = int(state.get("step", step))
    expected = state.get("digests")
    if expected is None:
        return CheckpointCheck(path, step, "unverifiable", detail=f"its {STATE_FILE} records no digests (written by an earlier rayft)")
    if state.get("digest_algorithm") != ALGORITHM:
        detail = f"its {STATE_FILE} records {state.get('digest_algorithm')} digests, this rayft checks {ALGORITHM}"
        return CheckpointCheck(path, step, "unverifiable", detail=detail)
    unlisted = sorted(set(dcp_files(path)) - set(expected))
    if unlisted:
        return CheckpointCheck(path, step, "corrupt", detail=f"no recorded digest for {', '.join(unlisted)}")
    bad = compare(path, expected)
    return CheckpointCheck(path, step, "corrupt" if bad else "intact", files=len(expected), mismatches=tuple(bad))


def dcp_files(path: str | os.PathLike) -> list[str]:
    """Every file DCP reads to load the checkpoint at ``path``: ``.metadata`` and the shard files it names."""
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(path)).read_metadata()
    return sorted({".metadata", *(info.relative_path for info in (meta.storage_data or {}).values())})


def newest_intact(
    run_dir: str | os.PathLike, report: Callable[[CheckpointCheck], None], trusted: str | os.PathLike | None = None
) -> tuple[int, Path] | None:
    """The newest complete checkpoint of ``run_dir`` that is not corrupt, as (step, path), or None.

    Each candidate, newest first, is verified (:func:`verify_checkpoint`); ``report`` receives every
    corrupt one skipped and an unverifiable one taken. ``trusted`` (a checkpoint verified moments
    ago, e.g. by the driver for ``--resume``) is taken without reading it again."""
    for step, path in reversed(find_checkpoints(run_dir)):
        if trusted is not None and Path(trusted) == path:
            return step, path
        check = verify_checkpoint(path)
        if check.status in ("corrupt", "incomplete"):
            report(check)
            continue
        if check.status == "unverifiable":
            report(check)
        return step, path
    return None


def free_space_warning(directory: str | os.PathLike, need_bytes: int) -> str | None:
    """A warning when the file system holding ``directory`` (or its nearest existing parent) has
    fewer free bytes than ``need_bytes`` (the last checkpoint's size), else None. For local and
    mounted file systems (``shutil.disk_usage``)."""
    where = Path(directory)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if free >= need_bytes:
        return None
    return (
        f"{directory} has {free / 1e9:.2f} GB free but the last checkpoint took {need_bytes / 1e9:.2f} GB: "
        "this one may not fit (a failed save removes its partial directory)"
    )


def last_checkpoint_bytes(run_dir: str | os.PathLike) -> int | None:
    """The size in bytes of the newest complete checkpoint of ``run_dir``, None when it has none."""
    done = find_checkpoints(run_dir) if Path(run_dir).is_dir() else []
    return directory_bytes(done[-1][1]) if done else None


def checkpoint_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint_*`` directories of a run, by name (complete or not); files such as Ray
    Train's ``checkpoint_manager_snapshot.json`` are not checkpoints."""
    return sorted(d for d in Path(run_dir).glob("checkpoint_*") if d.is_dir())


def find_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first. Incomplete ones are skipped."""
    out = []
    for d in checkpoint_dirs(run_dir):
        if is_complete(d):
            out.append((int(read_state(d)["step"]), d))
    return sorted(out)

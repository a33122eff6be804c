"""Which Hugging Face model directory a command means by ``RUN_DIR|HF_DIR [--step N]``.

An HF directory (``config.json`` and weights) is itself. A run directory means its end-of-run
export ``RUN/hf``; with ``--step N``, or without an ``hf`` export, a checkpoint (step N, else the
newest complete one) exported on the fly into a temporary directory with the export code of
``rayft export`` (:func:`rayft.train.checkpoint.export_run`: digests checked first), removed after.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rayft.evals import EvalError


@dataclass(frozen=True)
class ModelDir:
    """``path``: the HF model directory; ``run_dir``: the run it belongs to (None for a plain HF
    directory); ``step``: the training step of its weights when known."""

    path: Path
    run_dir: Path | None
    step: int | None


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model directory: ``config.json`` beside safetensors or bin weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors")) | any(path.glob("pytorch_model*.bin"))


def _run_of(hf: Path) -> Path | None:
    """The run directory an export sits in (``RUN/hf``: its parent holds ``rayft.yaml``)."""
    return hf.parent if (hf.parent / "rayft.yaml").is_file() else None


def _summary_step(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "rayft_summary.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def open_model_dir(target: str, step: int | None = None, say: Callable[[str], None] | None = None) -> Iterator[ModelDir]:
    """The HF model directory ``target`` (a run directory or an HF directory) and ``step`` mean;
    a checkpoint's temporary export lives until the ``with`` block ends.

    Raises:
        EvalError: no such directory, an HF directory given ``--step``, a directory that is
            neither, or a checkpoint that cannot be exported (missing step, corrupt files).
    """
    from rayft.train.checkpoint import CheckpointError, export_run, find_checkpoints

    p = Path(target).expanduser()
    if not p.is_dir():
        raise EvalError(f"{target}: no such directory (give a run directory or a Hugging Face model directory)")
    if is_hf_dir(p):
        if step is not None:
            raise EvalError(f"{target} is a Hugging Face model directory: --step needs a run directory (with checkpoint_* directories)")
        run = _run_of(p.resolve())
        yield ModelDir(p, run, _summary_step(run) if run and p.name == "hf" else None)
        return
    if not (p / "rayft.yaml").is_file() and not any(p.glob("checkpoint_*")):
        raise EvalError(
            f"{target}: neither a run directory (rayft.yaml, checkpoint_*) nor a Hugging Face model directory (config.json + weights)"
        )
    if step is None and is_hf_dir(p / "hf"):
        yield ModelDir(p / "hf", p, _summary_step(p))
        return
    if step is None:  # no end-of-run export: the newest complete checkpoint
        done = find_checkpoints(p)
        if not done:
            raise EvalError(f"{target}: no Hugging Face export (hf/) and no complete checkpoint in this run")
        step = done[-1][0]
    with tempfile.TemporaryDirectory(prefix="rayft-eval-") as tmp:
        try:
            out = export_run(str(p), step=step, out=Path(tmp) / "hf", say=say)
        except CheckpointError as e:
            raise EvalError(str(e)) from None
        if say:
            say(f"exported the checkpoint of step {step} to {out} (removed after the evaluation)")
        yield ModelDir(out, p, step)

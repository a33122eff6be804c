"""`rayft export`: a consolidated Hugging Face model from a run's checkpoint (:func:`rayft.train.checkpoint.export_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import console, print_error, say


def export(
    run: Annotated[str, typer.Argument(help="Run directory (storage_path/name).")],
    step: Annotated[Optional[int], typer.Option(help="Checkpoint step (default: latest complete).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: RUN/hf-stepN, N the checkpoint's step).")] = None,
) -> None:
    """Write a consolidated Hugging Face model (safetensors + config + tokenizer) from a checkpoint, its digests checked first."""
    from rayft.train.checkpoint import CheckpointError, export_run

    try:
        path = export_run(run, step=step, out=out, say=say)
    except CheckpointError as e:
        print_error("error", e)
        raise typer.Exit(1) from None
    console.print(f"exported Hugging Face model to {path}")

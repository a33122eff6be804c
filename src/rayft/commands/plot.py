"""`rayft plot`: runs' curves in one PNG (:func:`rayft.train.plot.plot_runs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import fail, say


def plot(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (each with its rayft_metrics.jsonl).")],
    out: Annotated[
        Optional[Path], typer.Option(help="The PNG to write (default: RUN/rayft_plot.png for one run, rayft_plot.png here for several).")
    ] = None,
) -> None:
    """Plot loss (and eval loss), tokens/s and GPU memory against step for one or more runs, on shared axes."""
    from rayft.train.errors import TrainError
    from rayft.train.plot import plot_runs

    target = out or (runs[0] / "rayft_plot.png" if len(runs) == 1 else Path("rayft_plot.png"))
    try:
        path = plot_runs(runs, target)
    except TrainError as e:
        fail(str(e))
    say(f"wrote {path}")

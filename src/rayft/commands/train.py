"""`rayft train`: load the config, then :func:`rayft.train.driver.run_training`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit, print_error


def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue a stopped run: its name or run directory.")] = None,
) -> None:
    """Fine-tune: connect to Ray (RAY_ADDRESS / ray.address) or start an embedded local Ray, then train."""
    cfg = load_config_or_exit(config, set_)
    from rayft.train.driver import TrainError, run_training

    try:
        run_training(cfg, resume=resume, console=console)
    except TrainError as e:
        print_error("error", e)
        raise typer.Exit(1) from None

"""`rayft train`: load the config, then :func:`rayft.train.driver.run_training`."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit, print_error


def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue a stopped run: its name or run directory.")] = None,
) -> None:
    """Fine-tune: connect to Ray (RAY_ADDRESS / ray.address) or start an embedded local Ray, then train.

    SIGTERM or Ctrl-C stops at the next step boundary with a checkpoint (checkpoint.on_signal),
    prints the --resume command and exits 143 or 130.
    """
    cfg = load_config_or_exit(config, set_)
    from rayft.train.driver import TrainError, TrainStopped, run_training

    try:
        run_training(cfg, resume=resume, console=console)
    except TrainError as e:
        print_error("error", e)
        raise typer.Exit(1) from None
    except TrainStopped as e:
        console.print(str(e), highlight=False, markup=False)
        if e.checkpoint_step is not None:
            again = ["rayft", "train", str(config), *(a for kv in set_ or [] for a in ("--set", kv)), "--resume", e.run_dir]
            console.print(f"resume with: {shlex.join(again)}", highlight=False, markup=False)
        if e.forced:  # the workers may still be running: do not wait for Ray's shutdown at exit
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        raise typer.Exit(e.exit_code) from None

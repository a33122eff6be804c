"""`rayft train`: load the config, check that its local data files exist, then
:func:`rayft.train.driver.run_training`."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit, print_error
from rayft.config import RayftConfig


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
    check_local_data_files(cfg)
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


def check_local_data_files(cfg: RayftConfig) -> None:
    """Expand ``data.train_files`` and ``data.validation_files`` that are local paths or globs
    (:func:`rayft.data.sources.expand_files`) before Ray or torch is imported, so a missing file
    fails in a second rather than after Ray has started; ``s3://`` URIs are listed later, with
    the data. On a :class:`~rayft.data.examples.DataError`, print it and exit 1 (as the same error
    found later would)."""
    from rayft.data.examples import DataError
    from rayft.data.sources import expand_files

    for key, patterns in (("data.train_files", cfg.data.train_files), ("data.validation_files", cfg.data.validation_files or [])):
        try:
            expand_files([p for p in patterns if not p.startswith("s3://")])
        except DataError as e:
            print_error("error", DataError(str(e).replace("(data.train_files)", f"({key})"), kind=e.kind))
            raise typer.Exit(1) from None

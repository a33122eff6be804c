"""`rayft config show`: the resolved config, defaults filled in and overrides applied."""

from __future__ import annotations

import sys

import typer

from rayft.commands.common import ConfigArg, SetOpt, load_config_or_exit
from rayft.config_load import dump_config

config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)


@config_app.command("show")
def config_show(config: ConfigArg, set_: SetOpt = None) -> None:
    """Print the resolved config (defaults filled in, overrides applied)."""
    cfg = load_config_or_exit(config, set_)
    sys.stdout.write(dump_config(cfg))

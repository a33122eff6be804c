"""What the commands share: the stderr console, the CONFIG argument and ``--set`` option, loading a
config (exit 2 on a config error) and printing an error."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from rayft.config import ConfigError, RayftConfig
from rayft.config_load import load_config

console = Console(stderr=True, soft_wrap=True)  # long paths and messages stay on one line (copy-pasteable)

ConfigArg = Annotated[Path, typer.Argument(help="The job's YAML config file.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a key, e.g. --set train.max_steps=100 (repeatable).")]


def print_error(label: str, err: BaseException) -> None:
    """Print an error without interpreting its text as Rich markup (paths like ``[/a/b.cc:5]``); the
    ANSI colours in it (Ray's, around a worker's name) are decoded, not printed as escape codes.
    Only a text with an escape code is decoded: rich's decoder keeps what follows a line's last
    ``\r``, which would drop the start of a CRLF line."""
    text = str(err)
    body = Text.from_ansi(text.replace("\r\n", "\n")) if "\x1b" in text else text
    console.print(Text.assemble((label, "bold red"), ": ", body), highlight=False)


def load_config_or_exit(path: Path, overrides: list[str] | None) -> RayftConfig:
    """The config at ``path`` with ``overrides`` applied; on a config error, print it and exit 2."""
    try:
        return load_config(path, overrides or [])
    except ConfigError as e:
        print_error("config error", e)
        raise typer.Exit(2) from None


def say(msg: str) -> None:
    """One line of progress on stderr, printed as is (no markup, no highlighting, never wrapped)."""
    console.print(msg, highlight=False, markup=False, soft_wrap=True)


def fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``error: msg`` (its text escaped, never wrapped) and exit with ``code``."""
    console.print(f"[bold red]error[/]: {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None

"""`rayft checkpoint verify`: check a run's checkpoints against the digests their state files record
(:func:`rayft.train.checkpoint.verify_run`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rayft.commands.common import print_error

checkpoint_app = typer.Typer(help="Check a run's checkpoints.", no_args_is_help=True)


@checkpoint_app.command("verify")
def verify(
    run: Annotated[str, typer.Argument(help="Run directory (storage_path/name).")],
    step: Annotated[Optional[int], typer.Option(help="Check only the checkpoint of this step (default: every one).")] = None,
) -> None:
    """Hash every file of each checkpoint and compare it with the digest recorded when it was written.

    One line per checkpoint on stdout (intact, corrupt, incomplete, unverifiable); exit 1 if any is corrupt or incomplete.
    """
    from rayft.train.checkpoint import CheckpointError, verify_run

    try:
        checks = verify_run(run, step)
    except CheckpointError as e:
        print_error("error", e)
        raise typer.Exit(1) from None
    for check in checks:
        typer.echo(check.line())
    if any(c.status in ("corrupt", "incomplete") for c in checks):
        raise typer.Exit(1)

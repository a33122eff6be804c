"""`rayft cluster local up|down|status`: thin commands over local.py (a multi-node Ray cluster on this machine)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import console, fail, say

StateDirOpt = Annotated[
    Optional[Path],
    typer.Option(help="State dir (token, node temp dirs); default $RAYFT_LOCAL_CLUSTER_DIR or ~/.cache/rayft/local-cluster."),
]

local_app = typer.Typer(
    help="A real multi-node Ray cluster on this machine (head + N worker nodes, token auth, 127.0.0.1).",
    no_args_is_help=True,
)


def _exports(c) -> None:
    sys.stdout.write(f"export RAY_ADDRESS={c.dashboard_url}\nexport RAY_AUTH_TOKEN_PATH={c.token_file}\n")


@local_app.command("up")
def local_up(
    workers: Annotated[int, typer.Option(help="Worker nodes besides the head.", min=0)] = 2,
    cpus_per_worker: Annotated[int, typer.Option(help="CPUs each worker node offers to Ray.", min=1)] = 1,
    head_cpus: Annotated[int, typer.Option(help="CPUs the head offers (0: no tasks on the head).", min=0)] = 0,
    state_dir: StateDirOpt = None,
) -> None:
    """Start the head (num-gpus 0) and N worker nodes, each its own `ray start`; a second run reports the running one.

    Prints `export RAY_ADDRESS=...` and `export RAY_AUTH_TOKEN_PATH=...` on stdout.
    """
    from rayft.cluster import local

    try:
        c, created = local.up(
            workers=workers,
            cpus_per_worker=cpus_per_worker,
            head_cpus=head_cpus,
            state_dir=state_dir,
            say=lambda s: console.print(s, style="dim", markup=False, highlight=False, soft_wrap=True),
        )
    except local.LocalClusterError as e:
        fail(str(e))
    if created:
        say(f"local Ray cluster up: {len(c.nodes)} nodes (head + {len(c.nodes) - 1} workers), token auth on")
    else:
        say(f"local Ray cluster already running ({len(c.nodes)} nodes); nothing changed")
    say(f"dashboard / job server: {c.dashboard_url}   GCS: {c.gcs_address}   token file: {c.token_file}")
    _exports(c)


@local_app.command("status")
def local_status(state_dir: StateDirOpt = None) -> None:
    """Whether the recorded local cluster answers, and how many of its nodes are alive. Exit 1 when none runs."""
    from rayft.cluster import local

    c = local.load_state(state_dir)
    if c is None:
        say("no local Ray cluster recorded")
        raise typer.Exit(1)
    n = local.alive_nodes(c)
    if n is None:
        say(f"local Ray cluster at {c.dashboard_url} does not answer (`rayft cluster local down` cleans it up)")
        raise typer.Exit(1)
    say(f"local Ray cluster at {c.dashboard_url}: {n} of {len(c.nodes)} nodes alive")
    _exports(c)


@local_app.command("down")
def local_down(state_dir: StateDirOpt = None) -> None:
    """Stop every process of the local cluster (never `ray stop`: that would kill other Ray instances too)."""
    from rayft.cluster import local

    had, left = local.down(state_dir, say=say)
    if not had:
        say("no local Ray cluster is recorded; nothing to stop")
        return
    if left:
        console.print("[bold yellow]still running:[/]", highlight=False)
        for pid, cmd in sorted(left.items()):
            sys.stdout.write(f"{pid}\t{cmd[:200]}\n")
        raise typer.Exit(1)
    say("local Ray cluster stopped; no process left")

"""`rayft submit` and `rayft cluster local up|down|status`: thin commands over submit.py and local.py.

`rayft.cluster.aws_cli` owns the `cluster` group; :func:`register` adds `local` to that group (or
creates the group when aws_cli is absent). Like aws_cli, the shared CLI pieces are imported from
rayft.cli at the bottom of this module.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

StateDirOpt = Annotated[
    Optional[Path],
    typer.Option(help="State dir (token, node temp dirs); default $RAYFT_LOCAL_CLUSTER_DIR or ~/.cache/rayft/local-cluster."),
]

local_app = typer.Typer(
    help="A real multi-node Ray cluster on this machine (head + N worker nodes, token auth, 127.0.0.1).",
    no_args_is_help=True,
)


def _say(msg: str) -> None:
    console.print(msg, highlight=False, markup=False, soft_wrap=True)


def _fail(msg: str, code: int = 1) -> None:
    console.print(f"[bold red]error[/]: {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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
        c, created = local.up(workers=workers, cpus_per_worker=cpus_per_worker, head_cpus=head_cpus,
                              state_dir=state_dir, say=lambda s: console.print(s, style="dim", markup=False, highlight=False, soft_wrap=True))  # fmt: skip
    except local.LocalClusterError as e:
        _fail(str(e))
    if created:
        _say(f"local Ray cluster up: {len(c.nodes)} nodes (head + {len(c.nodes) - 1} workers), token auth on")
    else:
        _say(f"local Ray cluster already running ({len(c.nodes)} nodes); nothing changed")
    _say(f"dashboard / job server: {c.dashboard_url}   GCS: {c.gcs_address}   token file: {c.token_file}")
    _exports(c)


@local_app.command("status")
def local_status(state_dir: StateDirOpt = None) -> None:
    """Whether the recorded local cluster answers, and how many of its nodes are alive. Exit 1 when none runs."""
    from rayft.cluster import local

    c = local.load_state(state_dir)
    if c is None:
        _say("no local Ray cluster recorded")
        raise typer.Exit(1)
    n = local.alive_nodes(c)
    if n is None:
        _say(f"local Ray cluster at {c.dashboard_url} does not answer (`rayft cluster local down` cleans it up)")
        raise typer.Exit(1)
    _say(f"local Ray cluster at {c.dashboard_url}: {n} of {len(c.nodes)} nodes alive")
    _exports(c)


@local_app.command("down")
def local_down(state_dir: StateDirOpt = None) -> None:
    """Stop every process of the local cluster (never `ray stop`: that would kill other Ray instances too)."""
    from rayft.cluster import local

    had, left = local.down(state_dir, say=_say)
    if not had:
        _say("no local Ray cluster is recorded; nothing to stop")
        return
    if left:
        console.print("[bold yellow]still running:[/]", highlight=False)
        for pid, cmd in sorted(left.items()):
            sys.stdout.write(f"{pid}\t{cmd[:200]}\n")
        raise typer.Exit(1)
    _say("local Ray cluster stopped; no process left")


def submit(
    config: ConfigArg,
    set_: SetOpt = None,
    address: Annotated[
        Optional[str], typer.Option(help="Dashboard URL, e.g. http://127.0.0.1:8265 (default: ray.address, then RAY_ADDRESS).")
    ] = None,
    token_file: Annotated[
        Optional[Path], typer.Option(help="File with the cluster's auth token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ...).")
    ] = None,
    working_dir: Annotated[
        Optional[Path], typer.Option(help="Folder uploaded as the job's working_dir (default: the project root above CONFIG).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Stream the logs until the job ends.")] = True,
) -> None:
    """Submit `rayft train CONFIG` to a running Ray cluster (Ray Jobs API, token auth) and stream its logs.

    Exit status is the job's: 0 SUCCEEDED, 1 FAILED or STOPPED. Ctrl-C asks whether to stop the job.
    """
    from rayft.cluster.submit import SubmitError, run, submit as do_submit

    cfg = _load(config, set_)  # validate locally first: exit 2 on a config error
    try:
        client, sub = do_submit(config, set_ or [], cfg.ray.address, address=address, token_file=token_file,
                                working_dir=working_dir, say=_say)  # fmt: skip
    except SubmitError as e:
        _fail(str(e))
    _say(f"job {sub.job_id} submitted")
    if not wait:
        sys.stdout.write(sub.job_id + "\n")
        return
    code = run(client, sub, confirm=lambda q: typer.confirm(q, default=False, err=True), say=_say)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Attach `submit`, and `local` under the `cluster` group (aws_cli's when registered, else a new one)."""
    app.command("submit")(submit)
    for g in app.registered_groups:
        if g.name == "cluster" and g.typer_instance is not None:
            g.typer_instance.add_typer(local_app, name="local")
            return
    cluster_app = typer.Typer(help="Ray clusters rayft can start.", no_args_is_help=True)
    cluster_app.add_typer(local_app, name="local")
    app.add_typer(cluster_app, name="cluster")


# Last, on purpose: see rayft.cluster.aws_cli's docstring.
from rayft.cli import ConfigArg, SetOpt, _load, console  # noqa: E402

"""`rayft capacity` and `rayft cluster plan|up|status|down`: thin commands over capacity.py and eks.py.

The `cluster` group also holds `rayft cluster local ...` (:mod:`rayft.commands.cluster_local`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table

from rayft.commands.cluster_local import local_app
from rayft.commands.common import ConfigArg, SetOpt, console, fail, load_config_or_exit, say

YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Answer yes to every confirmation.")]
WorkdirOpt = Annotated[
    Optional[Path], typer.Option(help="Where rendered eksctl files go (default: .rayft/<cluster name> beside the config).")
]


def _cluster(path: Path, overrides: list[str] | None):
    cfg = load_config_or_exit(path, overrides)  # exit 2 on a config error
    if cfg.cluster is None:
        console.print(f"[bold red]config error[/]: {path}: no `cluster:` section; add one to use EKS", highlight=False)
        raise typer.Exit(2)
    return cfg.cluster


def _workdir(config: Path, name: str, workdir: Path | None) -> Path:
    return workdir if workdir is not None else config.resolve().parent / ".rayft" / name


def _confirm(yes: bool):
    return (lambda q: True) if yes else (lambda q: typer.confirm(q, default=False, err=True))


def _context(cluster, workdir: Path, yes: bool):
    from rayft.cluster.capacity import boto3_clients
    from rayft.cluster.eks import Context
    from rayft.cluster.runner import SubprocessRunner

    return Context(
        cfg=cluster,
        runner=SubprocessRunner(echo=lambda s: console.print(s, style="dim", highlight=False, markup=False)),
        clients=boto3_clients(),
        say=say,
        confirm=_confirm(yes),
        workdir=workdir,
    )


def _notes(e: BaseException) -> str:
    """What was attached to ``e`` while handling it (e.g. a failed cleanup), one line per note."""
    return "".join(f"\n{n}" for n in getattr(e, "__notes__", ()))


def _fail_with(e: BaseException, code: int = 1) -> NoReturn:
    """Print ``e`` (and its notes) as the command's error and exit with ``code``."""
    text = str(e) or ("interrupted" if isinstance(e, KeyboardInterrupt) else type(e).__name__)
    fail(text + _notes(e), code)  # never wrapped, so printed commands stay copy-pasteable


def _errors() -> tuple[type[BaseException], ...]:
    """What a lifecycle command reports as an error (exit 1) instead of a traceback."""
    from botocore.exceptions import BotoCoreError, ClientError

    from rayft.cluster.capacity import ReservationLeak
    from rayft.cluster.eks import LifecycleError
    from rayft.cluster.runner import CommandError

    return (LifecycleError, CommandError, ReservationLeak, ClientError, BotoCoreError)


def capacity(
    config: ConfigArg,
    set_: SetOpt = None,
    region: Annotated[
        Optional[list[str]],
        typer.Option("--region", "-r", help="Region to search (repeatable; default: cluster.aws.capacity_regions or region)."),
    ] = None,
    probe: Annotated[
        bool,
        typer.Option(help="Definitive check: create a targeted capacity reservation per AZ and cancel it at once (billed for seconds)."),
    ] = False,
    yes: YesOpt = False,
) -> None:
    """Where N × the GPU type can launch: offered AZs, vCPU quota headroom, optional live probe."""
    from rayft.cluster.capacity import boto3_clients, find_capacity, render_report

    c = _cluster(config, set_)
    regions = list(region or c.aws.capacity_regions or [c.aws.region])
    if (
        probe
        and not yes
        and not typer.confirm(
            f"--probe reserves {c.num_nodes} × {c.instance_type} On-Demand per candidate AZ and cancels it at once "
            "(billed for the seconds it exists). Proceed?",
            default=False,
            err=True,
        )
    ):
        probe = False
    try:
        report = find_capacity(
            boto3_clients(),
            c.instance_type,
            c.num_nodes,
            regions,
            availability_zones=c.aws.availability_zones,
            capacity_type=c.aws.capacity_type,
            probe=probe,
            tags={"rayft.io/cluster": c.name},
            say=say,
        )
    except _errors() as e:
        _fail_with(e)
    except KeyboardInterrupt as e:  # the probe cancelled its reservation first; its notes say if it could not
        _fail_with(e, 130)
    shape = report.shape
    title = f"{c.num_nodes} × {c.instance_type} ({c.aws.capacity_type})"
    if shape:
        title += f": {shape.vcpus} vCPU each, need {report.need_vcpus} vCPU; {shape.gpus} GPU; EFA {'yes' if shape.efa_supported else 'no'}"
    rows = render_report(report)
    table = Table(title=title)
    for h in rows[0]:
        table.add_column(h)
    for r in rows[1:]:
        table.add_row(*r)
    Console().print(table)
    for n in report.notes:
        console.print(f"note: {n}", highlight=False, markup=False)
    if report.quota_commands:
        console.print("Quota too low where marked 'quota short'. To request an increase (vCPUs):", highlight=False)
        for cmd in report.quota_commands:
            sys.stdout.write(cmd + "\n")
    best = report.usable()
    if not best:
        console.print(f"[bold red]no region/AZ can take {c.num_nodes} × {c.instance_type} now[/]")
        raise typer.Exit(1)
    b = best[0]
    console.print(f"best: {b.region} / {b.az} ({b.verdict})", highlight=False)


cluster_app = typer.Typer(help="Create, inspect and remove the EKS cluster of the config (idempotent).", no_args_is_help=True)


@cluster_app.command("plan")
def cluster_plan(
    config: ConfigArg,
    set_: SetOpt = None,
    workdir: WorkdirOpt = None,
    az: Annotated[Optional[str], typer.Option(help="Show the GPU node group in this AZ.")] = None,
) -> None:
    """Print every AWS call, eksctl/helm/kubectl command and rendered file `up` would use. Changes nothing."""
    from rayft.cluster.eks_plan import plan, plan_down, render_plan
    from rayft.cluster.runner import missing_tools

    c = _cluster(config, set_)
    missing = missing_tools()
    if missing:
        console.print(f"[yellow]warning[/]: not on PATH: {', '.join(missing)} (`up` needs them)", highlight=False)
    try:
        import boto3

        if boto3.session.Session().get_credentials() is None:
            console.print("[yellow]warning[/]: no AWS credentials found (`up` needs them)", highlight=False)
    except ImportError:
        console.print("[yellow]warning[/]: boto3 is not installed (pip install 'rayft[aws]')", highlight=False)
    sys.stdout.write(render_plan(plan(c, _workdir(config, c.name, workdir), gpu_az=az)))
    sys.stdout.write("## down (reverse order, each only when its probe finds the thing)\n")
    for kind, text in plan_down(c):
        sys.stdout.write(f"  {kind:<7} {text}\n")


@cluster_app.command("up")
def cluster_up(config: ConfigArg, set_: SetOpt = None, yes: YesOpt = False, workdir: WorkdirOpt = None) -> None:
    """Create or resume the cluster, node groups and add-ons; a second run is a no-op."""
    from rayft.cluster.eks import up

    c = _cluster(config, set_)
    try:
        up(_context(c, _workdir(config, c.name, workdir), yes))
    except _errors() as e:
        _fail_with(e)


@cluster_app.command("status")
def cluster_status(config: ConfigArg, set_: SetOpt = None) -> None:
    """Cluster and node groups, allocatable GPU/EFA per node, RayClusters, hourly cost."""
    from rayft.cluster.eks import preflight, status

    c = _cluster(config, set_)
    ctx = _context(c, _workdir(config, c.name, None), False)
    try:
        preflight(ctx, tools=("eksctl", "kubectl"))
        st = status(ctx)
    except _errors() as e:
        _fail_with(e)
    out = Console()
    out.print(f"cluster {c.name} ({c.aws.region}): {st.cluster}", highlight=False)
    for ng, s in st.nodegroups.items():
        out.print(f"  node group {ng}: {s}", highlight=False)
    if st.nodes:
        t = Table(title="nodes")
        for h in ("name", "role", "instance type", "GPU", "EFA", "$/h"):
            t.add_column(h)
        for n in st.nodes:
            price = "?" if n["usd_per_hour"] is None else f"{n['usd_per_hour']:.2f}"
            t.add_row(n["name"], n["role"], n["instance_type"], str(n["gpus"]), str(n["efa"]), price)
        out.print(t)
    for rc in st.rayclusters:
        out.print(f"  RayCluster {rc['namespace']}/{rc['name']}: {rc['state']}", highlight=False)
    if st.hourly_usd is not None:
        extra = f" (not priced: {', '.join(sorted(set(st.unpriced)))})" if st.unpriced else ""
        out.print(f"running cost: ${st.hourly_usd:.2f}/hour On-Demand{extra}", highlight=False)


@cluster_app.command("down")
def cluster_down(
    config: ConfigArg,
    set_: SetOpt = None,
    yes: YesOpt = False,
    delete_untagged: Annotated[
        bool,
        typer.Option(
            "--delete-untagged",
            help="Also delete a cluster that lacks the rayft.io/cluster=<name> tag, i.e. one rayft did not create.",
        ),
    ] = False,
) -> None:
    """Remove add-ons, node groups and the cluster (reverse order); report billable leftovers by tag.

    Refuses a cluster not tagged rayft.io/cluster=<name> (one `up` only reused) unless --delete-untagged.
    """
    from rayft.cluster.eks_down import down

    c = _cluster(config, set_)
    if not yes and not typer.confirm(f"Delete cluster {c.name} in {c.aws.region} and everything `up` created?", default=False, err=True):
        raise typer.Exit(1)
    try:
        left, errors = down(_context(c, _workdir(config, c.name, None), yes), allow_untagged=delete_untagged)
    except _errors() as e:
        _fail_with(e)
    for e in errors:
        console.print(f"[yellow]could not check[/] {e}", highlight=False)
    if left:
        console.print(f"[bold yellow]billable leftovers tagged for {c.name}:[/]", highlight=False)
        for x in left:
            sys.stdout.write(f"{x.kind}\t{x.id}\t{x.detail}\n")
        raise typer.Exit(1)
    console.print(f"cluster {c.name} removed; no billable leftovers found by tag")


cluster_app.add_typer(local_app, name="local")

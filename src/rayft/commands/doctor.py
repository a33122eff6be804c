"""`rayft doctor`: which transport NCCL really used, per rank, from NCCL_DEBUG=INFO logs."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rayft.commands.common import console
from rayft.nccl.doctor import (
    Expect,
    InterNode,
    IntraNode,
    RankVerdict,
    check,
    label_ranks,
    mixed_jobs,
    rank_problem,
    verdicts_from_text,
)


def _read(logs: list[str]) -> list[tuple[str, str]]:
    """``(name, text)`` of each given file (``-`` is stdin), each one run's log, never joined:
    rank numbers only name a process within one job. Exit 2 when one cannot be read."""
    out: list[tuple[str, str]] = []
    for name in logs:
        if name == "-":
            out.append(("<stdin>", sys.stdin.read()))
            continue
        path = Path(name)
        try:
            out.append((name, path.read_text(encoding="utf-8", errors="replace")))
        except OSError as e:
            console.print(f"[bold red]error[/]: cannot read {name}: {e.strerror or e}", highlight=False)
            raise typer.Exit(2) from None
    return out


def _yes_no(b: bool | None) -> str:
    return "—" if b is None else ("on" if b else "off")


def _inter(v: RankVerdict) -> str:
    if v.inter_node == InterNode.EFA:
        return "EFA"
    if v.inter_node == InterNode.LIBFABRIC:
        return f"Libfabric/{v.provider or '?'}"
    if v.inter_node == InterNode.NONE:
        return "— (one host)"
    return v.inter_node.value


def _intra(v: RankVerdict) -> str:
    if v.intra_node in (IntraNode.NONE,):
        return "— (one GPU)"
    if v.intra_detail:
        return v.intra_detail
    return v.intra_node.value


def _table(runs: list[tuple[str, list[RankVerdict]]], failing: set[int]) -> Table:
    """One row per rank; a ``log`` column names the file when several were given, a ``job``
    column the NCCL commId when a file held more than one job."""
    show_log = len(runs) > 1
    show_job = any(mixed_jobs(vs) for _, vs in runs)
    t = Table(title="NCCL transport per rank", title_justify="left")
    cols = (["log"] if show_log else []) + ["rank", "host", "pid"] + (["job"] if show_job else [])
    for col in cols + ["GPU", "inter-node", "intra-node", "GDR", "interface", ""]:
        t.add_column(col, overflow="fold")
    for i, (name, verdicts) in enumerate(runs):
        if i:
            t.add_section()
        for v in verdicts:
            t.add_row(*_row(name, v, failing, show_log, show_job))
    return t


def _row(name: str, v: RankVerdict, failing: set[int], show_log: bool, show_job: bool) -> list[str]:
    gpu = "" if v.cuda_dev is None else f"{v.cuda_dev}" + (f" ({v.bus_id})" if v.bus_id else "")
    mark = "[red]FAIL[/]" if id(v) in failing else "[green]ok[/]"
    if not v.seen:
        mark = "[red]FAIL[/]" if id(v) in failing else "[yellow]unseen[/]"
    row = ([escape(name)] if show_log else []) + [
        "?" if v.rank is None else str(v.rank),
        v.host or "—",
        "—" if v.pid is None else str(v.pid),
    ]
    row += [v.job or "?"] if show_job else []
    return row + [
        gpu,
        _inter(v) if v.seen else "—",
        _intra(v) if v.seen else "—",
        _yes_no(v.gdr),
        v.interface or "—",
        mark,
    ]


def _short_names(names: list[str]) -> list[str]:
    """File names without their folders, unless that makes two of them alike."""
    base = [Path(n).name for n in names]
    return base if len(set(base)) == len(base) else names


def doctor(
    logs: Annotated[
        Optional[list[str]],
        typer.Argument(help="NCCL_DEBUG=INFO log files (raw or Ray driver output); '-' reads stdin."),
    ] = None,
    expect: Annotated[Expect, typer.Option(help="Fail (exit 1) unless every rank used this transport.", case_sensitive=False)] = Expect.ANY,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts as JSON on stdout.")] = False,
) -> None:
    """Say, per rank, which transport NCCL really used (EFA / IB / Socket, P2P / SHM, GPUDirect RDMA).

    Each file is one run's log, read on its own (ranks are matched by number only within a run).

    Exit status, the worst over all files: 0 as expected, 1 some rank did not use the expected
    transport, 2 bad input (unreadable file, a file with no NCCL lines, a file holding more than one job).
    """
    if not logs:
        if sys.stdin.isatty():
            console.print("[bold red]error[/]: give NCCL log files, or '-' to read stdin", highlight=False)
            raise typer.Exit(2)
        logs = ["-"]
    files = _read(logs)
    names = _short_names([name for name, _ in files])
    several = len(files) > 1
    runs: list[tuple[str, list[RankVerdict]]] = []
    rc = 0
    for (name, text), short in zip(files, names):
        verdicts = verdicts_from_text(text)
        if not verdicts:
            where = f"{escape(name)}: " if several else ""
            console.print(
                f"[bold red]error[/]: {where}no NCCL lines found (run with NCCL_DEBUG=INFO and pass the workers' output)",
                highlight=False,
            )
            rc = 2
            continue
        runs.append((short, verdicts))
    if not runs:
        raise typer.Exit(rc)

    failing = {id(v) for _, vs in runs for v in vs if expect != Expect.ANY and rank_problem(v, expect)}
    if as_json:
        rows = [{"log": name, **_jsonable(v)} for name, vs in runs for v in vs]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=180)
        out.print(_table(runs, failing))
        for name, verdicts in runs:
            where = f"{escape(name)}, " if several else ""
            notes: dict[str, list[int]] = {}
            for v in verdicts:
                for n in v.notes:
                    notes.setdefault(n, []).extend([] if v.rank is None else [v.rank])
            for n, ranks in notes.items():
                who = ("rank " if len(set(ranks)) == 1 else "ranks ") + (label_ranks(ranks) or "?")
                console.print(f"[yellow]note[/] ({where}{who}): {escape(n)}", highlight=False)

    for name, verdicts in runs:
        where = f"{escape(name)}: " if several else ""
        mixed = mixed_jobs(verdicts)
        if mixed:
            console.print(f"[bold red]error[/]: {where}{escape(mixed)}", highlight=False)
            rc = 2
        problems = [p for p in check(verdicts, expect) if p != mixed]
        for p in problems:
            console.print(f"[bold red]expected {expect.value}[/]: {where}{escape(p)}", highlight=False)
        if problems:
            rc = max(rc, 1)
    if rc == 0 and expect != Expect.ANY:
        n = sum(len(vs) for _, vs in runs)
        in_logs = f" in {len(runs)} logs" if several else ""
        console.print(f"[green]all {n} ranks{in_logs} used {expect.value}[/]", highlight=False)
    if rc:
        raise typer.Exit(rc)


def _jsonable(v: RankVerdict) -> dict:
    d = asdict(v)
    d["inter_node"] = v.inter_node.value
    d["intra_node"] = v.intra_node.value
    d["causes"] = [c.text for c in v.causes]
    d["seen"] = v.seen
    return d

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

from rayft.nccl.doctor import Expect, InterNode, IntraNode, RankVerdict, check, label_ranks, rank_problem, verdicts_from_text

err = Console(stderr=True)


def _read(logs: list[str]) -> str:
    """Concatenated text of the given files (``-`` is stdin); exit 2 when one cannot be read."""
    parts: list[str] = []
    for name in logs:
        if name == "-":
            parts.append(sys.stdin.read())
            continue
        path = Path(name)
        try:
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            err.print(f"[bold red]error[/]: cannot read {name}: {e.strerror or e}", highlight=False)
            raise typer.Exit(2) from None
    return "\n".join(parts)


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


def _table(verdicts: list[RankVerdict], failing: set[int | None]) -> Table:
    t = Table(title="NCCL transport per rank", title_justify="left")
    for col in ("rank", "host", "pid", "GPU", "inter-node", "intra-node", "GDR", "interface", ""):
        t.add_column(col, overflow="fold")
    for v in verdicts:
        gpu = "" if v.cuda_dev is None else f"{v.cuda_dev}" + (f" ({v.bus_id})" if v.bus_id else "")
        mark = "[red]FAIL[/]" if id(v) in failing else "[green]ok[/]"
        if not v.seen:
            mark = "[red]FAIL[/]" if id(v) in failing else "[yellow]unseen[/]"
        t.add_row(
            "?" if v.rank is None else str(v.rank), v.host or "—", "—" if v.pid is None else str(v.pid), gpu,
            _inter(v) if v.seen else "—", _intra(v) if v.seen else "—", _yes_no(v.gdr),
            v.interface or "—", mark,
        )
    return t


def register(app: typer.Typer) -> None:
    """Add the `doctor` command to the rayft CLI."""

    @app.command()
    def doctor(
        logs: Annotated[
            Optional[list[str]],
            typer.Argument(help="NCCL_DEBUG=INFO log files (raw or Ray driver output); '-' reads stdin."),
        ] = None,
        expect: Annotated[
            Expect, typer.Option(help="Fail (exit 1) unless every rank used this transport.", case_sensitive=False)
        ] = Expect.ANY,
        as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts as JSON on stdout.")] = False,
    ) -> None:
        """Say, per rank, which transport NCCL really used (EFA / IB / Socket, P2P / SHM, GPUDirect RDMA).

        Exit status: 0 as expected, 1 some rank did not use the expected transport, 2 bad input (unreadable file, no NCCL lines).
        """
        if not logs:
            if sys.stdin.isatty():
                err.print("[bold red]error[/]: give NCCL log files, or '-' to read stdin", highlight=False)
                raise typer.Exit(2)
            logs = ["-"]
        verdicts = verdicts_from_text(_read(logs))
        if not verdicts:
            err.print(
                "[bold red]error[/]: no NCCL lines found (run with NCCL_DEBUG=INFO and pass the workers' output)",
                highlight=False,
            )
            raise typer.Exit(2)
        problems = check(verdicts, expect)

        failing = {id(v) for v in verdicts if expect != Expect.ANY and rank_problem(v, expect)}
        if as_json:
            sys.stdout.write(json.dumps([_jsonable(v) for v in verdicts], indent=2) + "\n")
        else:
            out = Console()
            if not out.is_terminal:
                out = Console(width=160)
            out.print(_table(verdicts, failing))
            notes: dict[str, list[int]] = {}
            for v in verdicts:
                for n in v.notes:
                    notes.setdefault(n, []).extend([] if v.rank is None else [v.rank])
            for n, ranks in notes.items():
                who = ("rank " if len(set(ranks)) == 1 else "ranks ") + (label_ranks(ranks) or "?")
                err.print(f"[yellow]note[/] ({who}): {escape(n)}", highlight=False)
        if problems:
            for p in problems:
                err.print(f"[bold red]expected {expect.value}[/]: {escape(p)}", highlight=False)
            raise typer.Exit(1)
        if expect != Expect.ANY:
            err.print(f"[green]all {len(verdicts)} ranks used {expect.value}[/]", highlight=False)


def _jsonable(v: RankVerdict) -> dict:
    d = asdict(v)
    d["inter_node"] = v.inter_node.value
    d["intra_node"] = v.intra_node.value
    d["causes"] = [c.text for c in v.causes]
    d["seen"] = v.seen
    return d

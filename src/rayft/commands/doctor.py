"""`rayft doctor`: which transport NCCL really used, per rank, and what failed the run: from log
files, from a Ray job's workers (--job, --run), or from flight-recorder dumps (--flight-recorder)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rayft.commands.common import console, fail
from rayft.nccl.doctor import Expect, InterNode, IntraNode, RankVerdict, Report, judge, label_ranks, mixed_jobs, rank_problem


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


def _table(runs: list[tuple[str, Report]], failing: set[int], faulty: set[int]) -> Table:
    """One row per rank; a ``log`` column names the file when several were given, a ``job``
    column the NCCL commId when a file held more than one job."""
    show_log = len(runs) > 1
    show_job = any(r.mixed for _, r in runs)
    t = Table(title="NCCL transport per rank", title_justify="left")
    cols = (["log"] if show_log else []) + ["rank", "host", "pid"] + (["job"] if show_job else [])
    for col in cols + ["GPU", "inter-node", "intra-node", "GDR", "interface", ""]:
        t.add_column(col, overflow="fold")
    for i, (name, report) in enumerate(runs):
        if i:
            t.add_section()
        for v in report.verdicts:
            t.add_row(*_row(name, v, failing, faulty, show_log, show_job))
    return t


def _row(name: str, v: RankVerdict, failing: set[int], faulty: set[int], show_log: bool, show_job: bool) -> list[str]:
    gpu = "" if v.cuda_dev is None else f"{v.cuda_dev}" + (f" ({v.bus_id})" if v.bus_id else "")
    mark = "[red]FAIL[/]" if id(v) in failing else ("[red]fault[/]" if id(v) in faulty else "[green]ok[/]")
    if not v.seen:
        mark = "[red]FAIL[/]" if id(v) in failing else "[yellow]unseen[/]"
    elif v.evidence == "folded" and mark == "[green]ok[/]":
        mark = "[green]ok[/] (folded)"
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


def _who(ranks: list[int], hosts: list[str]) -> str:
    who = (("rank " if len(ranks) == 1 else "ranks ") + label_ranks(ranks)) if ranks else "processes of unknown rank"
    return who + (f" (on {', '.join(sorted(hosts))})" if hosts else "")


def _print_report(where: str, report: Report) -> None:
    """A run's failures, timeouts and environment faults, one line each (stderr)."""
    groups: dict[tuple[str, str], list] = {}
    for f in report.failures:
        groups.setdefault((f.kind, f.cause), []).append(f)
    for (_, cause), fs in groups.items():
        ranks = [f.rank for f in fs if f.rank is not None]
        others = [f.who for f in fs if f.rank is None]
        who = _who(ranks, sorted({f.host for f in fs if f.host})) if ranks else ", ".join(others)
        folded = sum(f.folded for f in fs)
        more = f" (Ray folded {folded} more of these from other workers: RAY_DEDUP_LOGS=0 shows whose)" if folded else ""
        console.print(f"[bold red]failed[/]: {where}{escape(who)}: {escape(fs[0].line)}{more}", highlight=False)
        console.print(f"  cause: {escape(cause)}", highlight=False)
    for t in report.timeouts:
        console.print(f"[bold red]timed out[/]: {where}{escape(str(t))}", highlight=False)
    for fault in report.faults:
        label = "[bold red]environment[/]" if report.fail_on_faults else "[yellow]environment (warning)[/]"
        console.print(f"{label}: {where}{escape(_who(fault.ranks, fault.hosts))}: {escape(fault.text)}", highlight=False)
    if report.instance_note:
        console.print(f"[yellow]note[/]: {where}{escape(report.instance_note)}", highlight=False)


def _judge_runs(named_texts: list[tuple[str, str]], expect: Expect, instance_type: str | None, fail_on_faults: bool, as_json: bool) -> int:
    """Judge each ``(name, text)`` on its own, print the verdicts and what failed; the exit code."""
    names = _short_names([name for name, _ in named_texts])
    several = len(named_texts) > 1
    runs: list[tuple[str, Report]] = []
    rc = 0
    for (name, text), short in zip(named_texts, names):
        report = judge(text, expect, instance_type, fail_on_faults)
        where = f"{escape(short)}: " if several else ""
        if not report.verdicts:
            if report.failures:
                console.print(
                    f"[yellow]note[/]: {where}no NCCL lines (run with NCCL_DEBUG=INFO for the transport), but failures:", highlight=False
                )
                _print_report(where, report)
                rc = max(rc, 1)
                continue
            console.print(
                f"[bold red]error[/]: {where}no NCCL lines found (run with NCCL_DEBUG=INFO and pass the workers' output)",
                highlight=False,
            )
            rc = 2
            continue
        runs.append((short, report))
    if not runs:
        return rc

    failing = {id(v) for _, r in runs for v in r.verdicts if expect != Expect.ANY and rank_problem(v, expect)}
    failed_ranks = {(short, f.rank) for short, r in runs for f in r.failures if f.rank is not None}
    failing |= {id(v) for short, r in runs for v in r.verdicts if (short, v.rank) in failed_ranks}
    faulty = {id(v) for short, r in runs for fault in r.faults for v in r.verdicts if v.rank in fault.ranks}
    if as_json:
        rows = []
        for short, r in runs:
            first = {f.rank: f for f in r.failures if f.rank is not None}
            for v in r.verdicts:
                f = first.get(v.rank)
                rows.append(
                    {
                        "log": short,
                        **_jsonable(v),
                        "failure": {"kind": f.kind, "line": f.line, "cause": f.cause} if f else None,
                        "faults": [fault.text for fault in r.faults if v.rank in fault.ranks],
                    }
                )
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=180)
        out.print(_table(runs, failing, faulty))
        for name, r in runs:
            where = f"{escape(name)}, " if several else ""
            notes: dict[str, list[int]] = {}
            for v in r.verdicts:
                for n in v.notes:
                    notes.setdefault(n, []).extend([] if v.rank is None else [v.rank])
            for n, ranks in notes.items():
                who = ("rank " if len(set(ranks)) == 1 else "ranks ") + (label_ranks(ranks) or "?")
                console.print(f"[yellow]note[/] ({where}{who}): {escape(n)}", highlight=False)

    for name, r in runs:
        where = f"{escape(name)}: " if several else ""
        mixed = mixed_jobs(r.verdicts)
        if mixed:
            console.print(f"[bold red]error[/]: {where}{escape(mixed)}", highlight=False)
        for p in (p for p in r.problems if p != mixed):
            console.print(f"[bold red]expected {expect.value}[/]: {where}{escape(p)}", highlight=False)
        _print_report(where, r)
        rc = max(rc, r.exit_code)
    if rc == 0 and expect != Expect.ANY:
        n = sum(len(r.verdicts) for _, r in runs)
        in_logs = f" in {len(runs)} logs" if several else ""
        console.print(f"[green]all {n} ranks{in_logs} used {expect.value}[/]", highlight=False)
    return rc


def _fetched(job: str | None, run: str | None, address: str | None, token_file: Path | None) -> list[tuple[str, str]]:
    """The Ray Train workers' logs of ``--job`` or ``--run``, one text per worker-group attempt."""
    from rayft.cluster.submit import SubmitError, resolve_address, resolve_token
    from rayft.nccl.errors import DoctorError
    from rayft.nccl.fetch import fetch_job, fetch_run

    try:
        url = token = None
        if address or job or os.environ.get("RAY_ADDRESS"):
            url, _ = resolve_address(address, None)
            token, _ = resolve_token(url, token_file)
        logs = fetch_job(job, url, token) if job else fetch_run(run, url, token)
    except (SubmitError, DoctorError) as e:
        fail(str(e), 2)
    for n in logs.notes:
        console.print(f"[yellow]note[/]: {escape(n)}", highlight=False)
    workers = sum(len(a.workers) for a in logs.attempts)
    console.print(
        f"read the logs of {workers} Ray Train worker{'s' if workers != 1 else ''} of Ray job {logs.job_id}"
        + (f" ({logs.submission_id})" if logs.submission_id else ""),
        highlight=False,
    )
    return [(a.name, a.text) for a in logs.attempts]


def _flight_recorder(folder: Path, as_json: bool) -> int:
    from rayft.nccl.errors import DoctorError
    from rayft.nccl.flight_recorder import analyse, read_dumps

    try:
        dumps = read_dumps(folder)
    except DoctorError as e:
        fail(str(e), 2)
    findings = analyse(dumps)
    if as_json:
        sys.stdout.write(json.dumps({"ranks": [d.rank for d in dumps], "findings": [asdict(f) for f in findings]}, indent=2) + "\n")
    else:
        console.print(f"flight recorder: dumps of ranks {label_ranks([d.rank for d in dumps])} in {escape(str(folder))}", highlight=False)
        for f in findings:
            console.print(f"[bold red]hang[/]: {escape(f.text)}", highlight=False)
            console.print(f"  next: {escape(f.next_step)}", highlight=False)
        if not findings:
            console.print("[green]every rank entered the same collectives[/] (no hang in these dumps)", highlight=False)
    return 1 if findings else 0


def doctor(
    logs: Annotated[
        Optional[list[str]],
        typer.Argument(help="NCCL_DEBUG=INFO log files (raw or Ray driver output); '-' reads stdin."),
    ] = None,
    expect: Annotated[Expect, typer.Option(help="Fail (exit 1) unless every rank used this transport.", case_sensitive=False)] = Expect.ANY,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts as JSON on stdout.")] = False,
    job: Annotated[
        Optional[str],
        typer.Option(help="Judge this Ray job's Train workers' logs (submission id or Ray job id), fetched from the cluster."),
    ] = None,
    run: Annotated[Optional[str], typer.Option(help="Judge the Ray job recorded in this `rayft train` run directory.")] = None,
    address: Annotated[
        Optional[str],
        typer.Option(
            help="Dashboard URL for --job/--run, e.g. a KubeRay head's http://HOST:8265 (default: RAY_ADDRESS, as `rayft cluster local up` exports it)."
        ),
    ] = None,
    token_file: Annotated[
        Optional[Path], typer.Option(help="File with the cluster's auth token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ...).")
    ] = None,
    flight_recorder: Annotated[
        Optional[Path], typer.Option("--flight-recorder", help="Read PyTorch flight-recorder dumps in this folder: which ranks hung where.")
    ] = None,
    instance_type: Annotated[
        Optional[str], typer.Option(help="EC2 instance type of the nodes, for the EFA-device and GPUDirect checks (default: from the log).")
    ] = None,
    env_faults: Annotated[
        str,
        typer.Option(help="fail: environment faults (/dev/shm, interfaces, EFA devices, GPUDirect) fail the run; warn: only print them."),
    ] = "fail",
) -> None:
    """Say, per rank, which transport NCCL really used (EFA / IB / Socket, P2P / SHM, GPUDirect RDMA), and what failed the run.

    Each file is one run's log, read on its own (ranks are matched by number only within a run).
    --job and --run fetch every Ray Train worker's log from the cluster instead.

    Exit status, the worst over all runs: 0 as expected, 1 some rank did not use the expected
    transport, failed after choosing it, or shows an environment fault, 2 bad input (unreadable
    file, no NCCL lines, more than one job in a file, a job that cannot be fetched).
    """
    if env_faults not in ("fail", "warn"):
        fail(f"--env-faults {env_faults}: give fail or warn", 2)
    sources = sum(bool(x) for x in (logs, job, run))
    if sources > 1:
        fail("give log files, --job or --run: one of them", 2)
    fr_rc = 0
    if flight_recorder is not None:
        fr_rc = _flight_recorder(flight_recorder, as_json and not sources)
        if not sources:
            raise typer.Exit(fr_rc)
    if job or run:
        named = _fetched(job, run, address, token_file)
    else:
        if not logs:
            if sys.stdin.isatty():
                console.print("[bold red]error[/]: give NCCL log files, '-' to read stdin, --job or --run", highlight=False)
                raise typer.Exit(2)
            logs = ["-"]
        named = _read(logs)
    rc = max(fr_rc, _judge_runs(named, expect, instance_type, env_faults == "fail", as_json))
    if rc:
        raise typer.Exit(rc)


def _jsonable(v: RankVerdict) -> dict:
    d = asdict(v)
    d["inter_node"] = v.inter_node.value
    d["intra_node"] = v.intra_node.value
    d["causes"] = [c.text for c in v.causes]
    d["seen"] = v.seen
    return d

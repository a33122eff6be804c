"""Judging one run's NCCL log: the transport against what the run expected, and what failed it.

The verdicts come from :mod:`rayft.nccl.verdicts` (per rank: which transport NCCL really used),
read from text whose Ray and shipping structure :mod:`rayft.nccl.lines` undoes. This module says
whether they meet an expectation (:func:`rank_problem` for one rank, :func:`check` for a run), and
:func:`judge` puts everything that fails a run into one :class:`Report`: a wrong transport, a
failure after the transport was chosen (:mod:`rayft.nccl.health`), an environment fault
(:mod:`rayft.nccl.environment`), a text holding more than one job.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

from rayft.nccl.environment import Fault, environment_faults, instance_of
from rayft.nccl.health import Failure, Timeout, failures, timeouts
from rayft.nccl.lines import NcclLine, parse_lines
from rayft.nccl.verdicts import (
    Cause,
    InterNode,
    IntraNode,
    Link,
    RankVerdict,
    label_ranks,
    mixed_jobs,
    verdicts_from_text,
)

__all__ = [
    "Cause",
    "Expect",
    "Failure",
    "Fault",
    "InterNode",
    "IntraNode",
    "Link",
    "NcclLine",
    "RankVerdict",
    "Report",
    "Timeout",
    "check",
    "judge",
    "label_ranks",
    "mixed_jobs",
    "parse_lines",
    "rank_problem",
    "verdicts_from_text",
]


class Expect(str, Enum):
    """What a run should have used (``rayft doctor --expect``)."""

    EFA = "efa"  # inter-node over EFA (aws-ofi-nccl, provider efa)
    NVLINK = "nvlink"  # intra-node over P2P (NVLink), never SHM or the network
    SOCKET = "socket"  # every connection over NET/Socket (the deliberate TCP baseline)
    ANY = "any"  # report only


# --------------------------------------------------------------------------------------------
# Expectations.


def rank_problem(v: RankVerdict, expect: Expect | str) -> str | None:
    """Why ``v`` falls short of ``expect`` (a phrase to follow the rank's name), or None."""
    expect = Expect(expect)
    why = f" ({v.unknown_why})" if v.unknown_why else ""
    if not v.seen:
        return "left no NCCL line in the log, so the transport cannot be verified" + why
    if expect == Expect.EFA:
        if v.inter_node == InterNode.EFA:
            return None
        if v.inter_node == InterNode.NONE:
            return "had no peer on another host (single-node job), so EFA was never used"
        if v.inter_node == InterNode.LIBFABRIC:
            return f"used aws-ofi-nccl with libfabric provider {v.provider}, not efa"
        if v.inter_node == InterNode.UNKNOWN:
            if v.evidence == "folded":
                return "had an unknown inter-node transport, so EFA cannot be verified" + why
            return "logged no inter-node channel and no chosen network, so EFA cannot be verified" + why
        return f"used {v.inter_node.value} between hosts, not EFA"
    if expect == Expect.NVLINK:
        if v.intra_node == IntraNode.P2P and v.p2p_link != "PCIe":
            return None
        if v.intra_node == IntraNode.NVLS:
            return None
        if v.intra_node == IntraNode.P2P:
            return "used P2P over PCIe between local GPUs, not NVLink"
        if v.intra_node == IntraNode.NONE:
            return "had no other GPU on its host, so NVLink was never used"
        if v.intra_node == IntraNode.UNKNOWN:
            if v.evidence == "folded":
                return "had an unknown intra-node transport, so NVLink cannot be verified" + why
            return "logged no intra-node channel, so NVLink cannot be verified" + why
        return f"used {v.intra_detail or v.intra_node.value} between local GPUs, not P2P/NVLink"
    if expect == Expect.SOCKET:
        bad = []
        if v.inter_node not in (InterNode.SOCKET, InterNode.NONE):
            bad.append(f"inter-node {v.inter_node.value}")
        if v.intra_node not in (IntraNode.NET, IntraNode.NONE) or (v.intra_node == IntraNode.NET and "Socket" not in v.intra_detail):
            bad.append(f"intra-node {v.intra_detail or v.intra_node.value}")
        if v.inter_node == InterNode.NONE and v.intra_node == IntraNode.NONE:
            bad.append("no connection at all")
        return ("used " + " and ".join(bad) + ", not NET/Socket") if bad else None
    return None


def check(verdicts: list[RankVerdict], expect: Expect | str) -> list[str]:
    """Problems (one sentence each, naming the ranks and the likely cause); ``[]`` means as expected.

    ``expect`` is ``efa``, ``nvlink``, ``socket`` or ``any`` (only an empty log, or one that holds
    more than one job, is a problem). Ranks failing the same way for the same reasons are
    reported together. A text that held more than one job (see :func:`mixed_jobs`) is a problem
    of its own, listed first, whatever ``expect`` is.
    """
    expect = Expect(expect)
    if not verdicts:
        return ["no NCCL lines found (was NCCL_DEBUG=INFO set, and is this the workers' output?)"]
    mixed = mixed_jobs(verdicts)
    if expect == Expect.ANY:
        return [mixed] if mixed else []
    scopes = {Expect.EFA: ("inter", "both"), Expect.NVLINK: ("intra", "both"), Expect.SOCKET: ()}[expect]
    groups: dict[tuple[str, tuple[str, ...]], list[RankVerdict]] = defaultdict(list)
    for v in verdicts:
        what = rank_problem(v, expect)
        if what:
            groups[(what, tuple(c.text for c in v.causes if c.scope in scopes))].append(v)
    out: list[str] = []
    for (what, causes), vs in groups.items():
        ranks = [v.rank for v in vs if v.rank is not None]
        who = ("rank " if len(ranks) == 1 else "ranks ") + label_ranks(ranks) if ranks else ""
        unknown = [v for v in vs if v.rank is None]
        if unknown:
            who = (who + " and " if who else "") + ", ".join(f"{v.host}:{v.pid}" for v in unknown)
        hosts = sorted({v.host for v in vs if v.host})
        if hosts:
            who += f" (on {', '.join(hosts)})"
        line = f"{who} {what}"
        if causes:
            line += ". Likely cause: " + "; ".join(causes)
        out.append(line)
    return ([mixed] if mixed else []) + out


# --------------------------------------------------------------------------------------------
# One run judged as a whole.


@dataclass
class Report:
    """One run's log judged: the verdicts, and everything that fails the run.

    Attributes:
        verdicts: one per rank (:func:`verdicts_from_text`); ``[]`` when the log has no NCCL line.
        expect: what the run should have used.
        problems: transport problems against ``expect`` (:func:`check`), the mixed-jobs warning first.
        failures: each rank's first failure after the transport was chosen (:func:`rayft.nccl.health.failures`).
        timeouts: the collectives that timed out, with the ranks that reported them and those that did not.
        faults: environment faults (:func:`rayft.nccl.environment.environment_faults`).
        instance_note: why the instance-type checks were skipped, or None.
        fail_on_faults: environment faults fail the run (the default) or only warn.
    """

    verdicts: list[RankVerdict]
    expect: Expect
    problems: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    timeouts: list[Timeout] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    instance_note: str | None = None
    fail_on_faults: bool = True

    @property
    def mixed(self) -> str | None:
        """The warning that the text held more than one job, or None."""
        return mixed_jobs(self.verdicts)

    @property
    def exit_code(self) -> int:
        """2 bad input (no NCCL line and no failure; more than one job), 1 failed (a wrong transport,
        a failure, an environment fault unless only warned of), 0 as expected."""
        if (not self.verdicts and not self.failures) or self.mixed:
            return 2
        if self.problems or self.failures or (self.faults and self.fail_on_faults):
            return 1
        return 0


def judge(text: str, expect: Expect | str = Expect.ANY, instance_type: str | None = None, fail_on_faults: bool = True) -> Report:
    """Judge one run's output ``text`` (see :class:`Report`).

    ``instance_type``: the EC2 type the run ran on, for the EFA-device and GPUDirect RDMA checks
    (default: the type aws-ofi-nccl names in the log; none: those checks are skipped).
    """
    expect = Expect(expect)
    verdicts = verdicts_from_text(text)
    _, note = instance_of(verdicts, instance_type)
    return Report(
        verdicts=verdicts,
        expect=expect,
        problems=check(verdicts, expect) if verdicts else [],
        failures=failures(text, verdicts),
        timeouts=timeouts(text, verdicts),
        faults=environment_faults(verdicts, instance_type),
        instance_note=note,
        fail_on_faults=fail_on_faults,
    )

"""Judging NCCL's verdicts against what a run expected (``rayft doctor --expect``).

The verdicts come from :mod:`rayft.nccl.verdicts` (per rank: which transport NCCL really used),
read from text whose Ray and shipping structure :mod:`rayft.nccl.lines` undoes. This module says
whether they meet an expectation: :func:`rank_problem` for one rank, :func:`check` for a run.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

from collections import defaultdict
from enum import Enum

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
    "InterNode",
    "IntraNode",
    "Link",
    "NcclLine",
    "RankVerdict",
    "check",
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
    if not v.seen:
        return "left no NCCL line in the log, so the transport cannot be verified"
    if expect == Expect.EFA:
        if v.inter_node == InterNode.EFA:
            return None
        if v.inter_node == InterNode.NONE:
            return "had no peer on another host (single-node job), so EFA was never used"
        if v.inter_node == InterNode.LIBFABRIC:
            return f"used aws-ofi-nccl with libfabric provider {v.provider}, not efa"
        if v.inter_node == InterNode.UNKNOWN:
            return "logged no inter-node channel and no chosen network, so EFA cannot be verified"
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
            return "logged no intra-node channel, so NVLink cannot be verified"
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

"""Failures after the transport was chosen: what went wrong in a job's collectives, rank by rank.

A job can pick EFA and still die: a libfabric completion error on one rank, then the NCCL watchdog's
collective timeout on the others. This module reads a job's output for the lines that say a rank
failed and keeps each rank's first one, with a one-line cause that says what to do next:

* ``NCCL WARN`` lines, other than those of the transport selection (the network plugin probing,
  which :mod:`rayft.nccl.verdicts` reads as the cause of a fallback) and the /dev/shm ones (an
  environment fault: :mod:`rayft.nccl.environment`);
* aws-ofi-nccl's completion errors (``Request ... completed with error. RC: 103. Error: 13 (...)``):
  the libfabric error (an errno) and the EFA provider's error code, with its meaning;
* NCCL's results as PyTorch raises them: ``unhandled system error`` (ncclSystemError),
  ``ncclRemoteError`` (a peer exited or the network dropped), ``unhandled cuda error``,
  ``invalid usage``, ``internal error``;
* PyTorch c10d's watchdog timeout (``Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, ..., Timeout(ms)=600000)``: the operation, its sequence
  number, the timeout) and gloo's (``Timed out waiting 1800000ms for recv operation``);
* NCCL's ``Duplicate GPU detected`` (two ranks on one GPU);
* PyTorch's barrier warning when the rank's GPU was not set yet ("devices used by this process are
  currently unknown"): a barrier on a guessed GPU, which hangs or corrupts when the guess is wrong.

A line is attributed to a rank by PyTorch's ``[rankN]:`` prefix, by NCCL's ``host:pid`` prefix or
Ray's ``(... pid=N, ip=...)`` prefix matched against the transport verdicts' processes.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from rayft.nccl.lines import LogLine, NcclLine, iter_log
from rayft.nccl.verdict_types import RankVerdict, label_ranks

__all__ = ["EFA_ERRORS", "Failure", "Timeout", "failures", "timeouts"]


@dataclass
class Failure:
    """The first failure of one rank (or of one process the log does not give a rank)."""

    kind: str  # see _KINDS: "efa-completion", "timeout", "nccl-warn", "remote-error", ...
    rank: int | None
    host: str | None
    pid: int | None
    line: str  # the line that says it (Ray's and NCCL's prefixes removed)
    cause: str  # one line: what it means, and what to do next
    folded: int = 0  # more occurrences Ray folded into this line from workers the log does not name
    index: int = 0  # where in the text (physical line), for ordering

    @property
    def who(self) -> str:
        """``rank 3 (host-a pid 412)``, or ``host-a pid 412`` when the rank is not known."""
        where = f"{self.host or '?'} pid {self.pid}" if self.pid is not None else (self.host or "")
        if self.rank is None:
            return where or "a process of unknown rank"
        return f"rank {self.rank}" + (f" ({where})" if where else "")


@dataclass
class Timeout:
    """One collective that timed out, as the ranks that reported it said (c10d's watchdog)."""

    op: str  # OpType, e.g. ALLREDUCE, _ALLGATHER_BASE, or gloo's "recv"
    seq: int | None  # SeqNum: the collective's sequence number in its process group
    timeout_ms: int | None
    ranks: list[int] = field(default_factory=list)  # ranks that reported it
    silent: list[int] = field(default_factory=list)  # ranks of the job that did not: likely never entered it
    group: str | None = None  # c10d's process group id when not the default one (its ranks are group ranks)
    failed: list[int] = field(default_factory=list)  # ranks of the job that failed otherwise instead (their first error says why)

    def __str__(self) -> str:
        what = f"collective {self.op}" + (f" #{self.seq}" if self.seq is not None else "")
        what += f" of process group {self.group}" if self.group else ""
        after = f" after {self.timeout_ms} ms" if self.timeout_ms is not None else ""
        who = f"{'rank' if len(self.ranks) == 1 else 'ranks'} {label_ranks(self.ranks)}" if self.ranks else "a rank of unknown number"
        line = f"{what} timed out{after} on {who}"
        if self.failed:
            one = len(self.failed) == 1
            line += (
                f"; {'rank' if one else 'ranks'} {label_ranks(self.failed)} failed otherwise first (see {'its' if one else 'their'} error)"
            )
        if self.silent:
            one = len(self.silent) == 1
            line += (
                f"; {'rank' if one else 'ranks'} {label_ranks(self.silent)} reported no timeout: "
                f"{'it' if one else 'they'} probably never entered it (the hung or slow {'rank' if one else 'ranks'})"
            )
        return line


#: The EFA provider's error codes (libfabric's ``prov_errno`` in aws-ofi-nccl's completion errors):
#: code -> (meaning, what to do). Codes below 4096 are the EFA device's completion statuses
#: (rdma-core's efa_io_comp_status), 4096 and up the libfabric EFA provider's own (prov/efa/src/efa_errno.h).
_PEER_GONE = "the peer's process exited or restarted: find the rank that failed first"
_PEER_SILENT = "the peer stopped answering (its process hung or died, or its node lost the network): look at the peer ranks' first errors"
_UNREACHABLE = (
    "the peer was never reachable over EFA: the nodes' security group must allow all traffic from itself, "
    "and the nodes must share a subnet and placement group (rayft cluster plan sets both)"
)
_MEMREG = "a GPU memory registration failed: check the image's GPUDirect RDMA support (dmabuf or nvidia-peermem) and `ulimit -l unlimited`"
EFA_ERRORS: dict[int, tuple[str, str]] = {
    1: ("queue pair flushed while being destroyed", "a consequence of this process shutting down after another error: find the first"),
    2: ("internal queue pair error on this side", "check the node's EFA devices (fi_info -p efa) and the peer ranks' errors"),
    3: ("unsupported operation", "aws-ofi-nccl and libfabric disagree: use the versions of one EFA installer"),
    4: ("invalid address handle on this side", _PEER_GONE),
    5: ("local memory registration invalid", _MEMREG),
    6: ("message too long", "aws-ofi-nccl and libfabric disagree: use the versions of one EFA installer"),
    7: ("remote memory registration invalid", _MEMREG),
    8: ("connection reset by the peer", _PEER_GONE),
    9: ("the peer's queue pair does not exist", _PEER_GONE),
    10: (
        "receiver not ready (no receive posted)",
        "usually a consequence of another failure; if alone, upgrade aws-ofi-nccl and libfabric",
    ),
    11: ("the peer's receive buffer is too short", "aws-ofi-nccl versions differ between nodes: use one image on every node"),
    12: ("unexpected status from the peer", _PEER_SILENT),
    13: ("unresponsive peer (it answered before)", _PEER_SILENT),
    14: ("the peer has no address handle for this side", _PEER_GONE),
    15: ("unreachable peer (never answered)", _UNREACHABLE),
    4096: ("unknown EFA provider error", "check the node's EFA devices (fi_info -p efa) and the peer ranks' errors"),
    4105: ("out of memory in the EFA provider", "raise the pods' memory and locked-memory limit (ulimit -l unlimited)"),
    4108: ("receive entries exhausted", "too many outstanding receives: upgrade aws-ofi-nccl and libfabric"),
    4109: ("send entries exhausted", "too many outstanding sends: upgrade aws-ofi-nccl and libfabric"),
    4110: ("could not insert the peer's address", _PEER_GONE),
    4113: ("could not send the handshake to the peer", _UNREACHABLE),
    4124: ("unresponsive receiver (the connection was established before)", _PEER_SILENT),
    4126: ("unresponsive receiver (reachable by the EFA device, but the handshake failed)", _UNREACHABLE),
}

# -- line patterns (PyTorch 2.x c10d, NCCL 2.18-2.28, aws-ofi-nccl 1.7-1.14)
_OFI_COMPLETION = re.compile(r"completed with error\. RC: (?P<rc>-?\d+)\. Error: (?P<prov>\d+)(?: \((?P<text>[^)]*(?:\([^)]*\)[^)]*)*)\))?")
_WATCHDOG = re.compile(
    r"(?:Watchdog caught|Caught) collective operation timeout: Work\w*\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"(?:, NumelIn=\d+, NumelOut=\d+)?, Timeout\(ms\)=(?P<ms>\d+)\)"
)
# c10d's own rank tag inside a message: "[Rank 3]", "[PG 0 Rank 3]", "[PG ID 0 PG GUID 0(default_pg) Rank 3]"
_PG_RANK = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+)(?: PG GUID \S+?(?:\([^)]*\))?)? )?Rank (?P<rank>\d+)\]")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation to complete")
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected ?: rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA device (?P<dev>\w+)")
_BARRIER_DEVICE = re.compile(r"using GPU (?P<gpu>\d+) to perform barrier as devices used by this process are currently unknown")
_BARRIER_DEVICE_ANY = re.compile(r"devices used by this process are currently unknown")
_REMOTE_ERROR = re.compile(r"ncclRemoteError|remote process exited or there was a network error")
_SYSTEM_ERROR = re.compile(r"unhandled system error|ncclSystemError")
_CUDA_ERROR = re.compile(r"unhandled cuda error|ncclUnhandledCudaError")
_INTERNAL_ERROR = re.compile(r"ncclInternalError|NCCL error in: .*internal error")
_INVALID_USAGE = re.compile(r"ncclInvalidUsage|NCCL error in: .*invalid usage")
_SOCKET_ERROR = re.compile(
    r"socket\w*: .*(?:failed|refused|reset|timed out|closed)|Connection (?:refused|reset by peer|timed out|closed by remote peer)|"
    r"Net : Connection closed",
    re.I,
)
_CUDA_FAILURE = re.compile(r"Cuda failure|CUDA error|cudaErrorMemoryAllocation|out of memory", re.I)
# NCCL WARN lines that belong to the transport selection (read by verdicts.py as a fallback's cause)
# or the environment (environment.py), not to a failure after it.
_SELECTION_WARN = re.compile(
    r"fi_getinfo|No eligible providers|Unable to find a protocol|Couldn't find any optimal provider|aws-ofi-nccl initialization failed|"
    r"No NIC info|initNet\(\) failed|Failed to initialize NET plugin|NET/Plugin|Could not find: libnccl|Only EFA provider is supported|"
    r"/dev/shm|posix_fallocate|shared memory segment|ncclShmOpen",
    re.I,
)


def _efa_cause(rc: int, prov: int, text: str | None) -> str:
    meaning, todo = EFA_ERRORS.get(
        prov, (text or "EFA provider error", "check the node's EFA devices (fi_info -p efa) and the peer ranks' errors")
    )
    errno = f"libfabric error {rc} ({os.strerror(abs(rc))})" if 0 < abs(rc) < 256 else f"libfabric error {rc}"
    return f"EFA completion error {prov}: {meaning} ({errno}); {todo}"


def _classify(text: str, level: str | None) -> tuple[str, str] | None:
    """(kind, cause) of a failure line, or None. ``level``: NCCL's level for NCCL lines."""
    if m := _DUPLICATE_GPU.search(text):
        return "duplicate-gpu", (
            f"ranks {m['b']} and {m['a']} are on one GPU ({m['dev']}): each worker needs its own; let Ray assign one GPU per "
            "worker (train.use_gpu) and do not set CUDA_VISIBLE_DEVICES in the worker pods"
        )
    if m := _OFI_COMPLETION.search(text):
        return "efa-completion", _efa_cause(int(m["rc"]), int(m["prov"]), m["text"])
    if m := _WATCHDOG.search(text):
        return "timeout", (
            f"collective {m['op']} #{m['seq']} timed out after {m['ms']} ms: a rank never entered it, or the network stalled; "
            "set train.nccl_flight_recorder: true and read the dumps with `rayft doctor --flight-recorder RUN_DIR/flight_recorder`"
        )
    if m := _GLOO_TIMEOUT.search(text):
        return "timeout", (
            f"a gloo {m['op']} timed out after {m['ms']} ms: a peer never reached the same collective (it hung, died or "
            "diverged); find that rank's first error"
        )
    if m := _BARRIER_DEVICE.search(text) or _BARRIER_DEVICE_ANY.search(text):
        guess = f"GPU {m['gpu']}" if m.re is _BARRIER_DEVICE else "a guessed GPU"
        return "barrier-device", (
            f"barrier() ran before this rank's GPU was set, on {guess}: it hangs when the guess is wrong; pass "
            "device_id=torch.device('cuda', local_rank) to init_process_group, or call torch.cuda.set_device(local_rank) first"
        )
    if _REMOTE_ERROR.search(text):
        return "remote-error", (
            "ncclRemoteError: a peer process exited or the network between the hosts dropped; the rank that failed first says why"
        )
    if _SYSTEM_ERROR.search(text):
        return "system-error", (
            "ncclSystemError: a socket, libfabric or other system call failed inside NCCL; the NCCL WARN line before it "
            "(run with NCCL_DEBUG=INFO) says which"
        )
    if _CUDA_ERROR.search(text):
        return (
            "cuda-error",
            "a CUDA call failed inside NCCL: look for the CUDA error on this rank (out of memory: lower train.micro_batch_size)",
        )
    if _INVALID_USAGE.search(text):
        return (
            "invalid-usage",
            "NCCL refused the call (ncclInvalidUsage): a rank/GPU mapping or communicator misuse; the NCCL WARN before it says which",
        )
    if _INTERNAL_ERROR.search(text):
        return "internal-error", "ncclInternalError: often a peer that died mid-collective; find the rank that failed first"
    if level == "WARN" and not _SELECTION_WARN.search(text):
        if _SOCKET_ERROR.search(text):
            return "socket-error", (
                "a TCP connection between ranks failed: a peer died, or a security group or firewall blocks the ports NCCL "
                "picks (allow all traffic between the nodes)"
            )
        if _CUDA_FAILURE.search(text):
            return "cuda-error", "a CUDA call failed inside NCCL (out of memory: lower train.micro_batch_size or parallel settings)"
        return "nccl-warn", "NCCL warned of a failure: the line says what; it is the first thing that went wrong on this rank"
    return None


def _owners(verdicts: list[RankVerdict]) -> tuple[dict, dict, dict, dict]:
    """The verdicts by (host, pid), (ip, pid), pid and rank (a rank two processes claim, in a text of
    two jobs: by neither)."""
    ranks = [v.rank for v in verdicts if v.rank is not None]
    by_rank = {v.rank: v for v in verdicts if v.rank is not None and ranks.count(v.rank) == 1}
    by_host: dict[tuple[str, int], RankVerdict] = {}
    by_ip: dict[tuple[str, int], RankVerdict] = {}
    by_pid: dict[int, list[RankVerdict]] = defaultdict(list)
    for v in verdicts:
        if v.pid is None:
            continue
        if v.host:
            by_host[(v.host, v.pid)] = v
        if v.ip:
            by_ip[(v.ip, v.pid)] = v
        by_pid[v.pid].append(v)
    return by_host, by_ip, by_pid, by_rank


def _attribute(ln: NcclLine | LogLine, owners) -> tuple[int | None, str | None, int | None]:
    """(rank, host, pid) of a line's process, as far as the log tells."""
    by_host, by_ip, by_pid, by_rank = owners
    if isinstance(ln, NcclLine):
        v = by_host.get((ln.host, ln.pid)) if ln.host else None
        pid, ip, host = ln.pid, ln.ray_ip, ln.host
    else:
        if ln.rank is not None:  # PyTorch's [rankN]: a global rank
            v = by_rank.get(ln.rank) or (by_ip.get((ln.ip, ln.pid)) if ln.ip and ln.pid is not None else None)
            return ln.rank, v.host if v else None, v.pid if v else ln.pid
        v, pid, ip, host = None, ln.pid, ln.ip, None
    if v is None and pid is not None and ip is not None:
        v = by_ip.get((ip, pid))
    if v is None and pid is not None and len(by_pid.get(pid, [])) == 1:
        v = by_pid[pid][0]
    if v is not None:
        return v.rank, v.host or host, v.pid
    return None, host, pid


def _scan(text: str, verdicts: list[RankVerdict]):
    owners = _owners(verdicts)
    for ln in iter_log(text):
        body = ln.msg if isinstance(ln, NcclLine) else ln.text
        level = ln.level if isinstance(ln, NcclLine) else None
        if (kc := _classify(body, level)) is None:
            continue
        rank, host, pid = _attribute(ln, owners)
        pg = _PG_RANK.search(body)
        if rank is None and pg and (pg["pg"] or "0") == "0":  # a rank of the default process group: a global rank
            rank = int(pg["rank"])
        yield ln, body, kc, rank, host, pid, (pg["pg"] if pg else None)


def failures(text: str, verdicts: list[RankVerdict]) -> list[Failure]:
    """The first failure line of each rank in ``text`` (one job's output), in log order, each with
    its cause. ``verdicts``: the job's transport verdicts (they map NCCL's and Ray's process ids
    to ranks). Lines no rank can be given are kept per process (host and pid), or once when not
    even that is known. ``[]`` means no failure was logged."""
    first: dict[tuple, Failure] = {}
    for ln, body, (kind, cause), rank, host, pid, _ in _scan(text, verdicts):
        key = ("rank", rank) if rank is not None else ("proc", host, pid)
        if key in first:
            continue
        first[key] = Failure(kind, rank, host, pid, _shorten(body), cause, folded=ln.repeated - 1, index=ln.index)
    return sorted(first.values(), key=lambda f: (f.index, f.rank if f.rank is not None else -1))


def timeouts(text: str, verdicts: list[RankVerdict]) -> list[Timeout]:
    """Every collective that timed out in ``text``, with the ranks that reported it and, where the
    job's ranks are known, those that did not (see :class:`Timeout`)."""
    found: dict[tuple[str, int | None, str | None], Timeout] = {}
    other: set[int] = set()  # ranks with a failure that is not a timeout
    for _, body, (kind, _), rank, _, _, pg in _scan(text, verdicts):
        if kind != "timeout":
            if rank is not None:
                other.add(rank)
            continue
        if m := _WATCHDOG.search(body):
            key, ms = (m["op"], int(m["seq"]), pg if pg not in (None, "0") else None), int(m["ms"])
        else:
            g = _GLOO_TIMEOUT.search(body)
            key, ms = (g["op"], None, None), int(g["ms"])
        t = found.setdefault(key, Timeout(key[0], key[1], ms, group=key[2]))
        if rank is not None and rank not in t.ranks:
            t.ranks.append(rank)
    world = {v.rank for v in verdicts if v.rank is not None}
    for t in found.values():
        t.ranks.sort()
        if t.ranks and world and t.group is None:  # ranks of a sub-group are numbered in that group
            quiet = world - set(t.ranks)
            t.failed = sorted(quiet & other)
            t.silent = sorted(quiet - other)
    return list(found.values())


_GLOG_HEAD = re.compile(r"^\[[EWIF]\d{4} [\d:.]+ [\w.]+:\d+\] ")  # c10d's "[E1130 14:31:07.400000000 ProcessGroupNCCL.cpp:685] "


def _shorten(line: str, limit: int = 240) -> str:
    line = " ".join(_GLOG_HEAD.sub("", line).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"

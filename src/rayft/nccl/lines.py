"""Ray's log structure around NCCL's debug lines: prefixes, colours, folded repeats, glued lines.

NCCL prints ``host:pid:tid [dev] NCCL INFO ...``. What reaches a user has been through Ray (the
driver's ``(RayTrainWorker pid=N, ip=...)`` prefix, ANSI colours, ``[repeated Nx across cluster]``
where Ray's log deduplication folded the same message of several workers into one) and sometimes
through a log shipper (timestamps, the container runtime's ``stdout F`` tag, ``aws logs tail``'s
log-stream name, CloudWatch or Fluent Bit JSON records). :func:`iter_log` undoes all of that and
yields every line with the process it came from: NCCL's messages as :class:`NcclLine`, the rest
(PyTorch's c10d messages, tracebacks) as :class:`LogLine`. :func:`ray_ranks` reads Ray Train's
own lines that say which worker process is which rank.

Ray's deduplication (``RAY_DEDUP_LOGS=1``, the default) keys a line by its words without digits
(:func:`ray_key`), prints the first occurrence, and folds later ones from other workers into one
line (the last of them) tagged ``[repeated Nx across cluster]``: N occurrences, of which only the
printed one says who emitted it. :attr:`NcclLine.repeated` carries N.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["LogLine", "NcclLine", "RayRanks", "iter_log", "parse_lines", "ray_key", "ray_ranks"]


@dataclass(frozen=True)
class NcclLine:
    """One NCCL debug message, with where it came from."""

    host: str | None  # NCCL's hostname (None when only Ray's prefix survived)
    pid: int
    tid: int | None
    level: str  # INFO / WARN / ...
    msg: str  # the text after "NCCL INFO "
    ray_ip: str | None = None
    repeated: int = 1  # Ray's "[repeated Nx across cluster]": N occurrences folded into this one
    glued: bool = False  # followed another message on the same physical line
    index: int = 0  # the physical line it was on (0-based), for ordering

    @property
    def key(self) -> str:
        """The key Ray's deduplication gave this message (:func:`ray_key` of the worker's line)."""
        return ray_key(f"NCCL {self.level} {self.msg}")


@dataclass(frozen=True)
class LogLine:
    """A line of a worker's output that is not an NCCL debug message (c10d, Python, Ray)."""

    text: str  # after Ray's prefix, PyTorch's ``[rankN]:`` prefix and any shipping prefix
    pid: int | None = None  # from Ray's prefix
    ip: str | None = None  # from Ray's prefix
    rank: int | None = None  # from PyTorch's ``[rankN]:`` prefix
    repeated: int = 1
    index: int = 0


@dataclass
class RayRanks:
    """Which worker process is which rank, from Ray Train's own lines (not NCCL's).

    Ray Train's controller lists the worker group (``- (ip=10.0.64.11, pid=2101) world_rank=0,
    local_rank=0, node_rank=0``), and each worker says ``Setting up process group for: env://
    [rank=0, world_size=16]`` under its own Ray prefix.
    """

    by_pid: dict[int, int] = field(default_factory=dict)  # pid -> rank (pids may repeat across hosts)
    by_ip_pid: dict[tuple[str, int], int] = field(default_factory=dict)  # (ip, pid) -> rank
    ip: dict[int, str] = field(default_factory=dict)  # rank -> node ip
    world: int | None = None  # from the workers' "world_size=" (else the controller's list)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\s*\((?P<actor>[^()]*?)\bpid=(?P<pid>\d+)(?P<rest>[^()]*)\)\s?")
_RAY_IP = re.compile(r"\bip=(?P<ip>[0-9A-Fa-f.:]+)")
# Ray's fold tag, with the hint Ray appends to the first one it prints; at the end of the line, or
# (older Ray) right after the prefix.
_REPEATED = re.compile(
    r"\s*\[repeated (?P<n>\d+)x across cluster\](?:\s*\(Ray deduplicates logs by default\.[^)]*\))?\s*",
)
_NCCL_HEAD = re.compile(
    r"(?P<host>[A-Za-z0-9_.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:[\w./-]+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?"
)
_BARE_HEAD = re.compile(r"\bNCCL (?P<level>INFO|WARN)\b ?")
_BARE_VERSION = re.compile(r"^\s*NCCL version (?P<v>\S+)")
_TORCH_RANK = re.compile(r"^\[rank(?P<rank>\d+)\]:")

# Log shippers: a leading timestamp (ISO 8601, "2026-11-30 09:12:01,118", "[2026-11-30 08:00:10]"),
# the container runtime's stream tag ("stdout F "), `aws logs tail`'s log-stream name, and JSON
# records (Fluent Bit's {"log": ...}, CloudWatch's {"message": ...}).
_SHIP_TS = re.compile(r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?[ \t]+")
_CRI_TAG = re.compile(r"^(?:stdout|stderr) [FP] ")
_STREAM_NAME = re.compile(r"^[^\s(){}\[\]]+[ \t]+(?=[({]|[A-Za-z0-9_.\-]+:\d+:\d+ \[)")

_RAY_SETUP = re.compile(r"Setting up process group for: \S+ \[rank=(?P<rank>\d+), world_size=(?P<ws>\d+)\]")
_RAY_GROUP = re.compile(r"\(ip=(?P<ip>[^,]+), pid=(?P<pid>\d+)\) world_rank=(?P<rank>\d+), local_rank=(?P<lr>\d+)")
_RAY_GROUP_SIZE = re.compile(r"Started training worker group of size (?P<n>\d+)")

_DIGITS = re.compile(r"\d|0x[0-9a-fA-F]")


def ray_key(line: str) -> str:
    """The key Ray's log deduplication files ``line`` under: its words, minus every word that
    holds a digit. Lines with one key from several workers within Ray's window are folded."""
    return " ".join(w for w in line.split() if not _DIGITS.search(w))


def _unship(line: str) -> str:
    """``line`` without what a log shipper put around it (see the patterns above)."""
    for _ in range(3):
        m = _SHIP_TS.match(line)
        if m:
            line = line[m.end() :]
            if t := _CRI_TAG.match(line):
                line = line[t.end() :]
            elif s := _STREAM_NAME.match(line):
                line = line[s.end() :]
            continue
        if t := _CRI_TAG.match(line):
            line = line[t.end() :]
            continue
        if line.startswith('{"'):
            try:
                rec = json.loads(line)
            except ValueError:
                return line
            msg = rec.get("log", rec.get("message")) if isinstance(rec, dict) else None
            if not isinstance(msg, str):
                return line
            line = msg.rstrip("\n")
            continue
        break
    return line


def _plain(raw: str) -> str:
    """A physical line without colours, carriage returns and shipping prefixes (colours again after
    unwrapping a JSON record, which holds them escaped)."""
    return _ANSI.sub("", _unship(_ANSI.sub("", raw).replace("\r", "")))


def iter_log(text: str) -> Iterator[NcclLine | LogLine]:
    """Every line of ``text``: NCCL's messages (split where several were glued onto one physical
    line) as :class:`NcclLine`, everything else that is not blank as :class:`LogLine`.

    A line that carries only Ray's prefix before ``NCCL INFO`` (NCCL's own prefix cut away) gives
    an :class:`NcclLine` with ``host=None`` and Ray's pid; NCCL fragments without any attribution
    are dropped.
    """
    for index, raw in enumerate(text.splitlines()):
        line = _plain(raw)
        ray_pid = ray_ip = None
        m = _RAY_PREFIX.match(line)
        if m:
            ray_pid = int(m["pid"])
            ipm = _RAY_IP.search(m["rest"])
            ray_ip = ipm["ip"] if ipm else None
            line = line[m.end() :]
        repeated = 1
        r = _REPEATED.search(line)
        if r and (r.end() == len(line) or r.start() == 0):
            repeated = int(r["n"])
            line = line[: r.start()] + line[r.end() :]
        if "NCCL" in line:
            heads = list(_NCCL_HEAD.finditer(line))
            if heads:
                for i, h in enumerate(heads):
                    end = heads[i + 1].start() if i + 1 < len(heads) else len(line)
                    yield NcclLine(
                        host=h["host"],
                        pid=int(h["pid"]),
                        tid=int(h["tid"]),
                        level=h["level"],
                        msg=line[h.end() : end].strip(),
                        ray_ip=ray_ip,
                        repeated=repeated,
                        glued=i > 0,
                        index=index,
                    )
                continue
            if ray_pid is not None:
                if b := _BARE_HEAD.search(line):
                    yield NcclLine(None, ray_pid, None, b["level"], line[b.end() :].strip(), ray_ip, repeated, index=index)
                    continue
                if v := _BARE_VERSION.match(line):
                    yield NcclLine(None, ray_pid, None, "INFO", f"NCCL version {v['v']}", ray_ip, repeated, index=index)
                    continue
        if not line.strip():
            continue
        rank = None
        if t := _TORCH_RANK.match(line):
            rank = int(t["rank"])
            line = line[t.end() :]
        yield LogLine(line.strip(), ray_pid, ray_ip, rank, repeated, index)


def parse_lines(text: str) -> list[NcclLine]:
    """Every NCCL message in ``text`` (see :func:`iter_log`)."""
    return [ln for ln in iter_log(text) if isinstance(ln, NcclLine)]


def ray_ranks(text: str) -> RayRanks:
    """Ray Train's rank of each worker process in ``text`` (see :class:`RayRanks`)."""
    out = RayRanks()
    group_size = None
    for raw in text.splitlines():
        line = _plain(raw)
        if m := _RAY_GROUP.search(line):
            rank, pid = int(m["rank"]), int(m["pid"])
            out.by_pid[pid] = rank
            out.by_ip_pid[(m["ip"], pid)] = rank
            out.ip[rank] = m["ip"]
        elif (m := _RAY_SETUP.search(line)) and (p := _RAY_PREFIX.match(line)):
            rank, pid = int(m["rank"]), int(p["pid"])
            out.by_pid[pid] = rank
            if ipm := _RAY_IP.search(p["rest"]):
                out.by_ip_pid[(ipm["ip"], pid)] = rank
                out.ip.setdefault(rank, ipm["ip"])
            out.world = int(m["ws"])
        elif m := _RAY_GROUP_SIZE.search(line):
            group_size = int(m["n"])
    if out.world is None and group_size and len(out.ip) == group_size:
        out.world = group_size
    return out

"""Ray's log structure around NCCL's debug lines: prefixes, colours, folded repeats, glued lines.

NCCL prints ``host:pid:tid [dev] NCCL INFO ...``. What reaches a user has been through Ray (the
driver's ``(RayTrainWorker pid=N, ip=...)`` prefix, ANSI colours, ``[repeated Nx across cluster]``
where Ray's log deduplication folded the same message of several workers into one) and sometimes
through a log shipper (timestamps, CloudWatch or Fluent Bit records). :func:`parse_lines` undoes
all of that and returns NCCL's messages, each with the process it came from.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["NcclLine", "parse_lines"]


@dataclass(frozen=True)
class NcclLine:
    """One NCCL debug message, with where it came from."""

    host: str | None  # NCCL's hostname (None when only Ray's prefix survived)
    pid: int
    tid: int | None
    level: str  # INFO / WARN / ...
    msg: str  # the text after "NCCL INFO "
    ray_ip: str | None = None
    repeated: int = 1  # Ray's "[repeated Nx across cluster]"
    glued: bool = False  # followed another message on the same physical line


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PREFIX = re.compile(r"^\s*\((?P<actor>[^()]*?)\bpid=(?P<pid>\d+)(?P<rest>[^()]*)\)\s?")
_RAY_IP = re.compile(r"\bip=(?P<ip>[0-9A-Fa-f.:]+)")
_REPEATED = re.compile(r"\s*\[repeated (?P<n>\d+)x across cluster\]\s*$")
_NCCL_HEAD = re.compile(
    r"(?P<host>[A-Za-z0-9_.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:[\w./-]+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?"
)
_BARE_HEAD = re.compile(r"\bNCCL (?P<level>INFO|WARN)\b ?")
_BARE_VERSION = re.compile(r"^\s*NCCL version (?P<v>\S+)")


def parse_lines(text: str) -> list[NcclLine]:
    """Every NCCL message in ``text``, split where lines were interleaved without a newline.

    Lines that carry only Ray's prefix (NCCL's own prefix truncated away) are kept with
    ``host=None`` and Ray's pid; fragments without any attribution are dropped.
    """
    out: list[NcclLine] = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).replace("\r", "")
        if "NCCL" not in line:
            continue
        ray_pid = ray_ip = None
        m = _RAY_PREFIX.match(line)
        if m:
            ray_pid = int(m["pid"])
            ipm = _RAY_IP.search(m["rest"])
            ray_ip = ipm["ip"] if ipm else None
            line = line[m.end() :]
        repeated = 1
        r = _REPEATED.search(line)
        if r:
            repeated = int(r["n"])
            line = line[: r.start()]
        heads = list(_NCCL_HEAD.finditer(line))
        if heads:
            for i, h in enumerate(heads):
                end = heads[i + 1].start() if i + 1 < len(heads) else len(line)
                out.append(
                    NcclLine(
                        host=h["host"],
                        pid=int(h["pid"]),
                        tid=int(h["tid"]),
                        level=h["level"],
                        msg=line[h.end() : end].strip(),
                        ray_ip=ray_ip,
                        repeated=repeated,
                        glued=i > 0,
                    )
                )
            continue
        if ray_pid is None:
            continue
        b = _BARE_HEAD.search(line)
        if b:
            out.append(NcclLine(None, ray_pid, None, b["level"], line[b.end() :].strip(), ray_ip, repeated))
        elif v := _BARE_VERSION.match(line):
            out.append(NcclLine(None, ray_pid, None, "INFO", f"NCCL version {v['v']}", ray_ip, repeated))
    return out

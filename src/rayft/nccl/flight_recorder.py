"""PyTorch's flight-recorder dumps read for a hang: the collective some ranks never entered.

With the flight recorder on (``train.nccl_flight_recorder: true`` sets TORCH_FR_BUFFER_SIZE and
TORCH_NCCL_DUMP_ON_TIMEOUT in every worker), each rank keeps a ring buffer of its last collectives
and, when c10d's watchdog times one out, writes it to ``<prefix><rank>`` (the prefix is
TORCH_FR_DUMP_TEMP_FILE, or TORCH_NCCL_DEBUG_INFO_TEMP_FILE in older PyTorch; rayft points it at
``RUN_DIR/flight_recorder/rank_``). A dump is a pickle of plain data (torch's
``torch/csrc/distributed/c10d/FlightRecorder.hpp``, version "2.x")::

    {"version": "2.10", "pg_config": {pg name: {"name", "desc", "ranks": "[0, 1]"}},
     "pg_status": {pg id: {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}},
     "entries": [{"pg_id", "process_group": (name, desc), "collective_seq_id", "p2p_seq_id", "is_p2p",
                  "profiling_name": "nccl:all_reduce", "input_sizes", "input_dtypes", "state":
                  "scheduled" | "started" | "completed", "timeout_ms", "frames": [{"name", "filename", "line"}], ...}]}

:func:`read_dumps` loads every rank's dump (a restricted unpickler: plain data only, never code);
:func:`analyse` names, per process group, the first collective that some ranks never entered, its
sequence number and those ranks (the usual cause of a hang), or the ranks that disagree on a
collective, or a collective every rank entered that never completed. PyTorch's own analyser
(``python -m torch.distributed.flight_recorder.fr_trace DIR``) goes further: its output is the
next step when this one says too little.

Errors: :class:`rayft.nccl.errors.DoctorError`.
"""

from __future__ import annotations

import io
import pickle
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.nccl.errors import DoctorError
from rayft.nccl.verdict_types import label_ranks

__all__ = ["Dump", "Finding", "analyse", "read_dumps"]

_RANK_FILE = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_TORCH_FRAMES = re.compile(r"/torch/(?:distributed|nn/parallel|_tensor)|/ray/train/")


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: a dump never needs more."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


@dataclass
class Dump:
    """One rank's dump."""

    rank: int
    path: Path
    version: str
    entries: list[dict[str, Any]]
    pg_config: dict[str, Any]
    pg_status: dict[str, Any]


@dataclass
class Finding:
    """What the dumps say about one process group."""

    group: str  # "0 (default_pg)"
    text: str  # what happened, with the collective, its sequence number and the ranks
    next_step: str
    hung: list[int] = field(default_factory=list)  # ranks that never entered the collective (or never completed it)
    seq: int | None = None
    op: str | None = None


def read_dumps(folder: str | Path) -> list[Dump]:
    """Every rank's dump in ``folder`` (files named ``<prefix><rank>``, one prefix), by rank.

    Raises:
        DoctorError: no such folder, no dump in it, or a file that is not a flight-recorder dump.
    """
    d = Path(folder)
    if not d.is_dir():
        raise DoctorError(f"{d} is not a folder: give the folder of the dumps (RUN_DIR/flight_recorder with train.nccl_flight_recorder)")
    by_prefix: dict[str, list[tuple[int, Path]]] = defaultdict(list)
    for p in sorted(d.iterdir()):
        if p.is_file() and (m := _RANK_FILE.match(p.name)):
            by_prefix[m["prefix"]].append((int(m["rank"]), p))
    if not by_prefix:
        raise DoctorError(
            f"no flight-recorder dump in {d} (files named <prefix><rank>): the ranks write them when c10d's watchdog times out a "
            "collective, with train.nccl_flight_recorder: true"
        )
    prefix = max(by_prefix, key=lambda k: len(by_prefix[k]))
    out: list[Dump] = []
    for rank, path in sorted(by_prefix[prefix]):
        try:
            data = _PlainData(io.BytesIO(path.read_bytes())).load()
            out.append(
                Dump(
                    rank,
                    path,
                    str(data["version"]),
                    list(data["entries"]),
                    dict(data.get("pg_config") or {}),
                    dict(data.get("pg_status") or {}),
                )
            )
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise DoctorError(
                f"{path} is not a flight-recorder dump ({type(e).__name__}: {e}): remove it or give its folder's dumps only"
            ) from None
    return out


def _members(group: str, dumps: list[Dump]) -> list[int]:
    """The group's ranks: from its pg_config where a dump has them, else the ranks that logged it."""
    for d in dumps:
        cfg = d.pg_config.get(group) or {}
        ranks = re.findall(r"\d+", str(cfg.get("ranks", "")))
        if ranks:
            return sorted(int(r) for r in ranks)
    return sorted(d.rank for d in dumps if any(str(e["process_group"][0]) == group for e in d.entries) or group in d.pg_status)


def _last(d: Dump, group: str, pg_id: str | None) -> int:
    """The highest collective sequence number rank ``d`` entered in ``group`` (0: none)."""
    seqs = [int(e["collective_seq_id"]) for e in d.entries if str(e["process_group"][0]) == group and not e.get("is_p2p")]
    status = d.pg_status.get(pg_id, {}) if pg_id is not None else {}
    enqueued = int(status.get("last_enqueued_collective", -1) or -1)
    return max(seqs + [enqueued, 0])


def _describe(e: dict[str, Any]) -> str:
    sizes = e.get("input_sizes")
    dtypes = e.get("input_dtypes") or []
    return f"{e['profiling_name']} (input {sizes}{' ' + ', '.join(dtypes) if dtypes else ''})"


def _where(e: dict[str, Any]) -> str:
    """The entry's innermost frame outside torch.distributed (the user's call), if recorded."""
    for f in e.get("frames") or []:
        if not _TORCH_FRAMES.search(str(f.get("filename", ""))):
            return f" at {f.get('filename')}:{f.get('line')} ({f.get('name')})"
    return ""


def analyse(dumps: list[Dump]) -> list[Finding]:
    """Per process group, what went wrong (see the module's docstring); ``[]`` means every rank
    entered and (where the backend records it) completed the same collectives."""
    findings: list[Finding] = []
    by_rank = {d.rank: d for d in dumps}
    groups: dict[str, tuple[str, str | None]] = {}
    for d in dumps:
        for e in d.entries:
            name, desc = str(e["process_group"][0]), str(e["process_group"][1])
            groups.setdefault(name, (desc, str(e.get("pg_id"))))
    for group, (desc, pg_id) in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        label = f"{group} ({desc})" if desc and desc != "undefined" else group
        members = _members(group, dumps)
        missing = [r for r in members if r not in by_rank]
        present = [r for r in members if r in by_rank]
        last = {r: _last(by_rank[r], group, pg_id) for r in present}
        if not last:
            continue
        top, low = max(last.values()), min(last.values())
        entry = {
            r: {int(e["collective_seq_id"]): e for e in by_rank[r].entries if str(e["process_group"][0]) == group and not e.get("is_p2p")}
            for r in present
        }
        if low < top:
            seq = low + 1
            ahead = [r for r in present if last[r] >= seq]
            behind = [r for r in present if last[r] < seq]
            e = next((entry[r][seq] for r in ahead if seq in entry[r]), None)
            what = f"collective #{seq}" + (f" {_describe(e)}{_where(e)}" if e else "")
            lag = []
            for r in behind:
                le = entry[r].get(last[r])
                lag.append(f"rank {r}: #{last[r]} {le['profiling_name']}{_where(le)}" if le else f"rank {r}: #{last[r]}")
            one = len(behind) == 1
            findings.append(
                Finding(
                    label,
                    f"process group {label}: {what} was entered by {'rank' if len(ahead) == 1 else 'ranks'} {label_ranks(ahead)} "
                    f"and never by {'rank' if one else 'ranks'} {label_ranks(behind)} (last entered: {'; '.join(lag)})",
                    f"look at {'rank' if one else 'ranks'} {label_ranks(behind)}: {'its' if one else 'their'} last collective and "
                    "stack say where it stopped (a hang, a slow step, or code that skips the collective on some ranks)",
                    hung=behind,
                    seq=seq,
                    op=e["profiling_name"] if e else None,
                )
            )
        else:
            seq = top
            ops = {r: entry[r].get(seq) for r in present}
            kinds = {(e["profiling_name"], str(e.get("input_sizes"))) for e in ops.values() if e}
            if len(kinds) > 1:
                said = "; ".join(f"rank {r}: {_describe(e)}" for r, e in ops.items() if e)
                findings.append(
                    Finding(
                        label,
                        f"process group {label}: the ranks disagree on collective #{seq} ({said})",
                        "the ranks called different collectives in the same place: code that branches on the rank, "
                        "or a desynchronised step; fix the call order",
                        hung=sorted(present),
                        seq=seq,
                    )
                )
            else:
                stuck = [r for r, e in ops.items() if e and e.get("state") in ("scheduled", "started")]
                tracks = any(e.get("state") == "completed" for d in dumps for e in d.entries)  # gloo records no completion
                if stuck and tracks and seq > 0:
                    e = ops[stuck[0]]
                    findings.append(
                        Finding(
                            label,
                            f"process group {label}: every rank entered collective #{seq} {_describe(e)} and it never completed "
                            f"on {'rank' if len(stuck) == 1 else 'ranks'} {label_ranks(stuck)}",
                            "the network stalled under it: check the ranks' NCCL logs (rayft doctor --run RUN_DIR) for "
                            "EFA completion errors and the nodes' EFA devices",
                            hung=stuck,
                            seq=seq,
                            op=e["profiling_name"],
                        )
                    )
        if missing:
            findings.append(
                Finding(
                    label,
                    f"process group {label}: no dump from {'rank' if len(missing) == 1 else 'ranks'} {label_ranks(missing)}",
                    "those ranks died before dumping, or wrote elsewhere: check that TORCH_FR_DUMP_TEMP_FILE points at storage every node sees",
                    hung=missing,
                )
            )
    return findings

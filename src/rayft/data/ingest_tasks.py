"""Cutting input files into ingest tasks (:func:`plan_tasks`), cheaply (a file's size, a Parquet
footer, the first and last bytes), and reading one task's records (:func:`task_records`); the
tasks run in :mod:`rayft.data.ingest`.

* an uncompressed JSON Lines file (``.jsonl``, or a ``.json`` file holding one object per line)
  larger than the chunk size is cut into byte ranges; a range owns the lines that *start* inside
  it. A first pass counts the newlines of every range (:func:`count_newlines`, in parallel on
  Ray), so each range knows the number of its first line (:func:`number_ranges`) and
  ``file:line`` stays exact;
* a Parquet file is cut by row groups (about the chunk size of data each), rows numbered over the
  whole file (``file:row N``);
* anything else is one task: a JSON array or a single pretty-printed object (they cannot be cut
  without parsing them), a gzip/zstd file (decompressed sequentially, as one stream), an Arrow
  file of a Hugging Face ``datasets`` directory.

Raises (every function here): :class:`~rayft.data.examples.DataError` for problems of the data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from rayft.data.examples import DataError
from rayft.data.sources import COMPRESSED_SUFFIXES, DataFile, file_kind, file_size, open_input

#: Uncompressed JSON Lines files larger than this are cut into byte ranges of about this size, and
#: Parquet files into row-group runs of about this much data (one task each).
CHUNK_BYTES = 64 * 2**20
#: With Ray Data the ranges are cut smaller when that gives every CPU of the cluster at least this
#: many tasks (down to :data:`MIN_CHUNK_BYTES`): with 64 MiB ranges, 117 MiB of input kept 2 of 4
#: CPUs busy (bench/results/2026-12-01-ingest-scaling-1xh200-host.json).
TASKS_PER_CPU = 4
MIN_CHUNK_BYTES = 2**20
_BLOCK = 1 << 22


@dataclass
class Task:
    """One unit of ingest: a whole file (``kind="file"``), a byte range of a JSON Lines file
    (``"range"``: bytes ``[start, end)``, ``newlines_before`` newlines before ``start``, the file's
    trailing run of CR/LF bytes starting at ``tail``), row groups ``[start, end)`` of a Parquet
    file (``"parquet"``, first row ``first_row``) or an Arrow stream file (``"arrow"``).
    ``size``: the input bytes it reads (progress); ``index``: its place in the part's input order."""

    index: int
    part: str
    path: Any
    kind: str = "file"
    start: int = 0
    end: int = 0
    newlines_before: int = 0
    tail: int = 0
    first_row: int = 0
    size: int = 0
    label: str | None = None


# -- planning ---------------------------------------------------------------------------------


def _read_at(f, offset: int, n: int) -> bytes:
    return f.read_at(n, offset) if n > 0 else b""


def _find_newline(f, pos: int, size: int) -> int:
    """The offset of the first ``\\n`` at or after ``pos`` (``size`` if none)."""
    while pos < size:
        block = _read_at(f, pos, min(_BLOCK, size - pos))
        i = block.find(b"\n")
        if i >= 0:
            return pos + i
        pos += len(block)
    return size


def _jsonl_shaped(path: DataFile, f, size: int) -> bool:
    """Is this uncompressed JSON file read as JSON Lines (not a JSON array, not one pretty-printed
    object)? Decided as :func:`rayft.data.readers._json_records` decides, from the first bytes:
    a first non-blank byte ``[`` is an array; in a ``.json`` file a ``{`` whose line is not one
    complete JSON value alone starts a single object (read whole)."""
    head = _read_at(f, 0, min(size, 1 << 20))
    body = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    stripped = body.lstrip()
    if not stripped:
        return True
    if stripped[:1] == b"[":
        return False
    if Path(path.name.lower()).suffix != ".json" or stripped[:1] != b"{":
        return True
    start = len(body) - len(stripped)
    nl = body.find(b"\n", start)
    if nl < 0:
        return False  # the first line does not end in the first MiB: read the file whole
    try:
        line = body[start:nl].decode("utf-8")
        _, end = json.JSONDecoder().raw_decode(line, 0)
    except (ValueError, RecursionError):
        return False
    return not line[end:].strip()


def _tail_start(f, size: int) -> int:
    """Where the file's trailing run of ``\\r``/``\\n`` bytes starts (``size`` when none)."""
    pos = size
    while pos > 0:
        n = min(_BLOCK, pos)
        block = _read_at(f, pos - n, n)
        kept = block.rstrip(b"\r\n")
        if kept:
            return pos - n + len(kept)
        pos -= n
    return 0


def plan_tasks(files: list[DataFile], part: str, chunk_bytes: int = CHUNK_BYTES) -> list[Task]:
    """The tasks of one part (``train`` or ``validation``), in input order (see the module
    docstring). Cheap: sizes, Parquet footers, a file's first MiB and last bytes. A file whose
    footer or head cannot be read here becomes one whole-file task, so its error is reported
    in input order, as the whole-file reader reports it."""
    tasks: list[Task] = []

    def add(**kw) -> None:
        tasks.append(Task(index=len(tasks), part=part, **kw))

    for path in files:
        label = getattr(path, "label", None)
        kind = getattr(path, "reader", None) or file_kind(path.name)
        if kind == "arrow":
            add(path=path, kind="arrow", size=_size_or_0(path), label=label)
            continue
        try:
            size = file_size(path)
        except DataError:
            add(path=path, kind="file")
            continue
        if kind == "parquet":
            groups = _parquet_groups(path, chunk_bytes)
            if groups is None:
                add(path=path, kind="file", size=size)
            else:
                for a, b, first, nbytes in groups:
                    add(path=path, kind="parquet", start=a, end=b, first_row=first, size=nbytes)
            continue
        compressed = path.name.lower().endswith(COMPRESSED_SUFFIXES)
        if kind != "json" or compressed or size <= chunk_bytes:
            add(path=path, kind="file", size=size)
            continue
        try:
            f = open_input(path)
            ranged = _jsonl_shaped(path, f, size)
            tail = _tail_start(f, size) if ranged else size
        except (DataError, OSError):
            ranged = False
        if not ranged:
            add(path=path, kind="file", size=size)
            continue
        for start in range(0, size, chunk_bytes):
            end = min(size, start + chunk_bytes)
            add(path=path, kind="range", start=start, end=end, tail=tail, size=end - start)
    return tasks


def _size_or_0(path) -> int:
    try:
        return file_size(path)
    except DataError:
        return 0


def _parquet_groups(path: DataFile, chunk_bytes: int) -> list[tuple[int, int, int, int]] | None:
    """Runs of row groups ``(first group, end group, first row, bytes)`` of about ``chunk_bytes``
    each (uncompressed sizes from the footer); None when the footer cannot be read."""
    try:
        import pyarrow.parquet as pq

        from rayft.data.sources import S3Object

        meta = pq.ParquetFile(open_input(path) if isinstance(path, S3Object) else path).metadata
    except Exception:
        return None
    out, a, rows, first, nbytes = [], 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        nbytes += rg.total_byte_size
        rows += rg.num_rows
        if nbytes >= chunk_bytes or g == meta.num_row_groups - 1:
            out.append((a, g + 1, first, nbytes))
            a, first, nbytes = g + 1, rows, 0
    return out or [(0, 0, 0, 0)]


def count_newlines(path: DataFile, start: int, end: int) -> int:
    """Newlines in bytes ``[start, end)`` of ``path``."""
    f = open_input(path)
    n, pos = 0, start
    while pos < end:
        block = _read_at(f, pos, min(_BLOCK, end - pos))
        if not block:
            break
        n += block.count(b"\n")
        pos += len(block)
    return n


def number_ranges(tasks: list[Task], counts: list[int]) -> None:
    """Set each range task's ``newlines_before`` from ``counts`` (newlines of each range task, in
    order): the sum over the earlier ranges of the same file."""
    before: dict[str, int] = {}
    for t, n in zip([t for t in tasks if t.kind == "range"], counts):
        key = str(t.path)
        t.newlines_before = before.get(key, 0)
        before[key] = t.newlines_before + n


def ray_chunk_bytes(total_bytes: int, cpus: int) -> int:
    """The byte-range size for Ray Data ingest of ``total_bytes`` of input on ``cpus`` CPUs:
    :data:`CHUNK_BYTES`, or less so that there are :data:`TASKS_PER_CPU` tasks per CPU, never
    under :data:`MIN_CHUNK_BYTES` (a task's fixed costs: a ranged read, a shard's files)."""
    per_task = total_bytes // max(1, TASKS_PER_CPU * cpus)
    return int(min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, per_task)))


# -- one task -------------------------------------------------------------------------------


def range_lines(task: Task) -> tuple[bytes, int, int, dict[str, Any]]:
    """``(data, first line number, byte offset of data in the file, facts)`` of a range task:
    the whole lines starting in ``[start, end)`` (the last one read past ``end`` to its end)."""
    f = open_input(task.path)
    size = f.size()
    if task.start == 0:
        begin, line = 0, 1
    elif _read_at(f, task.start - 1, 1) == b"\n":
        begin, line = task.start, task.newlines_before + 1
    else:
        begin, line = _find_newline(f, task.start, size) + 1, task.newlines_before + 2
    if begin >= task.end or begin >= size:
        return b"", line, begin, {"bom": False, "blank": 0, "crlf": False}
    stop = size if task.end >= size else min(size, _find_newline(f, task.end - 1, size) + 1)
    data = _read_at(f, begin, stop - begin)
    bom = begin == 0 and data.startswith(b"\xef\xbb\xbf")
    if bom:
        data, begin = data[3:], 3
    pieces = data.split(b"\n")
    if data.endswith(b"\n"):
        pieces.pop()  # the next line's start: not this range's
    blank, pos = 0, begin
    for piece in pieces:
        if pos < task.tail and not piece.strip():
            blank += 1
        pos += len(piece) + 1
    return data, line, begin, {"bom": bom, "blank": blank, "crlf": b"\r\n" in data}


def task_records(task: Task, notes: list[str]) -> Iterator[tuple[int, str, object]]:
    from rayft.data import readers

    if task.kind == "range":
        data, line, base, facts = range_lines(task)
        notes.append(facts)  # type: ignore[arg-type]  # facts, merged per file by the driver
        yield from readers.jsonl_records(task.path, data, line, base)
    elif task.kind == "parquet":
        yield from readers.parquet_records(task.path, (task.start, task.end), task.first_row)
    elif task.kind == "arrow":
        yield from readers.arrow_stream_records(task.path, task.label)
    else:
        yield from readers.file_records(task.path, notes)

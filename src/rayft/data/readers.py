"""One data file (or a stretch of it) ─► its records, each with its line (``file:line``; ``file:row
N`` for Parquet and Arrow): JSON arrays, single JSON objects and JSON Lines (gzip/zstd-compressed
too), Parquet files (optionally a run of row groups) and the Arrow stream files of Hugging Face
``datasets``. :func:`jsonl_records` reads whole lines starting at a given line number and byte
offset, so a byte range of a file (:mod:`rayft.data.ingest`) gives exactly the records and
messages of the whole file. A bad JSON Lines line is yielded as a
:class:`~rayft.data.examples.DataError` value so that the caller's bad-record policy can skip it;
problems of the whole file are raised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from rayft.data.examples import DataError, bad_record
from rayft.data.sources import COMPRESSED_SUFFIXES, DataFile, S3Object, file_kind, read_bytes


def _line_index(text: str) -> list[int]:
    starts = [0]
    pos = text.find("\n")
    while pos != -1:
        starts.append(pos + 1)
        pos = text.find("\n", pos + 1)
    return starts


def _line_of(starts: list[int], offset: int) -> int:
    import bisect

    return bisect.bisect_right(starts, offset)


_BOM = b"\xef\xbb\xbf"


def _tolerated(path: DataFile, bom: bool, body: bytes, jsonl: bool) -> str | None:
    """One note for the harmless oddities of a file, or None: a UTF-8 BOM, blank lines between
    JSON Lines records, CRLF line endings. A file with nothing but blanks has no blank-line note
    (a 0-byte file is empty, not one blank line)."""
    found = ["a UTF-8 BOM at the start"] if bom else []
    if jsonl and body.strip():
        blank = sum(1 for line in body.rstrip(b"\r\n").split(b"\n") if not line.strip())
        if blank:
            found.append(f"{blank} blank line{'s' if blank > 1 else ''}")
    if b"\r\n" in body:
        found.append("CRLF line endings")
    return f"{path}: tolerated: {', '.join(found)}" if found else None


def _json_records(path: DataFile, notes: list[str] | None = None) -> Iterator[tuple[int, str, object]]:
    """``(line, "file:line", value)`` per record of a JSON/JSONL file (compressed or not). A
    bad JSONL line is yielded as a :class:`DataError` value (so it can be skipped); problems that
    stop the whole file (unreadable, broken JSON array) are raised. ``notes`` gets one line per
    file with harmless oddities (see :func:`_tolerated`)."""
    raw = read_bytes(path)
    bom = len(_BOM) if raw.startswith(_BOM) else 0
    body = raw[bom:]

    def note(jsonl: bool) -> None:
        line = _tolerated(path, bool(bom), body, jsonl) if notes is not None else None
        if line:
            notes.append(line)

    first = body.lstrip()[:1]
    name = path.name.lower()
    if name.endswith(COMPRESSED_SUFFIXES):
        name = Path(name).stem
    is_json_suffix = Path(name).suffix == ".json"
    if first == b"[":
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            line = body[: e.start].count(b"\n") + 1
            raise DataError(
                f"{path}:{line}: invalid UTF-8 (byte {body[e.start]:#04x} at offset {bom + e.start})", kind="invalid_utf8"
            ) from None
        note(False)
        yield from _json_array_records(path, text)
        return
    if is_json_suffix and first == b"{" and b"\n" in body.strip():
        # one JSON object spread over several lines (a pretty-printed single record)?
        try:
            body.decode("utf-8")
            bad_utf8 = None
        except UnicodeDecodeError as e:
            bad_utf8 = e
        text = body.decode("utf-8", errors="replace")
        stripped = text.lstrip()
        try:
            value, end = json.JSONDecoder().raw_decode(text, len(text) - len(stripped))
        except (ValueError, RecursionError):  # not one object: read as JSON Lines below
            value, end = None, -1
        if isinstance(value, dict) and not text[end:].strip():
            if bad_utf8 is not None:
                e = bad_utf8
                line = body[: e.start].count(b"\n") + 1
                raise DataError(f"{path}:{line}: invalid UTF-8 (byte {body[e.start]:#04x} at offset {bom + e.start})", kind="invalid_utf8")
            line = text[: len(text) - len(stripped)].count("\n") + 1
            note(False)
            yield line, f"{path}:{line}", value
            return
    note(True)
    yield from jsonl_records(path, body, 1, bom)


def jsonl_records(path: DataFile, data: bytes, first_line: int, base_offset: int) -> Iterator[tuple[int, str, object]]:
    """``(line, "file:line", value)`` per non-blank line of JSON Lines ``data``: whole lines of
    ``path`` whose first is line ``first_line`` and starts at byte ``base_offset`` of the file
    (offsets in invalid UTF-8 messages are the file's). A bad line is yielded as a
    :class:`DataError` value. A whole file's body (after a BOM) and a byte range of it
    (:mod:`rayft.data.ingest`) are read alike, so both give the same records and messages."""
    dec = json.JSONDecoder()
    offset = 0
    for lineno, bline in enumerate(data.split(b"\n"), first_line):
        start, offset = offset, offset + len(bline) + 1
        where = f"{path}:{lineno}"
        if not bline.strip():
            continue
        try:
            line = bline.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            yield (
                lineno,
                where,
                bad_record(where, "invalid_utf8", f"invalid UTF-8 (byte {bline[e.start]:#04x} at offset {base_offset + start + e.start})"),
            )
            continue
        if not line:
            continue
        try:
            value, end = dec.raw_decode(line, 0)
        except json.JSONDecodeError as e:
            yield lineno, where, bad_record(where, "invalid_json", f"invalid JSON: {e.msg} (column {e.colno})")
            continue
        except (ValueError, RecursionError) as e:  # e.g. integers over 4300 digits, absurd nesting
            kind = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
            yield lineno, where, bad_record(where, "invalid_json", f"invalid JSON value: {kind}")
            continue
        if line[end:].strip():
            yield lineno, where, bad_record(where, "several_values", "more than one JSON value on one line")
            continue
        yield lineno, where, value


def _json_array_records(path: DataFile, text: str) -> Iterator[tuple[int, str, object]]:
    """Records of a JSON array text; any JSON error stops the file (the array cannot be resynced)."""
    starts = _line_index(text)
    stripped = text.lstrip()
    dec = json.JSONDecoder()

    def decode(pos: int) -> tuple[object, int]:
        try:
            return dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            line = _line_of(starts, e.pos)
            raise DataError(f"{path}:{line}: invalid JSON: {e.msg} (column {e.colno})", kind="invalid_json") from None
        except (ValueError, RecursionError) as e:
            kind = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
            raise DataError(f"{path}:{_line_of(starts, pos)}: invalid JSON value: {kind}", kind="invalid_json") from None

    pos = len(text) - len(stripped) + 1
    n = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos < len(text) and text[pos] == "]":
            pos += 1
            break
        if n:
            if pos >= len(text) or text[pos] != ",":
                raise DataError(f"{path}:{_line_of(starts, pos)}: invalid JSON: expected ',' or ']' between records", kind="invalid_json")
            pos += 1
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
        value, end = decode(pos)
        line = _line_of(starts, pos)
        yield line, f"{path}:{line}", value
        pos, n = end, n + 1
    if text[pos:].strip():
        raise DataError(f"{path}:{_line_of(starts, pos)}: unexpected data after the JSON array", kind="invalid_json")


def _drop_nulls(v: object) -> object:
    """Parquet has no "absent": a null field (e.g. a struct field other rows use) counts as absent."""
    if isinstance(v, dict):
        return {k: _drop_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_drop_nulls(x) for x in v]
    return v


def parquet_records(path: DataFile, row_groups: tuple[int, int] | None = None, first_row: int = 0) -> Iterator[tuple[int, str, object]]:
    """``(row, "file:row N", record)`` per row of a Parquet file (N from 0, counted over the whole
    file): every row, or those of row groups ``[a, b)`` (``row_groups``), whose first row is
    ``first_row``. Read through pyarrow's filesystems (an S3 object by ranged reads)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    from rayft.data.sources import open_input

    try:
        pf = pq.ParquetFile(open_input(path) if isinstance(path, S3Object) else path)
        groups = range(*row_groups) if row_groups is not None else None
        yield from _rows(pf.iter_batches(batch_size=1024, row_groups=groups), str(path), first_row)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None


def _rows(batches, label: str, first_row: int) -> Iterator[tuple[int, str, object]]:
    """``(row, "label:row N", record)`` per row of Arrow record ``batches``, rows numbered from ``first_row``."""
    n = first_row
    for batch in batches:
        for rec in batch.to_pylist():
            yield n, f"{label}:row {n}", _drop_nulls(rec)
            n += 1


def arrow_stream_records(path: DataFile, label: str | None = None) -> Iterator[tuple[int, str, object]]:
    """``(row, "file:row N", record)`` per row of an Arrow IPC *stream* file, the ``data-*.arrow``
    files of a Hugging Face ``datasets`` directory (``save_to_disk``) or cache. ``label`` names the
    file in messages (default: its path)."""
    import pyarrow as pa

    from rayft.data.sources import open_input

    label = label or str(path)
    try:
        with pa.ipc.open_stream(open_input(path)) as reader:
            yield from _rows(reader, label, 0)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{label}: not a readable Arrow stream file ({e})") from None


def file_records(path: DataFile, notes: list[str] | None = None) -> Iterator[tuple[int, str, object]]:
    """``(line or row, "file:line", value)`` per record of one file, by its kind (see the module docstring)."""
    if getattr(path, "reader", None) == "arrow":
        return arrow_stream_records(path)
    return parquet_records(path) if file_kind(path.name) == "parquet" else _json_records(path, notes)


def read_records(path: DataFile) -> Iterator[tuple[int, object]]:
    """Yield ``(line, value)`` for each record of a JSON array, JSON Lines (optionally ``.gz`` or
    ``.zst``) or Parquet file (``line`` is then the row number, from 0).

    Raises:
        DataError: unreadable/corrupt file, invalid UTF-8, invalid JSON (with its line), several
            values on one line, trailing data — at the first one.
    """
    for n, _where, value in file_records(path):
        if isinstance(value, DataError):
            raise value
        yield n, value

"""Records on disk ─► training examples: chat conversations (lists of {"role", "content"} messages)
or raw text documents (continued pre-training).

Readers keep the file and line of every record so that each bad record is reported as
``file:line: reason`` (``file:row N`` for Parquet). Supported inputs:

* ``.json`` (an array of objects, one pretty-printed object, or one object per line) and ``.jsonl``
  (one object per line);
* the same gzip- or zstd-compressed, ``.json.gz`` / ``.jsonl.gz`` / ``.json.zst`` / ``.jsonl.zst``
  (stdlib :mod:`gzip`, the ``zstandard`` package; line numbers are those of the decompressed text,
  so they stay right through compression);
* ``.parquet`` (one record per row, read with pyarrow; rows are reported as ``file.parquet:row N``,
  N counted from 0 as ``table.slice(N, 1)`` reads it; null fields count as absent).

Files are named by path, glob, directory or ``s3://bucket/key`` URI (:func:`expand_files`; S3
objects are read with boto3 and reported as ``s3://bucket/key:line``). bz2, xz, Arrow, CSV, tar and
zip files are refused with a clear message. A UTF-8 BOM, blank lines and CRLF endings are tolerated
and noted once per file (``LoadReport.notes``).

Supported record formats (``data.format``; ``auto`` decides per record by its keys, in this order):

* ``messages``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``;
  ``content`` may also be a list of text parts ``[{"type": "text", "text": str}, ...]`` (the OpenAI /
  Hugging Face chat format), joined without a separator; other parts (images, audio) are refused.
  Tool use: an assistant message may carry ``tool_calls`` (``[{"type": "function", "function":
  {"name", "arguments"}}]``, ``arguments`` an object or a JSON string of one; ``content`` may then be
  null) and ``{"role": "tool", "content": str}`` messages hold tool results.
* ``sharegpt``: ``{"conversations": [{"from": "system"|"human"|"gpt", "value": str}, ...],
  "system": str (optional)}``; ``"user"``/``"assistant"`` are accepted as ``from`` values too.
  Tool use: a ``function_call`` turn (the assistant calls a tool; ``value`` is JSON of ``{"name",
  "arguments"}`` or a list of them) becomes an assistant turn with ``tool_calls``; an
  ``observation`` turn (the tool's result) a ``tool`` turn.

``messages`` and ``sharegpt`` records may have ``tools``: a list of function schemas (or a JSON string
of one), each ``{"type": "function", "function": {...}}`` or a bare ``{"name", "description",
"parameters"}``. The chat template renders them (Qwen2.5: in the system turn), tool calls are
trained like any assistant text, tool results never.
* ``alpaca``: ``{"instruction": str, "input": str (optional), "output": str, "system": str (optional),
  "history": [[user, assistant], ...] (optional)}`` rendered as an optional system turn, the history
  turns, a user turn ``instruction`` (+ ``"\\n"`` + ``input`` when non-empty) and an assistant turn
  ``output`` (the Stanford Alpaca / LLaMA-Factory convention). Detected by ``instruction``/``output``.
* ``text``: ``{"text": str}`` (other keys such as ``url`` are ignored) → a :class:`TextDocument`,
  tokenized without the chat template, loss on every token. Auto-detected when ``text`` is the only
  format key (a record with ``text`` *and* ``instruction``/``output`` is alpaca).

``data.columns`` (``columns=``) gives other names for record fields, turn keys and role names
(:data:`COLUMN_KEYS`, e.g. ``{"instruction": "prompt", "output": "response"}``); a required field
whose name is mapped and missing is reported with its ``data.columns.<key>``.

Refused, with ``file:line`` and the reason: invalid JSON or UTF-8 (or lone surrogates), several
JSON values on one line, a record that is not an object, unknown roles or message keys, non-text
content parts, malformed tool calls or schemas, empty conversations, no assistant turn, an empty assistant turn, a system turn after the
first message, an empty text document, and wrong types. Every :class:`DataError` of a record carries
a short reason category (``kind``, one of :data:`REASON_KINDS`).

Bad-record policy (``data.on_bad_record``): ``error`` (default) stops at the first bad record;
``skip`` skips every bad record and counts it per reason category in the :class:`LoadReport`.
Problems that are not one record's (no such file, an unreadable or corrupt gzip/Parquet file, a
broken JSON array, invalid UTF-8 inside a JSON array) stop the load under either policy.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Union

Format = Literal["auto", "messages", "sharegpt", "alpaca", "text"]
BadRecordPolicy = Literal["error", "skip"]
ROLES = ("system", "user", "assistant", "tool")
#: ShareGPT ``from`` values → roles; a ``function_call`` turn becomes an assistant turn with ``tool_calls``.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "function_call",
    "observation": "tool",
}
#: Keys a message may have, per role (``messages`` format).
MESSAGE_KEYS = {
    "system": {"role", "content"},
    "user": {"role", "content"},
    "assistant": {"role", "content", "tool_calls"},
    "tool": {"role", "content", "name", "tool_call_id"},
}

#: Short reason categories of bad records (``DataError.kind``), used to group skipped records.
REASON_KINDS = (
    "invalid_utf8",
    "invalid_json",
    "several_values",
    "not_an_object",
    "unknown_format",
    "missing_field",
    "wrong_type",
    "invalid_unicode",
    "missing_role",
    "unknown_role",
    "unsupported_key",
    "unsupported_content",
    "tool_use",
    "empty_conversation",
    "no_assistant_turn",
    "empty_assistant_turn",
    "misplaced_system",
    "empty_text",
    "file",
)


class DataError(ValueError):
    """Bad input data. The message is ``where: reason``, ``where`` being ``file:line`` (``file:row N``
    for Parquet) or a path/pattern. Attributes: ``where``, ``reason`` (the message without the
    ``where:`` prefix) and ``kind`` (a short category from :data:`REASON_KINDS`)."""

    def __init__(self, message: str, *, where: str = "", reason: str = "", kind: str = "file"):
        super().__init__(message)
        self.where, self.reason, self.kind = where, reason or message, kind


def _bad(where: str, kind: str, reason: str) -> DataError:
    return DataError(f"{where}: {reason}", where=where, reason=reason, kind=kind)


@dataclass(frozen=True)
class Conversation:
    """One chat training example: its messages, where it came from (``source`` = ``file:line``) and
    the function schemas offered to the model (``tools``, empty without tool use).

    A message is ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``; an assistant
    message may add ``"tool_calls": [{"type": "function", "function": {"name": str, "arguments":
    dict}}, ...]`` (``content`` then may be empty); a ``tool`` message holds a tool's result. Each
    tool is ``{"type": "function", "function": {"name": str, ...}}``. This is the Hugging Face chat
    format that ``apply_chat_template(messages, tools=...)`` takes."""

    messages: tuple[dict, ...]
    source: str
    tools: tuple[dict, ...] = ()


@dataclass(frozen=True)
class TextDocument:
    """One raw-text training example (continued pre-training): no chat template, loss on every token."""

    text: str
    source: str


Example = Union[Conversation, TextDocument]

DATA_SUFFIXES = (".json", ".jsonl")
GZIP_SUFFIX = ".gz"
ZSTD_SUFFIX = ".zst"
COMPRESSED_SUFFIXES = (GZIP_SUFFIX, ZSTD_SUFFIX)
PARQUET_SUFFIX = ".parquet"
UNSUPPORTED_SUFFIXES = (".zstd", ".bz2", ".xz", ".arrow", ".csv", ".tsv", ".tar", ".zip")
SUPPORTED_NOTE = ".json, .jsonl, .json.gz, .jsonl.gz, .json.zst, .jsonl.zst, .parquet"


@dataclass(frozen=True)
class S3Object:
    """An object in S3 (``str()`` is its ``s3://bucket/key`` URI), read whole with boto3, which
    finds credentials, region and endpoint (``AWS_ENDPOINT_URL``) the usual way."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def read_bytes(self) -> bytes:
        """The object's bytes. Raises DataError (no boto3, access denied, no such key...)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return s3_client(str(self)).get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except (BotoCoreError, ClientError) as e:
            raise DataError(f"{self}: cannot read: {e}") from None


DataFile = Path | S3Object


def s3_client(uri: str):
    """A boto3 S3 client (credentials and region from the environment, as boto3 finds them).

    Raises:
        DataError: boto3 is not installed (naming ``uri``).
    """
    try:
        import boto3
    except ImportError:
        raise DataError(f"{uri}: reading s3:// URIs needs boto3 (pip install 'rayft[aws]')") from None
    return boto3.client("s3")


def _file_kind(name: str) -> Literal["json", "compressed", "parquet", "unsupported", "other"]:
    """How a file is read, by the suffixes of its name (case-insensitive); ``other`` = not a data-file
    suffix; ``compressed``: gzip/zstd-compressed JSON or JSON Lines."""
    p = Path(name.lower())
    suf = p.suffix
    if suf in DATA_SUFFIXES:
        return "json"
    if suf == PARQUET_SUFFIX:
        return "parquet"
    if suf in COMPRESSED_SUFFIXES:
        inner = Path(p.stem).suffix
        if inner in DATA_SUFFIXES:
            return "compressed"
        return "unsupported" if inner in UNSUPPORTED_SUFFIXES or inner == PARQUET_SUFFIX else "other"
    return "unsupported" if suf in UNSUPPORTED_SUFFIXES else "other"


def _data_files_of(where: str, files: list) -> list:
    """The data files among a directory's (or S3 prefix's) ``files`` (sorted, each with ``.name``).
    Raises DataError when some are of an unsupported kind, or none is a data file."""
    kinds = {str(p): _file_kind(p.name) for p in files}
    bad = [
        p.name
        for p in files
        if kinds[str(p)] == "unsupported" or (kinds[str(p)] == "other" and p.name.lower().endswith(COMPRESSED_SUFFIXES))
    ]
    if bad:
        raise DataError(
            f"{where}: holds {bad[:3]}: these files are not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
        )
    found = [p for p in files if kinds[str(p)] in ("json", "compressed", "parquet")]
    if not found:
        raise DataError(f"{where}: directory has no data file ({SUPPORTED_NOTE}) (data.train_files)")
    return found


def _expand_s3(uri: str) -> list[S3Object]:
    """``s3://bucket/key``: that object if it exists, else the data files directly under the prefix
    ``key/`` (like a directory; sub-"folders" are not read)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise DataError(f"{uri}: no bucket named (expected s3://bucket/prefix)")
    if glob.has_magic(key):
        raise DataError(f"{uri}: globs are not supported in s3:// URIs; name an object or a prefix")
    client = s3_client(uri)
    try:
        if key and not key.endswith("/"):
            try:
                client.head_object(Bucket=bucket, Key=key)
                obj = S3Object(bucket, key)
                if _file_kind(obj.name) == "unsupported":
                    raise DataError(
                        f"{uri}: this kind of file is not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
                    )
                return [obj]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                    raise
        prefix = key if not key or key.endswith("/") else key + "/"
        keys = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except (BotoCoreError, ClientError) as e:
        raise DataError(f"{uri}: cannot list: {e}") from None
    if not keys:
        raise DataError(f"{uri}: no such object, and no object under {f's3://{bucket}/{prefix}'} (data.train_files)")
    return _data_files_of(uri, [S3Object(bucket, k) for k in sorted(keys)])


def expand_files(patterns: list[str]) -> list[DataFile]:
    """Files named by paths, globs, directories and ``s3://bucket/key`` URIs, in sorted order, each
    once. A directory contributes its ``*.json``, ``*.jsonl``, ``*.json.gz``, ``*.jsonl.gz``,
    ``*.json.zst``, ``*.jsonl.zst`` and ``*.parquet`` files (any case); a file named explicitly is
    read as JSON/JSONL unless its suffix says otherwise (``x.gz`` / ``x.zst``: compressed JSON/JSONL).
    An ``s3://`` URI names one object, or else a prefix read like a directory (:class:`S3Object`).

    Raises:
        DataError: a pattern that matches nothing, a URI other than ``s3://`` or an s3 glob, a
            bz2/xz/Arrow/CSV/tar/zip file (not supported yet), a directory holding such files or no
            data file, a file listed twice, or an S3 error (no credentials, no such bucket, ...).
    """
    out: list[DataFile] = []
    for pat in patterns:
        if pat.startswith("s3://"):
            found = _expand_s3(pat)
        elif "://" in pat:
            raise DataError(f"{pat}: only s3:// URIs are supported by this reader; copy the file locally or to S3")
        elif os.path.isdir(pat):
            found = _data_files_of(pat, sorted(p for p in Path(pat).iterdir() if p.is_file()))
        else:
            found = sorted(Path(p) for p in glob.glob(pat)) if glob.has_magic(pat) and not os.path.exists(pat) else [Path(pat)]
            found = [p for p in found if p.is_file()]
            if not found:
                raise DataError(f"{pat or repr(pat)}: no such data file (data.train_files)")
            for p in found:
                if _file_kind(p.name) == "unsupported":
                    raise DataError(
                        f"{p}: this kind of file is not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
                    )
        out.extend(found)
    seen: set = set()
    for p in out:
        ident = p.resolve() if isinstance(p, Path) else str(p)
        if ident in seen:
            raise DataError(f"{p}: listed more than once in data.train_files (its records would be trained twice)")
        seen.add(ident)
    return out


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


def _unzstd(raw: bytes, path: DataFile) -> bytes:
    """zstd-decompressed ``raw`` (every frame, in order). Raises DataError."""
    try:
        import zstandard
    except ImportError:
        raise DataError(f"{path}: reading .zst files needs the zstandard package (pip install zstandard)") from None
    out, dctx = [], zstandard.ZstdDecompressor()
    try:
        while raw:
            d = dctx.decompressobj()
            out.append(d.decompress(raw))
            if not d.eof:
                raise DataError(f"{path}: the zstd stream ends early (truncated file?)")
            raw = d.unused_data
    except zstandard.ZstdError as e:
        raise DataError(f"{path}: not valid zstd data ({e})") from None
    return b"".join(out)


def _read_bytes(path: DataFile) -> bytes:
    """The file's bytes, decompressed for ``*.gz`` and ``*.zst``. Raises DataError (kind ``file``)."""
    try:
        raw = path.read_bytes()
        suffix = Path(path.name).suffix.lower()
        if suffix == ZSTD_SUFFIX:
            return _unzstd(raw, path)
        if suffix == GZIP_SUFFIX:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                return f.read()
        return raw
    except gzip.BadGzipFile as e:
        raise DataError(f"{path}: not a valid gzip file: {e}") from None
    except EOFError:
        raise DataError(f"{path}: the gzip stream ends early (truncated file?)") from None
    except zlib.error as e:
        raise DataError(f"{path}: corrupt gzip data ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


_BOM = b"\xef\xbb\xbf"


def _tolerated(path: DataFile, bom: bool, body: bytes, jsonl: bool) -> str | None:
    """One note for the harmless oddities of a file, or None: a UTF-8 BOM, blank lines between
    JSON Lines records, CRLF line endings."""
    found = ["a UTF-8 BOM at the start"] if bom else []
    if jsonl:
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
    raw = _read_bytes(path)
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
    dec = json.JSONDecoder()
    offset = 0
    for lineno, bline in enumerate(body.split(b"\n"), 1):
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
                _bad(where, "invalid_utf8", f"invalid UTF-8 (byte {bline[e.start]:#04x} at offset {bom + start + e.start})"),
            )
            continue
        if not line:
            continue
        try:
            value, end = dec.raw_decode(line, 0)
        except json.JSONDecodeError as e:
            yield lineno, where, _bad(where, "invalid_json", f"invalid JSON: {e.msg} (column {e.colno})")
            continue
        except (ValueError, RecursionError) as e:  # e.g. integers over 4300 digits, absurd nesting
            kind = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
            yield lineno, where, _bad(where, "invalid_json", f"invalid JSON value: {kind}")
            continue
        if line[end:].strip():
            yield lineno, where, _bad(where, "several_values", "more than one JSON value on one line")
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


def _parquet_records(path: DataFile) -> Iterator[tuple[int, str, object]]:
    """``(row, "file:row N", record)`` per row of a Parquet file (N from 0)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(io.BytesIO(path.read_bytes()) if isinstance(path, S3Object) else path)
        batches = pf.iter_batches(batch_size=1024)
        n = 0
        for batch in batches:
            for rec in batch.to_pylist():
                yield n, f"{path}:row {n}", _drop_nulls(rec)
                n += 1
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None


def _records(path: DataFile, notes: list[str] | None = None) -> Iterator[tuple[int, str, object]]:
    return _parquet_records(path) if _file_kind(path.name) == "parquet" else _json_records(path, notes)


def read_records(path: DataFile) -> Iterator[tuple[int, object]]:
    """Yield ``(line, value)`` for each record of a JSON array, JSON Lines (optionally ``.gz`` or
    ``.zst``) or Parquet file (``line`` is then the row number, from 0).

    Raises:
        DataError: unreadable/corrupt file, invalid UTF-8, invalid JSON (with its line), several
            values on one line, trailing data — at the first one.
    """
    for n, _where, value in _records(path):
        if isinstance(value, DataError):
            raise value
        yield n, value


#: ``data.columns`` keys: the names this reader uses, which a dataset may spell otherwise. Record
#: fields, then keys of a turn, then role names (values of ``role`` / ``from``).
COLUMN_KEYS = (
    "messages",
    "conversations",
    "system",
    "tools",
    "instruction",
    "input",
    "output",
    "history",
    "text",
    "role",
    "content",
    "tool_calls",
    "from",
    "value",
    "user",
    "assistant",
    "tool",
    "function_call",
)
_ROLE_KEYS = ("user", "assistant", "tool", "function_call")


class _Names:
    """Names under a ``data.columns`` mapping (``{key: the dataset's name}``): ``names("output")`` is
    the dataset's name for ``output``; ``names.hint("output")`` is `` (data.columns.output)`` when
    mapped, for error messages."""

    def __init__(self, columns: dict[str, str] | None = None):
        self.columns = dict(columns or {})

    def __call__(self, key: str) -> str:
        return self.columns.get(key, key)

    def hint(self, key: str) -> str:
        return f" (data.columns.{key})" if key in self.columns else ""

    def roles(self, defaults: dict[str, str]) -> dict[str, str]:
        """``{name in the data: role}``: ``defaults`` with each mapped role's name(s) replaced."""
        out = {name: role for name, role in defaults.items() if role not in self.columns}
        out.update({self.columns[k]: k for k in _ROLE_KEYS if k in self.columns and k in defaults.values()})
        return out


def check_columns(columns: dict[str, str] | None) -> dict[str, str]:
    """Validate a ``data.columns`` mapping (keys from :data:`COLUMN_KEYS`, values non-empty strings).

    Raises:
        ValueError: an unknown key or a bad value, naming ``data.columns.<key>``.
    """
    for k, v in (columns or {}).items():
        if k not in COLUMN_KEYS:
            raise ValueError(f"data.columns.{k}: unknown key (known: {', '.join(COLUMN_KEYS)})")
        if not isinstance(v, str) or not v:
            raise ValueError(f"data.columns.{k}: must be a non-empty string, got {v!r}")
    return dict(columns or {})


_PLAIN = _Names()


def _str_field(rec: dict, key: str, where: str, required: bool, names: _Names = _PLAIN) -> str:
    name = names(key)
    v = rec.get(name)
    if v is None:
        if required:
            raise _bad(where, "missing_field", f"missing field {name!r}{names.hint(key)}")
        return ""
    if not isinstance(v, str):
        raise _bad(where, "wrong_type", f"field {name!r} must be a string, got {type(v).__name__}")
    return _valid_text(v, where, name)


def _valid_text(v: str, where: str, field: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _bad(
            where, "invalid_unicode", f"{field} holds invalid Unicode ({e.reason}, e.g. a lone \\u{ord(v[e.start]):04x} escape)"
        ) from None
    return v


def detect_format(rec: dict, where: str, columns: dict[str, str] | None = None) -> Format:
    """The format of one record by its keys (as named by ``columns``, see :data:`COLUMN_KEYS`):
    ``messages``, ``conversations`` (sharegpt), ``instruction``/``output`` (alpaca), else ``text``.

    Raises:
        DataError: none of these keys (kind ``unknown_format``).
    """
    n = _Names(columns)
    if n("messages") in rec:
        return "messages"
    if n("conversations") in rec:
        return "sharegpt"
    if n("instruction") in rec or n("output") in rec:
        return "alpaca"
    if n("text") in rec:
        return "text"
    raise _bad(
        where,
        "unknown_format",
        f"unknown record format (keys: {sorted(rec)}); expected {n('messages')!r}, sharegpt's {n('conversations')!r}, "
        f"alpaca's {n('instruction')}/{n('output')} or {n('text')!r}",
    )


def to_example(rec: object, where: str, fmt: Format = "auto", columns: dict[str, str] | None = None) -> Example:
    """Turn one record into a :class:`Conversation` (messages, sharegpt, alpaca) or a
    :class:`TextDocument` (text). ``columns`` renames fields, turn keys and roles (``{key: the
    dataset's name}``, keys from :data:`COLUMN_KEYS`, checked by the caller with :func:`check_columns`).

    Raises:
        DataError: not an object, unknown format, missing/unknown role, malformed tool use, wrong
            types, empty conversation or text, no assistant turn (nothing to learn from), or a
            required mapped column missing (the message names ``data.columns.<key>``).
    """
    if not isinstance(rec, dict):
        raise _bad(where, "not_an_object", f"a record must be a JSON object, got {type(rec).__name__}")
    n = _Names(columns)
    if fmt == "auto":
        fmt = detect_format(rec, where, columns)
    if fmt == "text":
        return _text_document(rec, where, n)
    if fmt == "alpaca":
        if n("tools") in rec:
            raise _bad(where, "tool_use", f"{n('tools')!r} is read only in messages and sharegpt records (alpaca has no tool turns)")
        return _alpaca(rec, where, n)
    if fmt == "sharegpt":
        return _sharegpt(rec, where, n)
    return _messages(rec, where, n)


def to_conversation(rec: object, where: str, fmt: Format = "auto") -> Example:
    """Alias of :func:`to_example` (kept for callers of the chat-only reader)."""
    return to_example(rec, where, fmt)


def _text_document(rec: dict, where: str, n: _Names = _PLAIN) -> TextDocument:
    text = _str_field(rec, "text", where, True, n)
    if not text.strip():
        raise _bad(where, "empty_text", f"field {n('text')!r} is empty (nothing to train on)")
    return TextDocument(text, where)


def _alpaca(rec: dict, where: str, n: _Names = _PLAIN) -> Conversation:
    instruction = _str_field(rec, "instruction", where, True, n)
    inp = _str_field(rec, "input", where, False, n)
    output = _str_field(rec, "output", where, True, n)
    system = _str_field(rec, "system", where, False, n)
    user = f"{instruction}\n{inp}" if inp else instruction
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    hname = n("history")
    history = rec.get(hname) or []
    if not isinstance(history, list):
        raise _bad(where, "wrong_type", f"field {hname!r} must be a list of [user, assistant] pairs")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise _bad(where, "wrong_type", f"{hname}[{i}] must be a [user, assistant] pair of strings")
        msgs += [
            {"role": "user", "content": _valid_text(pair[0], where, f"{hname}[{i}][0]")},
            {"role": "assistant", "content": _valid_text(pair[1], where, f"{hname}[{i}][1]")},
        ]
    msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    return _checked(Conversation(tuple(msgs), where))


def _messages(rec: dict, where: str, n: _Names = _PLAIN) -> Conversation:
    field, role_key, content_key, calls_key = n("messages"), n("role"), n("content"), n("tool_calls")
    messages = rec.get(field)
    if messages is None and field != "messages":
        raise _bad(where, "missing_field", f"missing field {field!r}{n.hint('messages')}")
    if not isinstance(messages, list):
        raise _bad(where, "wrong_type", f"field {field!r} must be a list, got {type(messages).__name__}")
    if not messages:
        raise _bad(where, "empty_conversation", "empty conversation")
    tools = _tools(rec, where, n)
    roles = n.roles({r: r for r in ROLES})
    out = []
    for i, m in enumerate(messages):
        turn = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "wrong_type", f"{turn} must be an object, got {type(m).__name__}")
        name = m.get(role_key)
        if name is None:
            raise _bad(where, "missing_role", f"{turn} has no {role_key!r}{n.hint('role')}")
        if not isinstance(name, str) or name not in roles:
            raise _bad(where, "unknown_role", f"{turn} has unknown {role_key} {name!r} (expected one of {', '.join(roles)})")
        role = roles[name]
        extra = set(m) - {n(k) for k in MESSAGE_KEYS[role]}
        if extra:
            raise _bad(
                where,
                "unsupported_key",
                f"{turn} has unsupported key(s) {sorted(extra)} for a {role} message "
                "(names and per-turn weights are not supported yet; remove them or convert the record)",
            )
        msg: dict = {"role": role}
        calls = m.get(calls_key)
        if calls is not None:
            cname = f"{turn}.{calls_key}"
            if not isinstance(calls, list):
                raise _bad(where, "wrong_type", f"{cname} must be a list, got {type(calls).__name__}")
            msg["tool_calls"] = [_tool_call(c, where, f"{cname}[{j}]") for j, c in enumerate(calls)]
        content = m.get(content_key)
        if content_key not in m and content_key != "content" and not msg.get("tool_calls"):
            raise _bad(where, "missing_field", f"{turn} has no {content_key!r}{n.hint('content')}")
        # an assistant message that calls tools may have no content (OpenAI writes null)
        msg["content"] = "" if content is None and msg.get("tool_calls") else _content(content, where, f"{turn}.{content_key}")
        for k in ("name", "tool_call_id"):  # kept for templates that show them (Qwen2.5's does not)
            if k in m:
                if not isinstance(m[k], str):
                    raise _bad(where, "wrong_type", f"{turn}.{k} must be a string, got {type(m[k]).__name__}")
                msg[k] = m[k]
        out.append(msg)
    return _checked(Conversation(tuple(out), where, tools), field=field)


def _tools(rec: dict, where: str, n: _Names = _PLAIN) -> tuple[dict, ...]:
    """The record's ``tools``: a list of function schemas, or a JSON string of one (ShareGPT
    datasets store it so). A bare schema ``{"name", "description", "parameters"}`` is wrapped as
    ``{"type": "function", "function": schema}``; absent, null, ``""`` and ``[]`` mean no tools."""
    field = n("tools")
    v = rec.get(field)
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise _bad(where, "tool_use", f"field {field!r} is not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(v, list):
        raise _bad(
            where, "wrong_type", f"field {field!r} must be a list of function schemas (or a JSON string of one), got {type(v).__name__}"
        )
    out = []
    for i, t in enumerate(v):
        if not isinstance(t, dict):
            raise _bad(where, "wrong_type", f"{field}[{i}] must be an object, got {type(t).__name__}")
        if "function" in t:
            if t.get("type", "function") != "function":
                raise _bad(where, "tool_use", f"{field}[{i}] has type {t.get('type')!r}: only function tools are supported")
            fn, name = t["function"], f"{field}[{i}].function"
            if not isinstance(fn, dict):
                raise _bad(where, "wrong_type", f"{name} must be an object, got {type(fn).__name__}")
            tool = {**t, "type": "function"}
        else:
            fn, name, tool = t, f"{field}[{i}]", {"type": "function", "function": t}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(where, "tool_use", f"{name} has no 'name' (a function schema needs a non-empty string name)")
        _valid_text(json.dumps(tool, ensure_ascii=False), where, f"{field}[{i}]")
        out.append(tool)
    return tuple(out)


def _tool_call(call: object, where: str, name: str) -> dict:
    """One tool call ─► ``{"type": "function", "function": {"name": str, "arguments": dict}}`` (plus
    its ``id`` when given). Accepts that form (``arguments`` may be a JSON string of an object, as the
    OpenAI API writes it) and a bare ``{"name", "arguments"}`` (ShareGPT ``function_call`` values)."""
    if not isinstance(call, dict):
        raise _bad(where, "wrong_type", f"{name} must be an object, got {type(call).__name__}")
    out: dict = {}
    if "function" in call:
        extra = set(call) - {"type", "function", "id"}
        if extra:
            raise _bad(
                where, "unsupported_key", f"{name} has unsupported key(s) {sorted(extra)} (a tool call has 'type', 'function', 'id')"
            )
        if call.get("type", "function") != "function":
            raise _bad(where, "tool_use", f"{name} has type {call.get('type')!r}: only function calls are supported")
        if "id" in call:
            if not isinstance(call["id"], str):
                raise _bad(where, "wrong_type", f"{name}.id must be a string, got {type(call['id']).__name__}")
            out["id"] = call["id"]
        fn, name = call["function"], f"{name}.function"
        if not isinstance(fn, dict):
            raise _bad(where, "wrong_type", f"{name} must be an object, got {type(fn).__name__}")
    else:
        fn = call
    extra = set(fn) - {"name", "arguments"}
    if extra:
        raise _bad(where, "unsupported_key", f"{name} has unsupported key(s) {sorted(extra)} (a function call has 'name' and 'arguments')")
    fname, args = fn.get("name"), fn.get("arguments")
    if not isinstance(fname, str) or not fname:
        raise _bad(where, "tool_use", f"{name} has no 'name' (a non-empty string)")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise _bad(where, "tool_use", f"{name}.arguments is not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(args, dict):
        raise _bad(where, "tool_use", f"{name}.arguments must be an object (or a JSON string of one), got {type(args).__name__}")
    _valid_text(fname + json.dumps(args, ensure_ascii=False), where, name)
    out.update(type="function", function={"name": fname, "arguments": args})
    return out


def _content(content: object, where: str, name: str) -> str:
    """A message's text: a string, or a list of text parts ``{"type": "text", "text": str}`` (the
    OpenAI / Hugging Face chat format), joined without a separator."""
    if isinstance(content, str):
        return _valid_text(content, where, name)
    if not isinstance(content, list):
        raise _bad(where, "wrong_type", f"{name} must be a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        pname = f"{name}[{j}]"
        if not isinstance(part, dict):
            raise _bad(where, "wrong_type", f'{pname} must be an object {{"type": "text", "text": ...}}, got {type(part).__name__}')
        kind = part.get("type")
        if kind != "text":
            what = "has no 'type'" if kind is None else f"is a {kind!r} part"
            raise _bad(where, "unsupported_content", f"{pname} {what}: only text parts are supported")
        extra = set(part) - {"type", "text"}
        if extra:
            raise _bad(where, "unsupported_key", f"{pname} has unsupported key(s) {sorted(extra)} (a text part has 'type' and 'text')")
        text = part.get("text")
        if not isinstance(text, str):
            raise _bad(where, "wrong_type", f"{pname}.text must be a string, got {type(text).__name__}")
        texts.append(_valid_text(text, where, f"{pname}.text"))
    return "".join(texts)


def _sharegpt(rec: dict, where: str, n: _Names = _PLAIN) -> Conversation:
    field, from_key, value_key = n("conversations"), n("from"), n("value")
    turns = rec.get(field)
    if turns is None:
        raise _bad(where, "missing_field", f"missing field {field!r}{n.hint('conversations')}")
    if not isinstance(turns, list):
        raise _bad(where, "wrong_type", f"field {field!r} must be a list, got {type(turns).__name__}")
    if not turns:
        raise _bad(where, "empty_conversation", "empty conversation")
    system = _str_field(rec, "system", where, False, n)
    tools = _tools(rec, where, n)
    roles = n.roles(SHAREGPT_ROLES)
    out: list[dict] = [{"role": "system", "content": system}] if system else []
    for i, t in enumerate(turns):
        turn = f"{field}[{i}]"
        if not isinstance(t, dict):
            raise _bad(where, "wrong_type", f"{turn} must be an object, got {type(t).__name__}")
        extra = set(t) - {from_key, value_key}
        if extra:
            raise _bad(
                where,
                "unsupported_key",
                f"{turn} has unsupported key(s) {sorted(extra)} (only {from_key!r} and {value_key!r} are read; "
                "per-turn weights are not supported yet)",
            )
        frm = t.get(from_key)
        if frm is None:
            raise _bad(where, "missing_role", f"{turn} has no {from_key!r}{n.hint('from')}")
        if not isinstance(frm, str):
            raise _bad(where, "wrong_type", f"{turn}.{from_key} must be a string, got {type(frm).__name__}")
        if frm not in roles:
            raise _bad(where, "unknown_role", f"{turn} has unknown {from_key!r} {frm!r} (expected one of {', '.join(roles)})")
        role = roles[frm]
        if role == "system" and system:
            raise _bad(where, "misplaced_system", f"{turn} is a system turn and the record also has a {n('system')!r} field")
        if value_key not in t and value_key != "value":
            raise _bad(where, "missing_field", f"{turn} has no {value_key!r}{n.hint('value')}")
        value = t.get(value_key)
        if not isinstance(value, str):
            raise _bad(where, "wrong_type", f"{turn}.{value_key} must be a string, got {type(value).__name__}")
        if role == "function_call":  # value: JSON of {"name", "arguments"}, or a list of them
            try:
                calls = json.loads(value)
            except json.JSONDecodeError as e:
                raise _bad(
                    where, "tool_use", f"{turn} is a function_call turn whose value is not valid JSON: {e.msg} (column {e.colno})"
                ) from None
            name = f"{turn}.{value_key}"
            if isinstance(calls, list):
                if not calls:
                    raise _bad(where, "tool_use", f"{name} is an empty list of function calls")
                tool_calls = [_tool_call(c, where, f"{name}[{j}]") for j, c in enumerate(calls)]
            else:
                tool_calls = [_tool_call(calls, where, name)]
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            out.append({"role": role, "content": _valid_text(value, where, f"{turn}.{value_key}")})
    return _checked(Conversation(tuple(out), where, tools), field=field, shift=1 if system else 0, by_index=False)


def _checked(conv: Conversation, field: str = "messages", shift: int = 0, by_index: bool = True) -> Conversation:
    """Reject conversations that would train on nothing, or on empty replies. ``field``/``shift``
    name turn *i* of ``conv.messages`` as ``field[i - shift]`` of the record; ``by_index``: an
    empty assistant turn is named ``assistant turn i`` instead."""
    roles = [m["role"] for m in conv.messages]
    if "assistant" not in roles:
        raise _bad(conv.source, "no_assistant_turn", "no assistant turn (nothing to train on)")
    for i, m in enumerate(conv.messages):
        if m["role"] == "assistant" and not m["content"].strip() and not m.get("tool_calls"):
            name = f"assistant turn {i}" if by_index else f"assistant turn {field}[{i - shift}]"
            raise _bad(conv.source, "empty_assistant_turn", f"{name} is empty (training on it teaches empty replies)")
        if m["role"] == "system" and i > 0:
            raise _bad(conv.source, "misplaced_system", f"{field}[{i - shift}] is a system turn after the first message")
    return conv


@dataclass
class SkippedRecords:
    """Bad records of one reason category that were skipped: how many, and the first one's
    ``file:line`` (``where``) and reason (the message without that prefix)."""

    count: int
    where: str
    reason: str


class LoadReport(list):
    """What :func:`load_conversations` returns: a ``list`` of examples (:class:`Conversation` /
    :class:`TextDocument`, in file order) that also carries ``skipped``: ``{kind: SkippedRecords}``
    for the bad records skipped under ``on_bad_record="skip"`` (empty otherwise), ``records``: how
    many records were read (kept + skipped), and ``notes``: one line per file with harmless oddities
    that were tolerated (``file: tolerated: a UTF-8 BOM at the start, 2 blank lines, CRLF line endings``)."""

    def __init__(self, examples=(), skipped: dict[str, SkippedRecords] | None = None, records: int = 0):
        super().__init__(examples)
        self.skipped: dict[str, SkippedRecords] = skipped if skipped is not None else {}
        self.records = records
        self.notes: list[str] = []

    @property
    def num_skipped(self) -> int:
        return sum(s.count for s in self.skipped.values())

    def skip_summary(self) -> list[str]:
        """Lines for the console: a header, then one line per reason category (most frequent
        first): ``  kind: count (first: file:line: reason)``. Empty when nothing was skipped."""
        if not self.skipped:
            return []
        lines = [f"data: skipped {self.num_skipped} bad record(s) of {self.records} (data.on_bad_record: skip):"]
        for kind, s in sorted(self.skipped.items(), key=lambda kv: (-kv[1].count, kv[0])):
            lines.append(f"  {kind}: {s.count} (first: {s.where}: {s.reason})")
        return lines


def load_conversations(
    patterns: list[str], fmt: Format = "auto", on_bad_record: BadRecordPolicy = "error", columns: dict[str, str] | None = None
) -> LoadReport:
    """Every example in the given files, in file order, as a :class:`LoadReport` (a list).

    With ``on_bad_record="skip"`` a bad record is left out and counted in ``report.skipped`` under
    its reason category; problems of a whole file (see the module docstring) still raise.
    ``columns`` (``data.columns``) renames fields, turn keys and role names, see :data:`COLUMN_KEYS`.

    Raises:
        DataError: with ``"error"``, the first bad record, as ``file:line: reason``; under either
            policy, a missing/unsupported/unreadable file or a broken JSON array.
        ValueError: a bad ``on_bad_record`` or ``columns`` (unknown key: ``data.columns.<key>``).
    """
    if on_bad_record not in ("error", "skip"):
        raise ValueError(f"on_bad_record must be 'error' or 'skip', got {on_bad_record!r}")
    columns = check_columns(columns)
    report = LoadReport()
    for path in expand_files(patterns):
        records = _records(path, report.notes)
        while True:
            try:
                item = next(records, None)
            except DataError as e:
                if on_bad_record == "skip":
                    raise DataError(
                        f"{e} (data.on_bad_record: skip skips single records; this problem stops the whole file)", kind=e.kind
                    ) from None
                raise
            if item is None:
                break
            _n, where, value = item
            report.records += 1
            try:
                if isinstance(value, DataError):
                    raise value
                report.append(to_example(value, where, fmt, columns))
            except DataError as e:
                if on_bad_record == "error":
                    raise
                s = report.skipped.get(e.kind)
                if s is None:
                    report.skipped[e.kind] = SkippedRecords(1, e.where, e.reason)
                else:
                    s.count += 1
    return report

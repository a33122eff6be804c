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
objects are listed with boto3, read through pyarrow's S3 filesystem and reported as
``s3://bucket/key:line``). A Hugging Face ``datasets`` directory (``save_to_disk``) is read through
its Arrow stream files (rows reported as ``dir/data-00000-of-00001.arrow:row N``), a Hub dataset id
(``hf://datasets/org/name``, or ``org/name`` when no such path exists) through ``datasets``.
bz2, xz, loose Arrow, CSV, tar and zip files are refused with a clear message. A UTF-8 BOM, blank lines and CRLF endings are tolerated
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

from dataclasses import dataclass
from typing import Literal

from rayft.data.examples import Conversation, DataError, TextDocument
from rayft.data.readers import file_records, read_records
from rayft.data.records import Format, check_columns, to_example
from rayft.data.sources import expand_files

__all__ = [
    "BadRecordPolicy",
    "Conversation",
    "DataError",
    "LoadReport",
    "SkippedRecords",
    "TextDocument",
    "expand_files",
    "load_conversations",
    "read_records",
    "to_example",
]

BadRecordPolicy = Literal["error", "skip"]


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
        records = file_records(path, report.notes)
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

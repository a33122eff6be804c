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
  Hugging Face chat format; LLaMA-Factory writes ``"value"`` for ``"text"``, read alike), joined
  without a separator; other parts (images, audio, reasoning) are refused.
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

Keys of a message or turn that rayft does not read (``name`` on a user or assistant message, ids,
timestamps, ``metadata``, a text part's ``cache_control``, ...) are ignored, and noted once per file
with the first record that had one (``file: ignored message key(s) [...] (first at file:line)``).
Keys that change what a turn means and that rayft cannot honour are refused instead: ``tool_calls``
on a message that is not the assistant's (or on a ShareGPT turn), the legacy OpenAI
``function_call``, reasoning traces (``reasoning_content``, ``reasoning``, ``thinking``), which
the chat template would drop, and loss masks rayft cannot honour (axolotl's per-span
``train_detail``, ``mask``, ``masked``, ``loss_mask``, ``trainable``, XTuner's ``loss``;
:data:`~rayft.data.records.MEANINGFUL_KEYS`); a null value counts as absent.

Template placeholders left in the data (``data.placeholders``, ``placeholders=``): ``{{name}}`` (an
identifier between double braces) and ``<NAME>`` (upper-case letters, digits and ``_``, two or more,
not right after a letter, digit, ``_`` or ``<``) in any message's content or a text document, outside
Markdown code blocks and inline code. Not placeholders: lower-case ``<name>`` (an XML tag),
``<NAME>`` closed by ``</NAME>`` in the same text, HTML element names (``<TABLE>``, ``<BR>``),
special tokens and role markers (``<UNK>``, ``<EOS>``, ``<USER>``), keys and control characters
(``<ENTER>``, ``<CR>``, ``<F1>``; :data:`~rayft.data.placeholders.NOT_PLACEHOLDERS`),
``List<String>``, ``a < b > c``, ``{{ spaced }}``, ``{{{triple}}}``. A key of ``data.placeholders``
fills the placeholder spelled exactly so: ``name`` fills ``{{name}}``, an upper-case key (``NAME``)
``{{NAME}}`` and ``<NAME>`` (lower-case ``<name>`` is never detected, so never filled); a record the
values empty (a trained reply, a text) is a bad record. Placeholders left are counted per
placeholder with their first locations (``LoadReport.placeholders``) and warned about once, next to
the skip summary (:meth:`LoadReport.placeholder_summary`).

Per-turn training weights: ``weight`` (OpenAI's fine-tuning format) or ``loss_weight``
(LLaMA-Factory's) on a message or ShareGPT turn. On an assistant turn (a ``function_call`` turn
included) 0 means rendered but not trained, 1 trained (the default, also when absent or null);
``0.0``/``1.0`` are read as 0/1. A ``training`` or ``train`` flag (axolotl's
``message_field_training``) means the same: ``false`` as 0, ``true`` as 1. Other values (``0.5``:
fractional weights are not supported, ``"1"``, ``true`` as a weight, ``0`` as a flag) are refused,
and so are keys of one turn that disagree (``weight: 1`` with ``training: false``) and 1 / ``true``
on another turn (rayft trains assistant turns only; 0 / ``false`` there is accepted, as
LLaMA-Factory and axolotl write it on every system and user turn). The weight never reaches the
chat template: the tokens are those of the same record without weights, and only the loss mask
changes (``Conversation.untrained``). A conversation whose assistant turns all have
weight 0 has nothing to train on and is refused (``no_trained_turn``); an assistant turn of weight
0 may be empty.

Refused, with ``file:line`` and the reason: invalid JSON or UTF-8 (or lone surrogates), several
JSON values on one line, a record that is not an object, unknown roles, keys that change a turn's
meaning (above), non-text content parts, malformed tool calls or schemas, bad per-turn weights,
empty conversations, no assistant turn or none trained, an empty (trained) assistant turn, a system
turn after the first message, an empty text document, and wrong types. Every :class:`DataError` of a record carries
a short reason category (``kind``, one of :data:`REASON_KINDS`).

Bad-record policy (``data.on_bad_record``): ``error`` (default) stops at the first bad record;
``skip`` skips every bad record and counts it per reason category, with every location, in the
:class:`LoadReport` (``rayft data check`` lists them all).
Problems that are not one record's (no such file, an unreadable or corrupt gzip/Parquet file, a
broken JSON array, invalid UTF-8 inside a JSON array) stop the load under either policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rayft.data.examples import Conversation, DataError, Example, TextDocument
from rayft.data.placeholders import check_placeholders, fill_placeholders, placeholder_name, placeholders_in
from rayft.data.readers import file_records, read_records
from rayft.data.records import Format, check_columns, to_example
from rayft.data.sources import expand_files

__all__ = [
    "BadRecordPolicy",
    "Conversation",
    "DataError",
    "IgnoredKeys",
    "LoadReport",
    "PlaceholderHits",
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
    """Bad records of one reason category that were skipped: how many, the first one's
    ``file:line`` (``where``) and reason (the message without that prefix), and every one's
    ``(where, reason)``, in input order (``locations``; not compared)."""

    count: int
    where: str
    reason: str
    locations: list[tuple[str, str]] = field(default_factory=list, compare=False, repr=False)


@dataclass
class IgnoredKeys:
    """The message keys of one file that were ignored (:func:`~rayft.data.records.to_example`'s
    ``ignored``): their names, and the first record that had one (``first``, ``file:line``)."""

    keys: set[str]
    first: str

    def note(self, file: str) -> str:
        return f"{file}: ignored message key(s) {sorted(self.keys)} (first at {self.first})"


#: How many locations the console shows per placeholder.
PLACEHOLDER_LOCATIONS = 3


@dataclass
class PlaceholderHits:
    """One template placeholder left in the data: how many records hold it, and the first
    :data:`PLACEHOLDER_LOCATIONS` of them (``file:line``)."""

    records: int
    first: list[str]


class LoadReport(list):
    """What :func:`load_conversations` returns: a ``list`` of examples (:class:`Conversation` /
    :class:`TextDocument`, in file order) that also carries ``skipped``: ``{kind: SkippedRecords}``
    for the bad records skipped under ``on_bad_record="skip"`` (empty otherwise; each with every
    skipped location, for ``rayft data check``), ``records``: how
    many records were read (kept + skipped), and ``notes``: lines about each file's harmless
    oddities, which were tolerated (``file: tolerated: a UTF-8 BOM at the start, 2 blank lines, CRLF
    line endings``), and its ignored message keys (``file: ignored message key(s) ['id', 'name']
    (first at file:line)``), at most one line of each per file; ``placeholders``: ``{placeholder:
    PlaceholderHits}`` for the template placeholders left in the kept examples (after
    ``data.placeholders`` filled those it names, counted in ``filled``).

    One record is read into it with :meth:`take`; reports of parts of the input read apart are
    combined, in input order, with :meth:`merge`."""

    def __init__(self, examples=(), skipped: dict[str, SkippedRecords] | None = None, records: int = 0):
        super().__init__(examples)
        self.skipped: dict[str, SkippedRecords] = skipped if skipped is not None else {}
        self.records = records
        #: ``{file: [lines]}``: the readers' notes of tolerated oddities, per file read, in file order
        self.tolerated: dict[str, list[str]] = {}
        #: ``{file: IgnoredKeys}``, in file order
        self.ignored: dict[str, IgnoredKeys] = {}
        #: ``{placeholder as written: PlaceholderHits}``, in order of first appearance
        self.placeholders: dict[str, PlaceholderHits] = {}
        #: records holding a placeholder (after filling); records data.placeholders filled
        self.placeholder_records = 0
        self.filled = 0

    @property
    def notes(self) -> list[str]:
        """Every note line, file by file: its tolerated oddities, then its ignored keys."""
        files = list(dict.fromkeys([*self.tolerated, *self.ignored]))
        return [line for f in files for line in self.notes_of(f)]

    def notes_of(self, file: str) -> list[str]:
        """The note lines of one file (``str`` of its path or URI)."""
        return [*self.tolerated.get(file, []), *([self.ignored[file].note(file)] if file in self.ignored else [])]

    @property
    def num_skipped(self) -> int:
        return sum(s.count for s in self.skipped.values())

    def take(
        self,
        file: str,
        where: str,
        value: object,
        fmt: Format = "auto",
        columns: dict[str, str] | None = None,
        *,
        on_bad_record: BadRecordPolicy = "error",
        placeholders: dict[str, str] | None = None,
        keep: bool = True,
    ) -> Example | None:
        """Read one record of ``file`` (``value``: what the reader yielded at ``where``, a
        :class:`DataError` for a line that is not a JSON record) into the report: count it, turn it
        into an example (:func:`~rayft.data.records.to_example`; ``columns`` checked by the caller),
        note its ignored keys, fill the template placeholders ``placeholders`` names
        (``data.placeholders``, :func:`~rayft.data.placeholders.fill_placeholders`; a record whose
        reply or text the values empty is a bad record), count those left
        (:func:`~rayft.data.placeholders.placeholders_in`), and append the example unless ``keep`` is False.

        Returns:
            The example, or None when the record was bad and skipped.
        Raises:
            DataError: a bad record under ``on_bad_record="error"``.
        """
        self.records += 1
        ignored: set[str] = set()
        try:
            if isinstance(value, DataError):
                raise value
            ex = to_example(value, where, fmt, columns, ignored=ignored)
            filled = fill_placeholders(ex, placeholders) if placeholders else ex  # checked again: a value may empty a reply
        except DataError as e:
            if on_bad_record == "error":
                raise
            self.skip(e)
            return None
        if ignored:
            seen = self.ignored.get(file)
            if seen is None:
                self.ignored[file] = IgnoredKeys(ignored, where)
            else:
                seen.keys |= ignored
        self.filled += filled is not ex
        ex = filled
        self.add_placeholders(where, placeholders_in(ex))
        if keep:
            self.append(ex)
        return ex

    def add_placeholders(self, where: str, found: list[str]) -> None:
        """Count the placeholders ``found`` in the record at ``where``."""
        if not found:
            return
        self.placeholder_records += 1
        for p in found:
            hits = self.placeholders.setdefault(p, PlaceholderHits(0, []))
            hits.records += 1
            if len(hits.first) < PLACEHOLDER_LOCATIONS:
                hits.first.append(where)

    def placeholder_summary(self, limit: int = 20) -> list[str]:
        """Lines for the console: how many records ``data.placeholders`` filled, and a warning
        with one line per placeholder left (most frequent first, at most ``limit``):
        ``  {{name}}: N record(s) (first: file:line, ...)``. Empty when there is neither."""
        lines = [f"data: data.placeholders filled template placeholders in {self.filled} record(s)"] if self.filled else []
        if not self.placeholders:
            return lines
        names = ", ".join(f"{placeholder_name(p)}: ..." for p in list(self.placeholders)[:4])
        lines.append(
            f"data: warning: template placeholders left in {self.placeholder_records} of {self.records} record(s); "
            f"fill them with data.placeholders ({{{names}}}) or fix the data:"
        )
        ranked = sorted(self.placeholders.items(), key=lambda kv: -kv[1].records)
        for p, hits in ranked[:limit]:
            lines.append(f"  {p}: {hits.records} record(s) (first: {', '.join(hits.first)})")
        if len(ranked) > limit:
            lines.append(f"  ... and {len(ranked) - limit} more placeholder(s)")
        return lines

    def skip(self, e: DataError) -> None:
        """Count the bad record ``e`` as skipped."""
        s = self.skipped.get(e.kind)
        if s is None:
            self.skipped[e.kind] = SkippedRecords(1, e.where, e.reason, [(e.where, e.reason)])
        else:
            s.count += 1
            s.locations.append((e.where, e.reason))

    def merge(self, other: "LoadReport") -> "LoadReport":
        """Add ``other``, the report of input read after this report's (the next file, or the
        next part of a file), as if both had been read in one go: its examples, counts, skipped
        records (this report's first location of a kind stays the first), notes, ignored keys and
        placeholders. Returns this report."""
        self.extend(other)
        self.records += other.records
        for kind, s in other.skipped.items():
            mine = self.skipped.get(kind)
            if mine is None:
                self.skipped[kind] = SkippedRecords(s.count, s.where, s.reason, list(s.locations))
            else:
                mine.count += s.count
                mine.locations += s.locations
        for f, lines in other.tolerated.items():
            mine_lines = self.tolerated.setdefault(f, [])
            mine_lines += [line for line in lines if line not in mine_lines]
        for f, ig in other.ignored.items():
            if f in self.ignored:
                self.ignored[f].keys |= ig.keys
            else:
                self.ignored[f] = IgnoredKeys(set(ig.keys), ig.first)
        for p, hits in other.placeholders.items():
            mine_hits = self.placeholders.setdefault(p, PlaceholderHits(0, []))
            mine_hits.records += hits.records
            mine_hits.first += hits.first[: PLACEHOLDER_LOCATIONS - len(mine_hits.first)]
        self.placeholder_records += other.placeholder_records
        self.filled += other.filled
        return self

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
    patterns: list[str],
    fmt: Format = "auto",
    on_bad_record: BadRecordPolicy = "error",
    columns: dict[str, str] | None = None,
    *,
    placeholders: dict[str, str] | None = None,
    keep: bool = True,
) -> LoadReport:
    """Every example in the given files, in file order, as a :class:`LoadReport` (a list).

    With ``on_bad_record="skip"`` a bad record is left out and counted in ``report.skipped`` under
    its reason category; problems of a whole file (see the module docstring) still raise.
    ``columns`` (``data.columns``) renames fields, turn keys and role names, see :data:`COLUMN_KEYS`.
    ``placeholders`` (``data.placeholders``) fills the template placeholders it names; those left
    are counted in ``report.placeholders``. ``keep=False`` checks and counts every record without
    keeping the examples (the list stays empty).

    Raises:
        DataError: with ``"error"``, the first bad record, as ``file:line: reason``; under either
            policy, a missing/unsupported/unreadable file or a broken JSON array.
        ValueError: a bad ``on_bad_record``, ``columns`` (unknown key: ``data.columns.<key>``) or
            ``placeholders`` (``data.placeholders.<key>``).
    """
    if on_bad_record not in ("error", "skip"):
        raise ValueError(f"on_bad_record must be 'error' or 'skip', got {on_bad_record!r}")
    columns = check_columns(columns)
    placeholders = check_placeholders(placeholders)
    report = LoadReport()
    for path in expand_files(patterns):
        file = str(path)
        records = file_records(path, report.tolerated.setdefault(file, []))
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
            report.take(file, where, value, fmt, columns, on_bad_record=on_bad_record, placeholders=placeholders, keep=keep)
    return report

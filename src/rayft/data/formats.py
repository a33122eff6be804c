"""Records on disk ─► chat conversations (lists of {"role", "content"} messages).

Readers keep the file and line of every record so that each bad record is reported as
``file:line: reason``. Supported inputs: ``.json`` (an array of objects, or one object per line)
and ``.jsonl`` (one object per line). Supported record formats:

* ``messages``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}``
* ``alpaca``: ``{"instruction": str, "input": str (optional), "output": str, "system": str (optional),
  "history": [[user, assistant], ...] (optional)}`` rendered as an optional system turn, the history
  turns, a user turn ``instruction`` (+ ``"\\n"`` + ``input`` when non-empty) and an assistant turn
  ``output`` (the Stanford Alpaca / LLaMA-Factory convention).

Refused, with ``file:line`` and the reason: invalid JSON or UTF-8 (or lone surrogates), a record
that is not an object, unknown roles or message keys, empty conversations, no assistant turn, an
empty assistant turn, a system turn after the first message, and wrong types.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

Format = Literal["auto", "messages", "alpaca"]
ROLES = ("system", "user", "assistant")


class DataError(ValueError):
    """Bad input data. The message starts with ``file:line``."""


@dataclass(frozen=True)
class Conversation:
    """One training example: its messages and where it came from (``source`` = ``file:line``)."""

    messages: tuple[dict[str, str], ...]
    source: str


DATA_SUFFIXES = (".json", ".jsonl")
UNSUPPORTED_SUFFIXES = (".gz", ".zst", ".bz2", ".xz", ".parquet", ".arrow", ".csv")


def expand_files(patterns: list[str]) -> list[Path]:
    """Files named by paths, globs and directories (their ``*.json``/``*.jsonl`` files, any case),
    in sorted order, each once.

    Raises:
        DataError: a pattern that matches nothing, a remote URI or a compressed/columnar file (not
            supported by this reader yet), a directory holding such files, or a file listed twice.
    """
    out: list[Path] = []
    for pat in patterns:
        if "://" in pat:
            raise DataError(f"{pat}: remote URIs are not supported by this reader yet; copy the file locally")
        if os.path.isdir(pat):
            files = sorted(p for p in Path(pat).iterdir() if p.is_file())
            bad = [p.name for p in files if p.suffix.lower() in UNSUPPORTED_SUFFIXES]
            if bad:
                raise DataError(f"{pat}: holds {bad[:3]}: compressed or columnar files are not supported yet (decompress or convert to JSONL)")
            found = [p for p in files if p.suffix.lower() in DATA_SUFFIXES]
            if not found:
                raise DataError(f"{pat}: directory has no .json or .jsonl file (data.train_files)")
        else:
            found = sorted(Path(p) for p in glob.glob(pat)) if glob.has_magic(pat) and not os.path.exists(pat) else [Path(pat)]
            found = [p for p in found if p.is_file()]
            if not found:
                raise DataError(f"{pat or repr(pat)}: no such data file (data.train_files)")
            for p in found:
                if p.suffix.lower() in UNSUPPORTED_SUFFIXES:
                    raise DataError(f"{p}: compressed or columnar files are not supported yet (decompress or convert to JSONL)")
        out.extend(found)
    seen: set[Path] = set()
    for p in out:
        if p.resolve() in seen:
            raise DataError(f"{p}: listed more than once in data.train_files (its records would be trained twice)")
        seen.add(p.resolve())
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


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """Yield ``(line, value)`` for each record of a JSON array or JSON Lines file.

    Raises:
        DataError: unreadable file, invalid UTF-8, invalid JSON (with its line), trailing data.
    """
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 (byte {raw[e.start]:#04x} at offset {e.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    starts = _line_index(text)
    stripped = text.lstrip()
    dec = json.JSONDecoder()

    def decode(s: str, pos: int, line_of_pos) -> tuple[object, int]:
        try:
            return dec.raw_decode(s, pos)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line_of_pos(e.pos)}: invalid JSON: {e.msg} (column {e.colno})") from None
        except (ValueError, RecursionError) as e:  # e.g. integers over 4300 digits, absurd nesting
            kind = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
            raise DataError(f"{path}:{line_of_pos(pos)}: invalid JSON value: {kind}") from None

    if path.suffix.lower() == ".json" and stripped.startswith("{") and "\n" in stripped.strip():
        # one JSON object spread over several lines (a pretty-printed single record)?
        try:
            value, end = dec.raw_decode(text, len(text) - len(stripped))
        except (ValueError, RecursionError):
            value, end = None, -1
        if isinstance(value, dict) and not text[end:].strip():
            yield _line_of(starts, len(text) - len(stripped)), value
            return
    if stripped.startswith("["):
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
                    raise DataError(f"{path}:{_line_of(starts, pos)}: invalid JSON: expected ',' or ']' between records")
                pos += 1
                while pos < len(text) and text[pos] in " \t\r\n":
                    pos += 1
            value, end = decode(text, pos, lambda off: _line_of(starts, off))
            yield _line_of(starts, pos), value
            pos, n = end, n + 1
        if text[pos:].strip():
            raise DataError(f"{path}:{_line_of(starts, pos)}: unexpected data after the JSON array")
        return
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        value, end = decode(line.strip(), 0, lambda _off, n=lineno: n)
        if line.strip()[end:].strip():
            raise DataError(f"{path}:{lineno}: more than one JSON value on one line")
        yield lineno, value


def _str_field(rec: dict, key: str, where: str, required: bool) -> str:
    v = rec.get(key)
    if v is None:
        if required:
            raise DataError(f"{where}: missing field {key!r}")
        return ""
    if not isinstance(v, str):
        raise DataError(f"{where}: field {key!r} must be a string, got {type(v).__name__}")
    return _valid_text(v, where, key)


def _valid_text(v: str, where: str, field: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: {field} holds invalid Unicode ({e.reason}, e.g. a lone \\u{ord(v[e.start]):04x} escape)") from None
    return v


def to_conversation(rec: object, where: str, fmt: Format = "auto") -> Conversation:
    """Turn one record into a conversation.

    Raises:
        DataError: not an object, unknown format, missing/unknown role, wrong types, empty
            conversation, or no assistant turn (nothing to learn from).
    """
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    if "tools" in rec:
        raise DataError(f"{where}: 'tools' (function calling) is not supported yet")
    if fmt == "auto":
        if "messages" in rec:
            fmt = "messages"
        elif "instruction" in rec or "output" in rec:
            fmt = "alpaca"
        else:
            raise DataError(f"{where}: unknown record format (keys: {sorted(rec)}); expected 'messages' or alpaca's instruction/output")
    if fmt == "alpaca":
        instruction = _str_field(rec, "instruction", where, True)
        inp = _str_field(rec, "input", where, False)
        output = _str_field(rec, "output", where, True)
        system = _str_field(rec, "system", where, False)
        user = f"{instruction}\n{inp}" if inp else instruction
        msgs: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        history = rec.get("history") or []
        if not isinstance(history, list):
            raise DataError(f"{where}: field 'history' must be a list of [user, assistant] pairs")
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise DataError(f"{where}: history[{i}] must be a [user, assistant] pair of strings")
            msgs += [{"role": "user", "content": _valid_text(pair[0], where, f"history[{i}][0]")},
                     {"role": "assistant", "content": _valid_text(pair[1], where, f"history[{i}][1]")}]  # fmt: skip
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
        return _checked(Conversation(tuple(msgs), where))
    messages = rec.get("messages")
    if not isinstance(messages, list):
        raise DataError(f"{where}: field 'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise DataError(f"{where}: empty conversation")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}: messages[{i}] must be an object, got {type(m).__name__}")
        extra = set(m) - {"role", "content"}
        if extra:
            raise DataError(
                f"{where}: messages[{i}] has unsupported key(s) {sorted(extra)} "
                "(tool calls, names and per-turn weights are not supported yet; remove them or convert the record)"
            )
        role = m.get("role")
        if role is None:
            raise DataError(f"{where}: messages[{i}] has no 'role'")
        if role not in ROLES:
            raise DataError(f"{where}: messages[{i}] has unknown role {role!r} (expected one of {', '.join(ROLES)})")
        content = m.get("content")
        if not isinstance(content, str):
            raise DataError(f"{where}: messages[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": _valid_text(content, where, f"messages[{i}].content")})
    return _checked(Conversation(tuple(out), where))


def _checked(conv: Conversation) -> Conversation:
    """Reject conversations that would train on nothing, or on empty replies."""
    roles = [m["role"] for m in conv.messages]
    if "assistant" not in roles:
        raise DataError(f"{conv.source}: no assistant turn (nothing to train on)")
    for i, m in enumerate(conv.messages):
        if m["role"] == "assistant" and not m["content"].strip():
            raise DataError(f"{conv.source}: assistant turn {i} is empty (training on it teaches empty replies)")
        if m["role"] == "system" and i > 0:
            raise DataError(f"{conv.source}: messages[{i}] is a system turn after the first message")
    return conv


def load_conversations(patterns: list[str], fmt: Format = "auto") -> list[Conversation]:
    """Every conversation in the given files, in file order.

    Raises:
        DataError: the first bad record, as ``file:line: reason``.
    """
    convs = []
    for path in expand_files(patterns):
        for line, rec in read_records(path):
            convs.append(to_conversation(rec, f"{path}:{line}", fmt))
    return convs

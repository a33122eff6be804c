"""What a record becomes: a :class:`Conversation` or a :class:`TextDocument`, and the data
layer's error, :class:`DataError` (``file:line: reason`` with a reason category)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

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
    "bad_weight",
    "tool_use",
    "empty_conversation",
    "no_assistant_turn",
    "no_trained_turn",
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


def bad_record(where: str, kind: str, reason: str) -> DataError:
    """The :class:`DataError` of one bad record at ``where`` (``file:line``), of category ``kind``."""
    return DataError(f"{where}: {reason}", where=where, reason=reason, kind=kind)


@dataclass(frozen=True)
class Conversation:
    """One chat training example: its messages, where it came from (``source`` = ``file:line``),
    the function schemas offered to the model (``tools``, empty without tool use) and ``untrained``:
    the indices (into ``messages``) of assistant turns that are rendered but not trained (a
    per-turn weight of 0 or ``training: false`` in the record); every other assistant turn is trained.

    A message is ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``; an assistant
    message may add ``"tool_calls": [{"type": "function", "function": {"name": str, "arguments":
    dict}}, ...]`` (``content`` then may be empty); a ``tool`` message holds a tool's result. Each
    tool is ``{"type": "function", "function": {"name": str, ...}}``. This is the Hugging Face chat
    format that ``apply_chat_template(messages, tools=...)`` takes."""

    messages: tuple[dict, ...]
    source: str
    tools: tuple[dict, ...] = ()
    untrained: tuple[int, ...] = ()


@dataclass(frozen=True)
class TextDocument:
    """One raw-text training example (continued pre-training): no chat template, loss on every token."""

    text: str
    source: str


Example = Union[Conversation, TextDocument]

"""Chat conversations ─► token ids + loss mask.

The conversation is rendered once with the tokenizer's chat template. The characters that belong
to each assistant turn are found by rendering prefixes of the conversation (see
:func:`assistant_char_spans`), so the turn's content and its end-of-turn token (``<|im_end|>`` in
ChatML) are trained, and the role header and the newline the template puts after the turn are not. A token is trainable when any of its characters lies in an assistant span. Masking by
character offsets, never by token id, matters: Qwen's pad and eos share an id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayft.data.formats import Conversation, DataError


@dataclass
class TokenizedExample:
    """``input_ids``: int32 [n]; ``trainable``: bool [n], True where the token is a training target."""

    input_ids: np.ndarray
    trainable: np.ndarray
    source: str


_SENTINEL = "RAYFTSPAN7f3a"


def assistant_char_spans(tokenizer, messages: list[dict[str, str]], text: str, where: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of each assistant turn inside ``text`` (the full render).

    Turn *i* starts where its content starts: the position of a sentinel rendered in place of the
    content after ``messages[:i]``. It ends at the end of ``render(messages[:i+1])`` with trailing
    whitespace removed, so the end-of-turn token is included and the newline after it is not.

    Raises:
        DataError: when the template does not render conversation prefixes as prefixes of the
            full text (such templates cannot be masked this way).
    """
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        probe = tokenizer.apply_chat_template([*messages[:i], {"role": "assistant", "content": _SENTINEL}], tokenize=False)
        start = probe.find(_SENTINEL)
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if start < 0 or not text.startswith(probe[:start]) or not text.startswith(upto):
            raise DataError(f"{where}: the chat template does not render conversation prefixes as text prefixes")
        spans.append((start, len(upto.rstrip())))
    return spans


def tokenize_conversation(tokenizer, conv: Conversation) -> TokenizedExample:
    """Render and tokenize one conversation; mark assistant tokens (and their end-of-turn) trainable."""
    messages = list(conv.messages)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = assistant_char_spans(tokenizer, messages, text, conv.source)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    trainable = np.zeros(len(ids), dtype=bool)
    for s, e in spans:
        trainable |= (ends > s) & (starts < e)  # any overlap: a token merging the header's newline
        # with leading newlines of the reply is trained too
    return TokenizedExample(ids, trainable, conv.source)


@dataclass
class TokenizedDataset:
    """A flat store of examples: ``tokens`` int32 [total], ``trainable`` bool [total], ``offsets``
    int64 [n+1] (example *i* is ``tokens[offsets[i]:offsets[i+1]]``), and the drop counts."""

    tokens: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    dropped_no_trainable: int = 0
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.trainable[a:b]


def tokenize_dataset(tokenizer, convs: list[Conversation], seq_len: int) -> TokenizedDataset:
    """Tokenize every conversation, truncating to ``seq_len`` tokens.

    An example whose truncation leaves no trainable *target* (a trainable token after the first
    position) is dropped and counted in ``dropped_no_trainable``; nothing else is dropped.
    """
    ids, masks, lens = [], [], [0]
    dropped = truncated = 0
    for conv in convs:
        ex = tokenize_conversation(tokenizer, conv)
        if len(ex.input_ids) > seq_len:
            truncated += 1
            ex.input_ids, ex.trainable = ex.input_ids[:seq_len], ex.trainable[:seq_len]
        if not ex.trainable[1:].any():
            dropped += 1
            continue
        ids.append(ex.input_ids)
        masks.append(ex.trainable)
        lens.append(len(ex.input_ids))
    if not ids:
        return TokenizedDataset(np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(1, np.int64), dropped, truncated)
    return TokenizedDataset(
        np.concatenate(ids), np.concatenate(masks), np.cumsum(lens, dtype=np.int64), dropped, truncated
    )

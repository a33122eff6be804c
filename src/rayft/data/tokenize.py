"""Training examples ─► token ids + loss mask. One code path per kind of example:

* :class:`~rayft.data.examples.Conversation` (:func:`tokenize_conversation`): rendered with the chat
  template (with the record's tools), loss on assistant turns only, tool calls included (below),
  except the turns the record gave weight 0 (``Conversation.untrained``: rendered exactly as the
  others, not trained). Longer than ``seq_len``: truncated (``truncated``).
* :class:`~rayft.data.examples.TextDocument` (:func:`tokenize_text`, continued pre-training): the text
  tokenized *without* the chat template, preceded by the tokenizer's own leading special tokens (BOS
  for Llama-style tokenizers, none for Qwen) and followed by ``tokenizer.eos_token_id``; loss on every
  token. Longer than ``seq_len``: *split* (never truncated, never dropped) into chunks of at most
  ``seq_len`` tokens, each chunk starting with the last token of the previous one (context only), so
  every token after the document's first is a training target exactly once (``split_documents``).

The conversation is rendered once with the tokenizer's chat template. The characters that belong
to each assistant turn are found by rendering the conversation with the turn's content replaced by
a sentinel and the generation prompt of the turns before it (a turn of tool calls, in a template
that renders no text next to them, with the turn rendered as a plain reply instead; see
:func:`assistant_char_spans`), so the turn's content, what the template adds to it (Qwen3's
``<think>`` block, tool calls) and its end-of-turn token (``<|im_end|>`` in ChatML, ``<|eot_id|>``,
``</s>``, ``<end_of_turn>``, ``<|end|>``) are trained, and the role header and the newline the
template puts after the turn are not. A token is trainable when any of its characters lies in an
assistant span. Masking by character offsets, never by token id, matters: Qwen's pad and eos share
an id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

from rayft.data.examples import Conversation, DataError, TextDocument


@dataclass
class TokenizedExample:
    """``input_ids``: int32 [n]; ``trainable``: bool [n], True where the token is a training target."""

    input_ids: np.ndarray
    trainable: np.ndarray
    source: str


_SENTINEL = "RAYFTSPAN7f3a"
_THINK_END = "</think>"


def end_of_turn(tokenizer) -> str:
    """The text the chat template closes an assistant turn with: the first added token (e.g.
    ``<|im_end|>``, ``<|eot_id|>``, ``</s>``, ``<end_of_turn>``, ``<|end|>``) that it renders after
    an assistant reply, or ``""`` when it renders none (the turn then ends with its content).
    Cached per tokenizer and template."""
    template = getattr(tokenizer, "chat_template", None)
    key = (id(tokenizer), template if isinstance(template, str) else repr(template))
    if key not in _EOT_CACHE:
        probe = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}], tokenize=False
        )
        tail = probe[probe.find(_SENTINEL) + len(_SENTINEL) :]
        added = [t.content for t in tokenizer.added_tokens_decoder.values() if t.content]
        hits = [(tail.find(t), -len(t), t) for t in added if t in tail]
        _EOT_CACHE[key] = min(hits)[2] if hits else ""
    return _EOT_CACHE[key]


_EOT_CACHE: dict[tuple[int, str], str] = {}


def _with_sentinel(message: dict) -> dict:
    """``message`` with its visible content replaced by the sentinel: after a ``</think>`` (and the
    whitespace that follows it) when there is one, so a template that splits the reasoning off
    (Qwen3) renders the same reasoning block."""
    content = message.get("content") or ""
    cut = content.rfind(_THINK_END)
    if cut < 0:
        return {**message, "content": _SENTINEL}
    cut += len(_THINK_END)
    cut += len(content[cut:]) - len(content[cut:].lstrip())
    return {**message, "content": content[:cut] + _SENTINEL}


def _content_bounds(tokenizer, messages: list[dict], i: int, text: str, tools: list[dict] | None) -> tuple[int, int] | None:
    """Where assistant turn ``i``'s content starts and ends in ``text``: rendered with the content
    replaced by the sentinel, the text before the sentinel and the text after it are the start and
    the end of ``text``. None when that variant does not render so (or the template refuses it)."""
    from jinja2.exceptions import TemplateError

    variant_messages = [*messages[:i], _with_sentinel(messages[i]), *messages[i + 1 :]]
    try:
        variant = tokenizer.apply_chat_template(variant_messages, tools=tools, tokenize=False)
    except TemplateError:
        return None
    at = variant.find(_SENTINEL)
    after = len(variant) - at - len(_SENTINEL)
    if at < 0 or variant[:at] != text[:at] or after > len(text) or variant[at + len(_SENTINEL) :] != text[len(text) - after :]:
        return None
    return at, max(len(text) - after, at)


def _tool_call_bounds(tokenizer, messages: list[dict], i: int, text: str, tools: list[dict] | None) -> tuple[int, int] | None:
    """For an assistant turn ``i`` of tool calls without text, in a template that renders no text
    next to tool calls (Llama 3 drops it, Mistral v3 refuses it): the conversation is rendered with
    that turn as a plain reply holding the sentinel; the turn's own text starts where that render
    first differs from ``text`` and ends where the plain render's text after the sentinel begins.
    None unless ``text`` ends with all of that, the turn's text is not empty, and (when the
    generation prompt of the turns before it is a prefix of ``text``) it starts after that prompt:
    a template that leaves the turn out, or renders other turns differently, is not located by
    guesswork."""
    from jinja2.exceptions import TemplateError

    plain = {k: v for k, v in messages[i].items() if k != "tool_calls"} | {"content": _SENTINEL}
    try:
        variant = tokenizer.apply_chat_template([*messages[:i], plain, *messages[i + 1 :]], tools=tools, tokenize=False)
    except TemplateError:
        return None
    at = variant.find(_SENTINEL)
    if at < 0:
        return None
    start = min(len(os.path.commonprefix([text, variant])), at)
    tail = len(variant) - at - len(_SENTINEL)  # what the plain render has after the sentinel: ``text`` must end with all of it
    if len(os.path.commonprefix([text[::-1], variant[::-1]])) < tail or start >= len(text) - tail:
        return None  # the renders differ elsewhere too, or the turn renders no text of its own
    prompt = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True) if i else ""
    if text.startswith(prompt) and start < len(prompt):
        return None  # the difference begins inside the turns before this one
    return start, len(text) - tail


def assistant_char_spans(
    tokenizer, messages: list[dict], text: str, where: str, tools: list[dict] | None = None, *, skip: Collection[int] = ()
) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of each assistant turn inside ``text`` (the full render with
    ``tools``), tool calls included, but not of the turns whose index in ``messages`` is in ``skip``
    (not trained); tool results (``tool`` messages) are never in a span.

    The turn's *content* is located by rendering the whole conversation again with that turn's
    content replaced by a sentinel: the text before the sentinel and the text after it must equal
    the start and the end of ``text`` (so templates whose rendering of a turn depends on the turns
    after it, like Qwen3's reasoning blocks or Mistral's system prompt in the last user turn, are
    handled). A turn of tool calls without text whose template renders no text next to tool calls
    (Llama 3, Mistral v3) is located by rendering it as a plain reply holding the sentinel instead:
    its text is what differs between that render and ``text``. The span starts where the template's
    generation prompt for ``messages[:i]`` ends when that prompt is a prefix of ``text`` (so what the
    template puts between the header and the content, e.g. Qwen3's ``<think>…</think>`` block, is
    trained), else where the content starts; it ends after the first :func:`end_of_turn` text at or
    after the content's end (tool calls in between included), or at the content's end when the
    template has no end-of-turn token.

    Raises:
        DataError: when the conversation cannot be located in its render this way.
    """
    eot = end_of_turn(tokenizer)
    spans, floor = [], 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        bounds = _content_bounds(tokenizer, messages, i, text, tools)
        if bounds is None and m.get("tool_calls") and not m.get("content"):
            bounds = _tool_call_bounds(tokenizer, messages, i, text, tools)
            bounds = bounds if bounds is not None and bounds[0] >= floor else None
        if bounds is None:
            raise DataError(f"{where}: cannot locate assistant turn {i} in the chat template's rendering")
        at, content_end = bounds
        end = content_end
        if eot:
            found = text.find(eot, content_end)
            end = found + len(eot) if found >= 0 else content_end
        if i not in skip:
            start = at
            prompt = tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True) if i else ""
            if i and floor <= len(prompt) <= at and text.startswith(prompt):
                start = len(prompt)
            spans.append((start, end))
        floor = end
    return spans


def tokenize_conversation(tokenizer, conv: Conversation) -> TokenizedExample:
    """Render and tokenize one conversation (with its ``tools``, if any); mark assistant tokens (tool
    calls included) and their end-of-turn trainable, never tool results, nor the assistant turns in
    ``conv.untrained`` (weight 0: rendered, so the token ids do not depend on weights, not trained).

    Raises:
        DataError: the chat template refuses the conversation (its message names the record) or
            cannot be masked (see :func:`assistant_char_spans`).
    """
    from jinja2.exceptions import TemplateError

    messages, tools = list(conv.messages), list(conv.tools) or None
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        spans = assistant_char_spans(tokenizer, messages, text, conv.source, tools, skip=conv.untrained)
    except TemplateError as e:
        raise DataError(f"{conv.source}: {e}") from e
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    trainable = np.zeros(len(ids), dtype=bool)
    for s, e in spans:
        trainable |= (ends > s) & (starts < e)  # any overlap: a token merging the header's newline
        # with leading newlines of the reply is trained too
    return TokenizedExample(ids, trainable, conv.source)


def special_prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer itself puts before a text (``[bos]`` for Llama-style
    tokenizers, ``[]`` for Qwen and GPT-2): what ``tokenizer("a")`` has before ``tokenizer("a",
    add_special_tokens=False)``."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return list(full[:k])
    return []


def tokenize_text(tokenizer, doc: TextDocument, prefix: list[int] | None = None) -> TokenizedExample:
    """Tokenize one raw-text document without the chat template: ``prefix`` (default
    :func:`special_prefix`) + the text's tokens + ``[eos_token_id]``; every token trainable.

    Returns:
        ``input_ids`` int32 [n], ``trainable`` bool [n] (all True), unsplit.
    Raises:
        DataError: the tokenizer has no EOS token.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(f"{doc.source}: the tokenizer has no EOS token, needed to end raw-text documents", kind="file")
    if prefix is None:
        prefix = special_prefix(tokenizer)
    body = tokenizer(doc.text, add_special_tokens=False)["input_ids"]
    ids = np.asarray([*prefix, *body, eos], dtype=np.int32)
    return TokenizedExample(ids, np.ones(len(ids), dtype=bool), doc.source)


def split_chunks(n: int, seq_len: int) -> list[tuple[int, int]]:
    """``[start, end)`` token ranges cutting a document of ``n`` tokens into chunks of at most
    ``seq_len`` (>= 2) tokens; chunk *k+1* starts at the last token of chunk *k*, so every token but
    the first is a target (a token after the chunk's first) in exactly one chunk."""
    chunks, start = [], 0
    while True:
        end = min(start + seq_len, n)
        chunks.append((start, end))
        if end >= n:
            return chunks
        start = end - 1


@dataclass
class TokenizedDataset:
    """A flat store of examples: ``tokens`` int32 [total], ``trainable`` bool [total], ``offsets``
    int64 [n+1] (example *i* is ``tokens[offsets[i]:offsets[i+1]]``), and the drop counts."""

    tokens: np.ndarray
    trainable: np.ndarray
    offsets: np.ndarray
    dropped_no_trainable: int = 0
    truncated: int = 0
    split_documents: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return self.tokens[a:b], self.trainable[a:b]


@dataclass
class ExamplePieces:
    """What one input example becomes (:func:`tokenize_example`): ``pieces``, the kept examples as
    ``(input_ids int32 [n], trainable bool [n])`` pairs, n <= seq_len; ``truncated`` / ``split``
    (0 or 1): a conversation cut to ``seq_len`` / a text document cut into chunks; ``dropped``: how
    many pieces were left out because no trainable target was left in them."""

    pieces: list[tuple[np.ndarray, np.ndarray]]
    truncated: int = 0
    split: int = 0
    dropped: int = 0


def tokenize_example(tokenizer, ex_in: Conversation | TextDocument, seq_len: int, prefix: list[int] | None = None) -> ExamplePieces:
    """Tokenize one example the way :func:`tokenize_dataset` does (truncate a conversation, split a
    text document, drop a piece without a trainable target). ``prefix``: :func:`special_prefix`
    of ``tokenizer``, computed here when None. Both the local and the Ray Data path
    (:mod:`rayft.data.parallel`) call this, so they give identical tokens.

    Raises:
        DataError: from :func:`tokenize_conversation` / :func:`tokenize_text`.
        TypeError: an example of another type.
    """
    out = ExamplePieces([])
    if isinstance(ex_in, TextDocument):
        ex = tokenize_text(tokenizer, ex_in, special_prefix(tokenizer) if prefix is None else prefix)
        chunks = split_chunks(len(ex.input_ids), seq_len)
        out.split = int(len(chunks) > 1)
        pieces = [(ex.input_ids[a:b], ex.trainable[a:b]) for a, b in chunks]
    elif isinstance(ex_in, Conversation):
        ex = tokenize_conversation(tokenizer, ex_in)
        if len(ex.input_ids) > seq_len:
            out.truncated = 1
            ex.input_ids, ex.trainable = ex.input_ids[:seq_len], ex.trainable[:seq_len]
        pieces = [(ex.input_ids, ex.trainable)]
    else:
        raise TypeError(f"expected a Conversation or TextDocument, got {type(ex_in).__name__}")
    for tok, train in pieces:
        if train[1:].any():
            out.pieces.append((tok, train))
        else:
            out.dropped += 1
    return out


def assemble(pieces: Sequence[tuple[np.ndarray, np.ndarray]], dropped: int = 0, truncated: int = 0, split: int = 0) -> "TokenizedDataset":
    """Concatenate ``(input_ids int32 [n], trainable bool [n])`` pieces, in order, into a
    :class:`TokenizedDataset` with the given counts."""
    if not pieces:
        return TokenizedDataset(np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(1, np.int64), dropped, truncated, split)
    lens = np.zeros(len(pieces) + 1, dtype=np.int64)
    lens[1:] = [len(t) for t, _ in pieces]
    return TokenizedDataset(
        np.concatenate([t for t, _ in pieces]).astype(np.int32, copy=False),
        np.concatenate([m for _, m in pieces]).astype(bool, copy=False),
        np.cumsum(lens, dtype=np.int64),
        dropped,
        truncated,
        split,
    )


def tokenize_dataset(tokenizer, examples: Sequence[Conversation | TextDocument], seq_len: int) -> TokenizedDataset:
    """Tokenize every example, in order, in this process (see :func:`tokenize_example`). A
    conversation longer than ``seq_len`` tokens is truncated (counted in ``truncated``); a text
    document longer than ``seq_len`` is split into chunks (each chunk is one example; the document
    counted once in ``split_documents``), see :func:`split_chunks`.

    An example whose truncation leaves no trainable *target* (a trainable token after the first
    position) is dropped and counted in ``dropped_no_trainable``; nothing else is dropped.

    Raises:
        DataError: from :func:`tokenize_conversation` / :func:`tokenize_text`.
        TypeError: an example of another type.
    """
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    dropped = truncated = split = 0
    prefix: list[int] | None = None
    for ex_in in examples:
        if prefix is None and isinstance(ex_in, TextDocument):
            prefix = special_prefix(tokenizer)
        r = tokenize_example(tokenizer, ex_in, seq_len, prefix)
        pieces += r.pieces
        dropped, truncated, split = dropped + r.dropped, truncated + r.truncated, split + r.split
    return assemble(pieces, dropped, truncated, split)


def fingerprint(ds: "TokenizedDataset") -> str:
    """A short content hash (sha256, 16 hex digits) of the tokens, masks and example boundaries."""
    import hashlib

    h = hashlib.sha256()
    for arr in (ds.tokens, ds.trainable, ds.offsets):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]

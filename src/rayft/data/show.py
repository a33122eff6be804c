"""Training examples made visible (`rayft data show`): each example's text in spans of equal loss
mask (trained or context, special tokens as written), the example-length histogram and the
packing efficiency of the run's first epoch; as rich renderables for the terminal, or as one
static, self-contained HTML page (trained spans in ``<mark>``, no script, no external asset)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

#: The rich styles of trained tokens and of context tokens.
TRAINED_STYLE = "bold green"
CONTEXT_STYLE = "dim"
#: The widest histogram bar, in characters.
BAR_WIDTH = 40


def spans(tokenizer: Any, tokens: np.ndarray, trainable: np.ndarray) -> list[tuple[str, bool]]:
    """An example's text as ``(text, trained)`` spans, in order: each run of tokens of equal loss
    mask decoded as one string (``convert_ids_to_tokens`` + ``convert_tokens_to_string``, so
    special tokens such as ``<|im_start|>`` read as written)."""
    tokens, trainable = np.asarray(tokens), np.asarray(trainable, dtype=bool)
    out: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(tokens) + 1):
        if i == len(tokens) or trainable[i] != trainable[start]:
            pieces = tokenizer.convert_ids_to_tokens([int(t) for t in tokens[start:i]])
            out.append((tokenizer.convert_tokens_to_string(pieces), bool(trainable[start])))
            start = i
    return out


def example_text(parts: list[tuple[str, bool]]) -> Text:
    """:func:`spans` as rich text: trained spans in :data:`TRAINED_STYLE`, context dim."""
    text = Text()
    for s, trained in parts:
        text.append(s, style=TRAINED_STYLE if trained else CONTEXT_STYLE)
    return text


@dataclass(frozen=True)
class Bin:
    """Examples of ``lo`` to ``hi`` tokens (both included): ``count`` of them."""

    lo: int
    hi: int
    count: int


def length_histogram(lengths: np.ndarray, bins: int = 8) -> list[Bin]:
    """The example lengths in at most ``bins`` equal-width integer ranges, from the shortest
    example to the longest (no bin for no example at all); the counts sum to ``len(lengths)``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return []
    lo, hi = int(lengths.min()), int(lengths.max())
    width = max(1, -(-(hi - lo + 1) // bins))
    n = (hi - lo) // width + 1
    counts = np.bincount((lengths - lo) // width, minlength=n)
    return [Bin(lo + k * width, min(hi, lo + (k + 1) * width - 1), int(counts[k])) for k in range(n)]


def histogram_table(hist: list[Bin]) -> Table:
    """The histogram as a rich table: length range, count and a bar."""
    table = Table(title="example lengths (tokens)", title_justify="left")
    table.add_column("length", justify="right")
    table.add_column("examples", justify="right")
    table.add_column("")
    top = max((b.count for b in hist), default=0)
    for b in hist:
        bar = "█" * (round(BAR_WIDTH * b.count / top) if top else 0)
        table.add_row(f"{b.lo}–{b.hi}", f"{b.count:,}", bar)
    return table


def first_epoch_efficiency(plan: Any, lengths: np.ndarray, row_len: int) -> float:
    """Non-padding tokens / row tokens over the rows of the plan's first epoch
    (:class:`~rayft.data.packing.StepPlan`, as :meth:`~rayft.data.packing.StepPlan.packing_efficiency`
    counts over the whole plan)."""
    steps = int(np.count_nonzero(np.asarray(plan.epoch_of_step) == 0))
    rows = int(plan.step_offsets[steps])
    examples = plan.rows.examples[: int(plan.rows.offsets[rows])]
    used = int(np.asarray(lengths, dtype=np.int64)[examples].sum())
    return used / max(1, rows * row_len)


def html_page(
    title: str, examples: list[tuple[int, list[tuple[str, bool]]]], hist: list[Bin], efficiency: float | None, summary: str = ""
) -> str:
    """One static, self-contained HTML page: each ``(index, spans)`` example with its trained
    spans in ``<mark>`` (all text escaped), the histogram as a table, the packing efficiency."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}pre{white-space:pre-wrap;background:#f6f6f6;padding:1em}"
        "pre span.ctx{color:#888}mark{background:#c8f0c8}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    if summary:
        out.append(f"<p>{esc(summary)}</p>")
    out.append("<p>Trained tokens are <mark>marked</mark>; context tokens are grey.</p>")
    for index, parts in examples:
        body = "".join(f"<mark>{esc(s)}</mark>" if trained else f'<span class="ctx">{esc(s)}</span>' for s, trained in parts)
        out += [f"<h2>example {index}</h2>", f"<pre>{body}</pre>"]
    out += ["<h2>example lengths (tokens)</h2>", "<table><tr><th>length</th><th>examples</th></tr>"]
    out += [f"<tr><td>{b.lo}–{b.hi}</td><td>{b.count}</td></tr>" for b in hist]
    out.append("</table>")
    if efficiency is not None:
        out.append(f"<p>packing efficiency, first epoch: {100 * efficiency:.1f}% (non-padding / row tokens)</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"

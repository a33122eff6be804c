"""Token ids ─► fixed-length rows, and rows ─► per-rank micro-batches for every optimizer step.

Packing rule (best fit decreasing over the length histogram; TRL's ``bfd`` strategy is the same
idea): examples are grouped by length, longest first, and each goes into the open row with the
*least* free space that still holds it, or opens a new row. Rows are kept in buckets by their exact
free space, so all examples of one length are placed at once: a row with ``s`` free tokens takes
``s // n`` examples of length ``n`` (the tightest rows first), and new rows take ``row_len // n``
each. Within one length, examples are taken in the epoch's shuffled order; the rows are shuffled
afterwards, so every epoch differs and row order does not follow length. Without shuffle
(``data.shuffle: false``) examples are taken in file order and the rows are ordered by their
smallest example index, so training roughly follows the files (rows opened longest first would
otherwise put the longest examples at the start). Padding mode (no packing) puts one example per
row, in the shuffled (or file) order. The rule's version, :data:`PACKING_RULE`, is stored in
checkpoints: a resume under another rule sees other rows, and says so.

Cost: Python loops over the distinct lengths and, for each, the free-space buckets it fills (both
at most ``row_len + 1``), never over the examples; numpy does the per-example work. For each length
``n`` numpy also scans the bucket counts from ``n`` up for rows that fit, in chunks of 1024, 2048,
... buckets that stop once the length is placed (:meth:`_Buckets.spaces_from`): that term is at
most ``row_len`` × the distinct lengths counts, in practice a chunk or two per length (200k
examples of uniform lengths at ``row_len`` 131072: about 3 CPU s; a scan of every bucket above
``n`` took 13 s). One epoch's plan of 10M examples drawn from the real files' lengths (``seq_len``
2048) takes 2.3 CPU s on the 2-CPU development machine; the best fit before (examples in visiting
order, free space in a sorted Python list) was quadratic: 18.4 CPU s at 4M. Packing efficiency went
from 99.3 % to 99.8 % there, and up on each sample file (``bench/plan_time.py``,
``bench/results/2026-12-01-plan-time-2cpu.json``).

Inside a row, position ids restart at 0 for every document; the padding tail continues the last
document's positions. With no attention mask, transformers (≥ 5) derives a block-diagonal causal
mask from restarting position ids (``masking_utils.find_packed_sequence_indices``) and varlen
FlashAttention uses them as sequence boundaries, so attention never crosses documents.

Everything here is a pure function of (example lengths, seed, epoch, world size, batch settings):
a resumed run sees exactly the rows an uninterrupted run would. The data is any :class:`Examples`
(such as :class:`~rayft.data.tokenize.TokenizedDataset`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np
import torch

IGNORE_INDEX = -100
#: The packing rule's version (best fit decreasing; rows shuffled, or in order of their first
#: example), stored in each checkpoint's state (``"packing"``; ``"none"`` in padding mode): a
#: checkpoint of another rule, or of none (written before it was recorded), resumes with other
#: rows, which the resume warns about (:func:`rayft.train.loop.resume_note`).
PACKING_RULE = "bfd-1"


def packing_rule(packing: bool) -> str:
    """What a checkpoint records of the rows' rule: :data:`PACKING_RULE`, or ``"none"`` in padding
    mode (one example per row, unchanged since before the rule was recorded)."""
    return PACKING_RULE if packing else "none"


class Examples(Protocol):
    """The training data as packing and collation read it: ``lengths()`` int64 [n] (tokens per
    example) and ``example(i)`` → (token ids int32 [m], trainable bool [m])."""

    def __len__(self) -> int: ...

    def lengths(self) -> np.ndarray: ...

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


def example_lengths(data: Examples | np.ndarray | Sequence[int]) -> np.ndarray:
    """Tokens per example, int64 [n]: ``data.lengths()``, or ``data`` itself when it is an array."""
    lengths = data.lengths() if hasattr(data, "lengths") else data
    return np.asarray(lengths, dtype=np.int64)


def index_dtype(n_examples: int) -> type:
    """The dtype of example indices: int32 below 2**31 examples, else int64."""
    return np.int32 if n_examples < 2**31 else np.int64


@dataclass(frozen=True, eq=False)
class Rows:
    """Rows of examples as flat arrays (CSR): row *r* holds ``examples[offsets[r]:offsets[r + 1]]``.

    ``offsets``: int64 [R + 1], from 0. ``examples``: example indices, :func:`index_dtype`
    [offsets[-1]].
    """

    offsets: np.ndarray
    examples: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lists(self, start: int = 0, stop: int | None = None) -> list[list[int]]:
        """Rows ``start:stop`` as lists of example indices (Python ints)."""
        stop = len(self) if stop is None else min(int(stop), len(self))
        if start >= stop:
            return []
        offs = self.offsets[start : stop + 1]
        flat = self.examples[offs[0] : offs[-1]].tolist()
        cuts = (offs - offs[0]).tolist()
        return [flat[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def select(self, rows: Sequence[int] | np.ndarray) -> list[list[int]]:
        """The rows of these indices, in this order, as lists of example indices."""
        return [self.examples[self.offsets[r] : self.offsets[r + 1]].tolist() for r in np.asarray(rows, dtype=np.int64).tolist()]

    def tokens(self, lengths: np.ndarray) -> np.ndarray:
        """Tokens in each row, int64 [R], given the examples' ``lengths`` (int [n])."""
        csum = np.zeros(len(self.examples) + 1, dtype=np.int64)
        np.cumsum(np.asarray(lengths, dtype=np.int64)[self.examples], out=csum[1:])
        return csum[self.offsets[1:]] - csum[self.offsets[:-1]]

    def by_first_example(self) -> "Rows":
        """The same rows (none empty), ordered by their smallest example index; each row's examples
        keep their order."""
        if len(self) < 2:
            return self
        order = np.argsort(np.minimum.reduceat(self.examples, self.offsets[:-1]), kind="stable")
        sizes = np.diff(self.offsets)[order]
        offsets = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        take = np.repeat(self.offsets[:-1][order] - offsets[:-1], sizes) + np.arange(offsets[-1])
        return Rows(offsets, self.examples[take])


class _Buckets:
    """Row ids by exact free space (0 … ``row_len``): each bucket a stack of id chunks (int arrays),
    so moving k rows costs O(chunks touched), never a copy of the bucket. Full rows are not kept."""

    def __init__(self, row_len: int):
        self.chunks: list[list[np.ndarray]] = [[] for _ in range(row_len + 1)]
        self.count = np.zeros(row_len + 1, dtype=np.int64)

    def take(self, space: int, k: int) -> np.ndarray:
        """Remove ``k`` rows (at most ``count[space]``) from bucket ``space``; their ids."""
        stack, out, need = self.chunks[space], [], k
        while need:
            top = stack[-1]
            if len(top) <= need:
                out.append(stack.pop())
                need -= len(top)
            else:
                out.append(top[len(top) - need :])
                stack[-1] = top[: len(top) - need]
                need = 0
        self.count[space] -= k
        return out[0] if len(out) == 1 else np.concatenate(out)

    def put(self, space: int, ids: np.ndarray) -> None:
        if space > 0:
            self.chunks[space].append(ids)
            self.count[space] += len(ids)

    def spaces_from(self, n: int, first: int = 1024) -> Iterator[int]:
        """The non-empty buckets of ``n`` or more free tokens, ascending, found lazily: ``count`` is
        scanned in chunks of ``first`` buckets, then twice as many each time, so a caller that stops
        at bucket ``b`` has scanned at most ``2 (b - n) + first`` counts, not all ``row_len - n``.
        The same buckets, in the same order, as ``flatnonzero(count[n:]) + n`` taken before the
        first step, as long as the caller changes only the bucket it was last given and buckets
        below it (:func:`pack_rows` moves rows from bucket ``s`` to emptier buckets, below ``s``)."""
        start, width, end = n, first, len(self.count)
        while start < end:
            stop = min(end, start + width)
            yield from (np.flatnonzero(self.count[start:stop]) + start).tolist()
            start, width = stop, width * 2


def pack_rows(lengths: np.ndarray, order: np.ndarray, row_len: int, shuffle_rows: np.random.Generator | None = None) -> Rows:
    """Best-fit-decreasing packing of the examples in ``order`` into rows of at most ``row_len`` tokens.

    Args:
        lengths: tokens per example, int [n]. order: the example indices to pack, int [m] (a
            permutation of ``range(n)`` for an epoch); within one length, examples are placed in
            this order. shuffle_rows: when given, the rows come out in ``shuffle_rows.permutation(R)``
            order (else in the order they were opened).
    Returns:
        The rows; every example of ``order`` appears exactly once, no row holds more than
        ``row_len`` tokens. Within a row, examples are in placement order (longest first).
    Raises:
        ValueError: an example longer than ``row_len`` (the first in ``order``), or ``row_len`` < 1.
    """
    if row_len < 1:
        raise ValueError(f"the row length must be at least 1, got {row_len}")
    lengths, order = np.asarray(lengths), np.asarray(order)
    dtype = index_dtype(len(lengths))
    visit = lengths[order].astype(np.int64)
    too_long = np.flatnonzero(visit > row_len)
    if too_long.size:
        i = int(order[too_long[0]])
        raise ValueError(f"example {i} has {int(lengths[i])} tokens, more than the row length {row_len}")
    # grouped by length, longest first; within a length in `order` (a stable sort: radix on 16-bit keys)
    key = (row_len - visit).astype(np.uint16 if row_len < 2**16 else np.int64)
    by_len = order[np.argsort(key, kind="stable")].astype(dtype, copy=False)
    per_length = np.bincount(visit, minlength=row_len + 1)
    # placements: (row ids, examples per row, first position in by_len); examples go to rows in by_len order
    placed: list[tuple[np.ndarray, int, int]] = []
    buckets = _Buckets(row_len)
    n_rows = pos = 0
    for n in np.flatnonzero(per_length)[::-1].tolist():
        left = int(per_length[n])
        if n == 0:  # no tokens: all into the first row (opened here if there is none)
            placed.append((np.zeros(1, np.int64), left, pos))
            n_rows, pos = max(n_rows, 1), pos + left
            continue
        for space in buckets.spaces_from(n):  # the tightest rows that fit, first (found lazily: the loop stops early)
            per, k = space // n, int(buckets.count[space])
            full = min(k, left // per)  # rows filled with `per` examples each
            if full:
                ids = buckets.take(space, full)
                placed.append((ids, per, pos))
                buckets.put(space - per * n, ids)
                pos, left = pos + full * per, left - full * per
            if left and full < k:  # fewer than `per` left: one more row of this bucket takes them
                ids = buckets.take(space, 1)
                placed.append((ids, left, pos))
                buckets.put(space - left * n, ids)
                pos, left = pos + left, 0
            if not left:
                break
        if left:  # new rows, row_len // n examples each (the last one maybe fewer)
            per = row_len // n
            full, rest = divmod(left, per)
            if full:
                ids = np.arange(n_rows, n_rows + full, dtype=np.int64)
                placed.append((ids, per, pos))
                buckets.put(row_len - per * n, ids)
                n_rows, pos = n_rows + full, pos + full * per
            if rest:
                ids = np.array([n_rows], dtype=np.int64)
                placed.append((ids, rest, pos))
                buckets.put(row_len - rest * n, ids)
                n_rows, pos = n_rows + 1, pos + rest
    return _lay_out(placed, by_len, n_rows, shuffle_rows)


def _lay_out(placed: list[tuple[np.ndarray, int, int]], by_len: np.ndarray, n_rows: int, shuffle_rows: np.random.Generator | None) -> Rows:
    """The CSR rows of :func:`pack_rows`'s placements (a counting sort: no per-example sort)."""
    new_id = np.arange(n_rows, dtype=np.int64)
    if shuffle_rows is not None:
        new_id[shuffle_rows.permutation(n_rows)] = np.arange(n_rows)  # new row j is old row perm[j]
    sizes = np.zeros(n_rows, dtype=np.int64)
    for ids, per, _ in placed:
        sizes[new_id[ids]] += per  # ids are distinct within one placement
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    fill = offsets[:-1].copy()  # the next free slot of each row
    examples = np.empty(len(by_len), dtype=by_len.dtype)
    for ids, per, pos in placed:
        rows = new_id[ids]
        slots = fill[rows]
        examples[(slots[:, None] + np.arange(per)).ravel()] = by_len[pos : pos + len(ids) * per]
        fill[rows] = slots + per
    return Rows(offsets, examples)


def epoch_rows(lengths: np.ndarray, epoch: int, seed: int, row_len: int, packing: bool, shuffle: bool) -> Rows:
    """The rows of one epoch, in training order.

    ``lengths``: tokens per example, int [n]. The examples are visited in
    ``np.random.default_rng([seed, epoch]).permutation(n)`` order (``range(n)`` without
    ``shuffle``); with ``packing`` they are packed by :func:`pack_rows` and the rows shuffled with
    the same generator (without ``shuffle``: ordered by their smallest example index,
    :meth:`Rows.by_first_example`, so they follow the files), else each is one row.

    Raises:
        ValueError: with ``packing``, an example longer than ``row_len``.
    """
    lengths = np.asarray(lengths)
    n = len(lengths)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n) if shuffle else np.arange(n)
    if not packing:
        return Rows(np.arange(n + 1, dtype=np.int64), order.astype(index_dtype(n)))
    if shuffle:
        return pack_rows(lengths, order, row_len, rng)
    return pack_rows(lengths, order, row_len).by_first_example()


@dataclass(frozen=True, eq=False)
class StepPlan:
    """Which rows every optimizer step of the run uses, as flat arrays.

    ``rows``: every row of the run in training order (:class:`Rows`, epochs one after the other).
    ``step_offsets``: int64 [S + 1]; step *s* uses rows ``step_offsets[s]:step_offsets[s + 1]``
    (its global batch; an epoch's last step may be short). ``epoch_of_step``: int32 [S], from 0.
    ``rows_per_step``: the global batch in rows (world size × micro-batch size × accumulation).
    """

    rows: Rows
    step_offsets: np.ndarray
    epoch_of_step: np.ndarray
    rows_per_step: int

    def __len__(self) -> int:
        return len(self.step_offsets) - 1

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    def step_rows(self, step: int) -> list[list[int]]:
        """Step ``step``'s global batch: its rows as lists of example indices."""
        return self.rows.lists(int(self.step_offsets[step]), int(self.step_offsets[step + 1]))

    def epoch(self, step: int) -> int:
        """The epoch (from 0) step ``step`` (from 0) belongs to."""
        return int(self.epoch_of_step[step])

    def epochs(self, n_examples: int) -> float:
        """Passes over the data: examples the plan trains on ÷ ``n_examples`` (fractional when
        ``max_steps`` stops mid-epoch)."""
        return len(self.rows.examples) / max(1, n_examples)

    def packing_efficiency(self, data: Examples | np.ndarray, row_len: int) -> float:
        """Non-padding tokens / row tokens over every row of the plan (1.0: no padding at all).

        ``data``: the examples (or their lengths, int [n]). Rows are ``row_len`` tokens long, as in
        packing mode (padding mode pads each micro-batch only to its longest row, so there this is
        a lower bound).
        """
        used = int(example_lengths(data)[self.rows.examples].sum())
        return used / max(1, self.n_rows * row_len)


def plan_steps(
    data: Examples | np.ndarray,
    *,
    rows_per_step: int,
    row_len: int,
    packing: bool,
    shuffle: bool,
    seed: int,
    epochs: int,
    max_steps: int | None,
) -> StepPlan:
    """Cut each epoch's rows (:func:`epoch_rows`) into global batches of ``rows_per_step`` rows
    (an epoch's last may be short). ``data``: the examples, or their lengths (int [n]).

    ``epochs`` epochs (at least one); with ``max_steps``, as many epochs as needed, stopping after
    ``max_steps`` steps (so a shorter ``max_steps`` gives a prefix of the same plan).

    Raises:
        ValueError: no example; with ``packing``, an example longer than ``row_len``.
    """
    lengths = example_lengths(data)
    if len(lengths) == 0:
        raise ValueError("empty dataset")
    dtype = index_dtype(len(lengths))
    offsets, examples, steps, epoch_of = [np.zeros(1, np.int64)], [], [np.zeros(1, np.int64)], []
    n_rows = n_steps = n_examples = epoch = 0
    while max_steps is None or n_steps < max_steps:
        rows = epoch_rows(lengths, epoch, seed, row_len, packing, shuffle)
        k = -(-len(rows) // rows_per_step)
        if max_steps is not None:
            k = min(k, max_steps - n_steps)
        keep = min(len(rows), k * rows_per_step)
        offsets.append(rows.offsets[1 : keep + 1] + n_examples)
        examples.append(rows.examples[: rows.offsets[keep]])
        steps.append(np.minimum(np.arange(1, k + 1, dtype=np.int64) * rows_per_step, keep) + n_rows)
        epoch_of.append(np.full(k, epoch, dtype=np.int32))
        n_rows, n_steps, n_examples, epoch = n_rows + keep, n_steps + k, n_examples + int(rows.offsets[keep]), epoch + 1
        if max_steps is None and epoch >= epochs:
            break
    return StepPlan(
        Rows(np.concatenate(offsets), np.concatenate(examples) if examples else np.zeros(0, dtype)),
        np.concatenate(steps),
        np.concatenate(epoch_of) if epoch_of else np.zeros(0, np.int32),
        rows_per_step,
    )


def rank_micro_batches(
    step_rows: list[list[int]], rank: int, world_size: int, micro_batch_size: int, grad_accum_steps: int
) -> list[list[list[int]]]:
    """This rank's ``grad_accum_steps`` micro-batches for one step (rows ``rank::world_size``).

    A rank short of rows at the end of an epoch gets empty micro-batches, which still run a forward
    and backward (with no trainable token) so the collectives of every rank stay in step.
    """
    mine = step_rows[rank::world_size]
    return [mine[a * micro_batch_size : (a + 1) * micro_batch_size] for a in range(grad_accum_steps)]


def collate(
    ds: Examples,
    rows: list[list[int]],
    row_len: int,
    pad_id: int,
    *,
    fixed_len: bool = True,
    pad_to_multiple: int = 64,
    min_rows: int = 1,
) -> dict[str, torch.Tensor]:
    """Build one micro-batch.

    Returns:
        ``input_ids``, ``position_ids``, ``labels``: int64 [B, L]; ``labels[b, t]`` is the token
        that position ``t`` must predict (already shifted; −100 where not trained).
        ``trained_positions``: int64 [T], the flat indices into ``B·L`` of the targets ≠ −100,
        ascending (the loss runs the LM head over those only: :meth:`rayft.train.loss.TokenLoss.compute`).
        ``num_tokens`` / ``num_trainable``: int64 scalars (non-pad tokens, trained targets = ``T``);
        ``attn_tokens_sq``: float64 scalar, Σ document length² (for the attention FLOPs term).
        ``cu_seq_lens``: int32 [n_docs + 1], document boundaries over the flattened ``B·L`` tokens
        (a row's padding tail belongs to its last document, as its position ids do), for
        variable-length attention.
        ``L`` is ``row_len`` when ``fixed_len`` (packing), else the longest row rounded up to
        ``pad_to_multiple`` (padding mode). ``B`` is ``len(rows)``, at least ``min_rows``: missing
        rows are all-pad rows (no token counted or trained), so that with packing every step of a
        run has the same shape, the epoch's shorter last step too (a compiled model would
        otherwise recompile for it). Examples of no token add nothing.

    Raises:
        ValueError: a row's examples hold more than ``L`` tokens (the packer never makes one).
    """
    B = max(len(rows), min_rows, 1)
    fetched = [[ds.example(ex) for ex in row] for row in rows]  # (tokens, trainable) per example, per row
    if fixed_len:
        L = row_len
    else:
        longest = max((sum(len(tok) for tok, _ in row) for row in fetched), default=1)
        L = min(row_len, -(-longest // pad_to_multiple) * pad_to_multiple)
    ids = np.full((B, L), pad_id, dtype=np.int64)
    pos = np.zeros((B, L), dtype=np.int64)
    labels = np.full((B, L), IGNORE_INDEX, dtype=np.int64)
    n_tok, sq = 0, 0.0
    for b in range(B):
        row = [(tok, train) for tok, train in (fetched[b] if b < len(rows) else []) if len(tok)]  # an all-pad row is one document
        t = 0
        if row:
            lens = np.array([len(tok) for tok, _ in row], dtype=np.int64)
            t = int(lens.sum())
            if t > L:
                raise ValueError(f"row {b} of the micro-batch (examples {rows[b]}) holds {t} tokens, more than its length {L}")
            tokens = np.concatenate([tok for tok, _ in row]).astype(np.int64, copy=False)  # -100 must fit: never unsigned
            starts = np.cumsum(lens) - lens  # each document's first position in the row
            ids[b, :t] = tokens
            pos[b, :t] = np.arange(t) - np.repeat(starts, lens)
            # position i predicts token i+1 of the same document, where that token is trained
            predicts = np.zeros(t, dtype=bool)
            predicts[:-1] = np.concatenate([train for _, train in row])[1:]
            predicts[starts[1:] - 1] = False  # a document's last token predicts nothing
            labels[b, : t - 1] = np.where(predicts[:-1], tokens[1:], IGNORE_INDEX)
            n_tok += t
            sq += float((lens.astype(np.float64) ** 2).sum())
        if t < L:  # padding tail continues the last document's positions (never attended by it)
            start = int(pos[b, t - 1]) + 1 if t else 0
            pos[b, t:] = np.arange(start, start + L - t)
    flat = pos.reshape(-1)
    cu = np.append(np.flatnonzero(flat == 0), flat.size).astype(np.int32)
    trained = np.flatnonzero(labels.reshape(-1) != IGNORE_INDEX)
    return {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(pos),
        "cu_seq_lens": torch.from_numpy(cu),
        "labels": torch.from_numpy(labels),
        "trained_positions": torch.from_numpy(trained.astype(np.int64, copy=False)),
        "num_tokens": torch.tensor(n_tok),
        "num_trainable": torch.tensor(trained.size),
        "attn_tokens_sq": torch.tensor(sq, dtype=torch.float64),
    }

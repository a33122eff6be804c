"""Token ids ─► fixed-length rows, and rows ─► per-rank micro-batches for every optimizer step.

Packing rule (best fit, in shuffled order): examples are visited in the epoch's shuffled order;
each goes into the open row with the *least* free space that still holds it, or opens a new row.
Rows are then shuffled again, so row order does not follow example length. Padding mode puts one
example per row.

Inside a row, position ids restart at 0 for every document; the padding tail continues the last
document's positions. With no attention mask, transformers (≥ 5) derives a block-diagonal causal
mask from restarting position ids (``masking_utils.find_packed_sequence_indices``) and varlen
FlashAttention uses them as sequence boundaries, so attention never crosses documents.

Everything here is a pure function of (dataset, seed, epoch, world size): a resumed run sees
exactly the rows an uninterrupted run would.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
import torch

from rayft.data.tokenize import TokenizedDataset

IGNORE_INDEX = -100


def pack_rows(lengths: np.ndarray, order: np.ndarray, row_len: int) -> list[list[int]]:
    """Best-fit packing of examples (visited in ``order``) into rows of at most ``row_len`` tokens.

    Returns:
        Rows as lists of example indices; every example appears exactly once.
    Raises:
        ValueError: an example longer than ``row_len``.
    """
    free: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    rows: list[list[int]] = []
    for i in order.tolist():
        n = int(lengths[i])
        if n > row_len:
            raise ValueError(f"example {i} has {n} tokens, more than the row length {row_len}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            space, r = free.pop(k)
            rows[r].append(i)
            space -= n
        else:
            r, space = len(rows), row_len - n
            rows.append([i])
        if space > 0:
            bisect.insort(free, (space, r))
    return rows


def epoch_rows(ds: TokenizedDataset, epoch: int, seed: int, row_len: int, packing: bool, shuffle: bool) -> list[list[int]]:
    """The rows of one epoch, in training order."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(ds)) if shuffle else np.arange(len(ds))
    if not packing:
        return [[int(i)] for i in order]
    rows = pack_rows(ds.lengths(), order, row_len)
    if shuffle:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    return rows


@dataclass
class StepPlan:
    """Which rows every optimizer step uses: ``rows[step]`` is the step's global list of rows."""

    rows: list[list[list[int]]]
    epoch_of_step: list[int]

    def __len__(self) -> int:
        return len(self.rows)

    def epochs(self, n_examples: int) -> float:
        """Passes over the data: examples the plan trains on ÷ ``n_examples`` (fractional when
        ``max_steps`` stops mid-epoch)."""
        return sum(len(row) for step in self.rows for row in step) / max(1, n_examples)

    def packing_efficiency(self, ds: TokenizedDataset, row_len: int) -> float:
        """Non-padding tokens / row tokens over every row of the plan (1.0: no padding at all).

        Rows are ``row_len`` tokens long, as in packing mode (padding mode pads each micro-batch
        only to its longest row, so there this is a lower bound).
        """
        lengths = ds.lengths()
        rows = [row for step in self.rows for row in step]
        used = sum(int(lengths[row].sum()) for row in rows)
        return used / max(1, len(rows) * row_len)


def plan_steps(
    ds: TokenizedDataset,
    *,
    rows_per_step: int,
    row_len: int,
    packing: bool,
    shuffle: bool,
    seed: int,
    epochs: int,
    max_steps: int | None,
) -> StepPlan:
    """Cut each epoch's rows into global batches of ``rows_per_step`` rows (the last may be short).

    With ``max_steps`` the plan runs as many epochs as needed and stops at ``max_steps``.
    """
    if len(ds) == 0:
        raise ValueError("empty dataset")
    steps: list[list[list[int]]] = []
    epoch_of: list[int] = []
    epoch = 0
    while True:
        rows = epoch_rows(ds, epoch, seed, row_len, packing, shuffle)
        for s in range(math.ceil(len(rows) / rows_per_step)):
            if max_steps is not None and len(steps) >= max_steps:
                return StepPlan(steps, epoch_of)
            steps.append(rows[s * rows_per_step : (s + 1) * rows_per_step])
            epoch_of.append(epoch)
        epoch += 1
        if max_steps is None and epoch >= epochs:
            return StepPlan(steps, epoch_of)


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
    ds: TokenizedDataset,
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
        ``num_tokens`` / ``num_trainable``: int64 scalars (non-pad tokens, trained targets);
        ``attn_tokens_sq``: float64 scalar, Σ document length² (for the attention FLOPs term).
        ``cu_seq_lens``: int32 [n_docs + 1], document boundaries over the flattened ``B·L`` tokens
        (a row's padding tail belongs to its last document, as its position ids do), for
        variable-length attention.
        ``L`` is ``row_len`` when ``fixed_len`` (packing), else the longest row rounded up to
        ``pad_to_multiple`` (padding mode). ``B`` is ``len(rows)``, at least ``min_rows``: missing
        rows are all-pad rows (no token counted or trained), so that with packing every step of a
        run has the same shape, the epoch's shorter last step too (a compiled model would
        otherwise recompile for it).
    """
    B = max(len(rows), min_rows, 1)
    if fixed_len:
        L = row_len
    else:
        lengths = ds.lengths()
        longest = max((int(lengths[row].sum()) for row in rows), default=1)
        L = min(row_len, -(-longest // pad_to_multiple) * pad_to_multiple)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    pos = torch.zeros((B, L), dtype=torch.long)
    labels = torch.full((B, L), IGNORE_INDEX, dtype=torch.long)
    n_tok, sq = 0, 0.0
    for b in range(B):
        row = rows[b] if b < len(rows) else []  # an all-pad row (empty micro-batch) is one document
        t = 0
        for ex in row:
            tok, train = ds.example(ex)
            n = len(tok)
            ids[b, t : t + n] = torch.from_numpy(tok.astype(np.int64))
            pos[b, t : t + n] = torch.arange(n)
            tgt = torch.from_numpy(tok[1:].astype(np.int64))
            tgt[torch.from_numpy(~train[1:])] = IGNORE_INDEX  # ~ in numpy: a new, writable array (the dataset's may be read-only)
            labels[b, t : t + n - 1] = tgt
            t += n
            n_tok += n
            sq += float(n) * n
        if t < L:  # padding tail continues the last document's positions (never attended by it)
            start = int(pos[b, t - 1]) + 1 if t else 0
            pos[b, t:] = torch.arange(start, start + L - t)
    flat = pos.flatten()
    starts = torch.nonzero(flat == 0).flatten()
    cu = torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int32)
    return {
        "input_ids": ids,
        "position_ids": pos,
        "cu_seq_lens": cu,
        "labels": labels,
        "num_tokens": torch.tensor(n_tok),
        "num_trainable": (labels != IGNORE_INDEX).sum(),
        "attn_tokens_sq": torch.tensor(sq, dtype=torch.float64),
    }

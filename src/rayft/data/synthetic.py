"""Random-token training data (``data.synthetic``): full-length rows for throughput benchmarks.

Every example is ``seq_len`` token ids drawn uniformly from ``[0, vocab_size)`` by
``numpy.random.default_rng(seed)``, every token trainable, so with packing on each example fills
exactly one row and every row is ``seq_len`` non-padding tokens. The same ``(rows, seq_len,
vocab_size, seed)`` gives the same ids everywhere (``rayft bench train`` feeds the identical rows
to every recipe it compares).
"""

from __future__ import annotations

import numpy as np

from rayft.data.tokenize import TokenizedDataset


def random_dataset(rows: int, seq_len: int, vocab_size: int, seed: int = 0) -> TokenizedDataset:
    """``rows`` examples of ``seq_len`` random token ids in ``[0, vocab_size)``, all trainable.

    Raises:
        ValueError: ``rows`` < 1, ``seq_len`` < 2 or ``vocab_size`` < 2.
    """
    if rows < 1 or seq_len < 2 or vocab_size < 2:
        raise ValueError(f"synthetic data needs rows >= 1, seq_len >= 2, vocab_size >= 2 (got {rows}, {seq_len}, {vocab_size})")
    ids = np.random.default_rng(seed).integers(0, vocab_size, size=rows * seq_len, dtype=np.int64).astype(np.int32)
    offsets = np.arange(rows + 1, dtype=np.int64) * seq_len
    return TokenizedDataset(ids, np.ones(rows * seq_len, dtype=bool), offsets)

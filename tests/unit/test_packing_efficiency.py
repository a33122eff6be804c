"""Best fit decreasing packs the real sample files (../shared/data, Qwen2.5 tokens) at least as
well as the best fit in visiting order it replaced: within 0.5 percentage points, or better."""

import bisect

import numpy as np
import pytest
from conftest import shared_path

from rayft.data.packing import epoch_rows

FILES = ("alpaca_en_demo.json", "alpaca_zh_demo.json", "c4_demo.jsonl")


def best_fit_in_visiting_order(lengths: np.ndarray, order: np.ndarray, row_len: int) -> list[list[int]]:
    """The reference: the packer before best fit decreasing (each example, in ``order``, into the
    open row with the least free space that holds it; free space in a sorted list)."""
    free: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    rows: list[list[int]] = []
    for i in order.tolist():
        n = int(lengths[i])
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


@pytest.fixture(scope="module")
def file_lengths(qwen_tokenizer):
    """Tokens per example of a shared file at a sequence length, as training tokenizes it."""
    from rayft.data.formats import load_conversations
    from rayft.data.tokenize import tokenize_dataset

    cache: dict[tuple[str, int], np.ndarray] = {}

    def get(name: str, seq_len: int) -> np.ndarray:
        if (name, seq_len) not in cache:
            examples = list(load_conversations([str(shared_path("data", name))]))
            cache[name, seq_len] = tokenize_dataset(qwen_tokenizer, examples, seq_len).lengths()
        return cache[name, seq_len]

    return get


@pytest.mark.parametrize("seq_len", [2048, 512])
@pytest.mark.parametrize("name", FILES)
def test_packing_efficiency_on_the_real_files_is_at_least_best_fits(file_lengths, name, seq_len):
    lengths = file_lengths(name, seq_len)
    assert len(lengths) >= 300 and lengths.max() <= seq_len
    total = int(lengths.sum())
    for epoch in range(3):
        rows = epoch_rows(lengths, epoch, 0, seq_len, packing=True, shuffle=True)
        assert sorted(rows.examples.tolist()) == list(range(len(lengths))) and rows.tokens(lengths).max() <= seq_len
        order = np.random.default_rng([0, epoch]).permutation(len(lengths))  # the epoch's visiting order
        reference = best_fit_in_visiting_order(lengths, order, seq_len)
        new, old = total / (len(rows) * seq_len), total / (len(reference) * seq_len)
        assert new >= old - 0.005, f"{name} at {seq_len}, epoch {epoch}: {new:.4f} vs best fit {old:.4f}"

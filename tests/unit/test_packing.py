"""Packing, the step plan, sharding, and packed-vs-alone loss equality."""

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayft.data import packing
from rayft.data.packing import IGNORE_INDEX, Rows, collate, epoch_rows, index_dtype, pack_rows, plan_steps, rank_micro_batches
from rayft.data.tokenize import TokenizedDataset


def make_ds(lengths, seed=0, vocab=5000):
    rng = np.random.default_rng(seed)
    toks = [rng.integers(0, vocab, n).astype(np.int32) for n in lengths]
    train = [rng.random(n) > 0.4 for n in lengths]
    return TokenizedDataset(np.concatenate(toks), np.concatenate(train), np.cumsum([0] + list(lengths)))


def test_packing_places_every_example_once_within_row_len():
    rng = np.random.default_rng(1)
    lengths = rng.integers(5, 60, 500)
    rows = pack_rows(lengths, rng.permutation(500), 128)
    assert rows.offsets.dtype == np.int64 and rows.examples.dtype == np.int32 and rows.offsets[0] == 0
    flat = sorted(i for r in rows.lists() for i in r)
    assert flat == list(range(500))
    assert rows.tokens(lengths).max() <= 128
    assert rows.tokens(lengths).tolist() == [int(lengths[r].sum()) for r in rows.lists()]
    efficiency = lengths.sum() / (128 * len(rows))
    assert efficiency > 0.995  # best fit decreasing: 0.998 here (best fit in visiting order 0.983, next fit 0.835)
    with pytest.raises(ValueError, match="example 1 has 200 tokens, more than the row length 128"):
        pack_rows(np.array([10, 200, 300]), np.array([0, 1, 2]), 128)


def sequential_bfd_fills(lengths, order, row_len):
    """A reference: best fit decreasing one example at a time (a plain list of free spaces); the
    sorted tokens per row (which of several equally tight rows is taken is not the rule's)."""
    free = []
    for i in sorted(order.tolist(), key=lambda i: -lengths[i]):
        fits = [r for r in range(len(free)) if free[r] >= lengths[i]]
        if fits:
            free[min(fits, key=lambda r: free[r])] -= lengths[i]
        else:
            free.append(row_len - lengths[i])
    return sorted(row_len - f for f in free)


def test_rows_are_best_fit_decreasing_one_example_at_a_time():
    # placing all examples of a length at once (buckets of rows by free space) is the same rule as
    # placing them one by one, longest first, each into the tightest row that holds it
    rng = np.random.default_rng(7)
    for _ in range(60):
        row_len = int(rng.integers(4, 50))
        lengths = rng.integers(1, row_len + 1, int(rng.integers(1, 150)))
        order = rng.permutation(len(lengths))
        rows = pack_rows(lengths, order, row_len)
        assert sorted(rows.tokens(lengths).tolist()) == sequential_bfd_fills(lengths, order, row_len)
        assert sorted(rows.examples.tolist()) == list(range(len(lengths)))


def test_best_fit_decreasing_rule_on_a_small_case():
    # The old rule (best fit in visiting order) gave [[8, 7, 6, 5], [4, 3, 2], [1, 0]] here.
    # Best fit decreasing, rows of 10, visiting order 8, 7, …, 0:
    #   length 6 (example 1): no row yet → row A = [1], 4 free
    #   length 5 (example 3): no row with 5 free → row B = [3], 5 free
    #   length 3 (example 6): tightest row with ≥ 3 free is A (4) → A = [1, 6], 1 free
    #   length 2 (examples 8, 7, 5, 4, 2, 0, in visiting order): tightest with ≥ 2 free is B (5),
    #     which takes 5 // 2 = 2 of them → B = [3, 8, 7], 1 free; the other 4 open row C, which
    #     takes up to 10 // 2 = 5 → C = [5, 4, 2, 0], 2 free
    lengths = np.array([2, 6, 2, 5, 2, 2, 3, 2, 2])
    rows = pack_rows(lengths, np.arange(9)[::-1], 10)
    assert rows.lists() == [[1, 6], [3, 8, 7], [5, 4, 2, 0]]
    assert rows.offsets.tolist() == [0, 2, 5, 9]
    assert rows.select([2, 0]) == [[5, 4, 2, 0], [1, 6]] and rows.lists(1, 2) == [[3, 8, 7]] and rows.tokens(lengths).tolist() == [9, 9, 8]
    # new rows take row_len // n examples of length n each; the last one the rest
    assert pack_rows(np.full(7, 3), np.arange(7), 10).lists() == [[0, 1, 2], [3, 4, 5], [6]]
    # examples of no tokens go into the first row
    assert pack_rows(np.array([0, 4, 0]), np.arange(3), 10).lists() == [[1, 0, 2]]


def plain_spaces_from(buckets, n):
    """The reference scan: every non-empty bucket of ``n`` or more free tokens, all found before the
    first placement of length ``n`` (what pack_rows did before the chunked scan)."""
    return (np.flatnonzero(buckets.count[n:]) + n).tolist()


def test_the_chunked_bucket_scan_gives_the_rows_of_the_plain_scan(monkeypatch):
    chunked = packing._Buckets.spaces_from
    rng = np.random.default_rng(11)
    for case in range(120):
        row_len = int(rng.choice([1, 2, 7, 33, 64, 65, 200, 1500, 5000]))
        n = int(rng.integers(1, 300))
        low = 0 if case % 5 == 0 else 1  # some examples of no tokens
        if case % 3 == 0:
            lengths = rng.integers(low, row_len + 1, n)
        elif case % 3 == 1:  # mostly short, a few long: rows with much free space
            lengths = np.clip(rng.geometric(min(1.0, 8 / row_len), n), low, row_len)
        else:  # few distinct lengths
            lengths = rng.choice(rng.integers(low, row_len + 1, 4), n)
        order = rng.permutation(n)
        with monkeypatch.context() as m:
            m.setattr(packing._Buckets, "spaces_from", plain_spaces_from)
            want = pack_rows(lengths, order, row_len, np.random.default_rng(case))
        for first in (1, 2, 3, 64, 1024, None):
            with monkeypatch.context() as m:
                if first is not None:  # None: the default chunk size
                    m.setattr(packing._Buckets, "spaces_from", functools.partialmethod(chunked, first=first))
                got = pack_rows(lengths, order, row_len, np.random.default_rng(case))
            assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.examples, want.examples), (case, first)
            assert got.examples.dtype == want.examples.dtype


def test_the_chunked_scan_stops_early():
    buckets = packing._Buckets(100_000)
    buckets.put(70, np.arange(3))
    buckets.put(90_000, np.arange(3, 5))
    spaces = buckets.spaces_from(10, first=4)
    assert next(spaces) == 70  # found in chunks of 4, 8, 16, 32 buckets: the counts above 70 untouched so far
    assert list(spaces) == [90_000]
    assert list(buckets.spaces_from(90_001)) == [] and list(buckets.spaces_from(100_000)) == []


def test_without_shuffle_packed_rows_follow_the_files():
    # data.shuffle: false: rows ordered by their smallest example index (the packer opens them longest first)
    lengths = np.array([2, 6, 2, 5, 2, 2, 3, 2, 2])
    assert pack_rows(lengths, np.arange(9), 10).lists() == [[1, 6], [3, 0, 2], [4, 5, 7, 8]]
    assert epoch_rows(lengths, 0, 0, 10, packing=True, shuffle=False).lists() == [[3, 0, 2], [1, 6], [4, 5, 7, 8]]
    lengths = np.random.default_rng(3).integers(1, 129, 500)
    rows = epoch_rows(lengths, 0, 0, 128, packing=True, shuffle=False)
    firsts = [min(r) for r in rows.lists()]
    assert firsts == sorted(firsts) and firsts[0] == 0
    opened = pack_rows(lengths, np.arange(500), 128)
    assert sorted(rows.lists()) == sorted(opened.lists()) and rows.lists() != opened.lists()  # the same rows, reordered
    assert rows.examples.dtype == opened.examples.dtype == np.int32 and rows.offsets.dtype == np.int64
    assert epoch_rows(lengths, 1, 9, 128, packing=True, shuffle=False).lists() == rows.lists()  # every epoch alike
    plan = plan_steps(lengths, rows_per_step=8, row_len=128, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.rows.lists() == rows.lists()
    assert [min(r) for r in plan.step_rows(0)] == [0, 1, 2, 3, 5, 6, 7, 8]  # the first step starts with the files' first examples
    assert np.median(rows.lists()[0] + rows.lists()[1]) < 100 < 400 < np.median(rows.lists()[-1] + rows.lists()[-2])
    one = Rows(np.array([0, 2]), np.array([5, 1], np.int32))
    assert one.by_first_example() is one and Rows(np.zeros(1, np.int64), np.zeros(0, np.int32)).by_first_example().lists() == []
    # rows and plans hold arrays: compared by identity (eq=False), never element-wise
    assert (
        rows != epoch_rows(lengths, 0, 0, 128, packing=True, shuffle=False)
        and rows == rows
        and plan != plan_steps(lengths, rows_per_step=8, row_len=128, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    )


def test_padding_mode_is_one_example_per_row_in_the_shuffled_order():
    lengths = np.random.default_rng(0).integers(5, 60, 50)
    rows = epoch_rows(lengths, 2, 3, 128, packing=False, shuffle=True)
    assert rows.offsets.tolist() == list(range(51))
    assert rows.examples.tolist() == np.random.default_rng([3, 2]).permutation(50).tolist()
    assert epoch_rows(lengths, 2, 3, 128, packing=False, shuffle=False).examples.tolist() == list(range(50))


def same_plan(a, b):
    return all(
        np.array_equal(x, y) and x.dtype == y.dtype
        for x, y in [
            (a.rows.offsets, b.rows.offsets),
            (a.rows.examples, b.rows.examples),
            (a.step_offsets, b.step_offsets),
            (a.epoch_of_step, b.epoch_of_step),
        ]
    )


def test_plan_is_deterministic_and_depends_on_seed_and_epoch():
    ds = make_ds(np.random.default_rng(0).integers(5, 60, 200))
    kw = dict(rows_per_step=4, row_len=128, packing=True, shuffle=True, epochs=2, max_steps=None)
    a, b = plan_steps(ds, seed=3, **kw), plan_steps(ds.lengths(), seed=3, **kw)
    assert same_plan(a, b)
    assert a.step_offsets.dtype == np.int64 and a.epoch_of_step.dtype == np.int32 and a.rows.examples.dtype == np.int32
    assert not np.array_equal(plan_steps(ds, seed=4, **kw).rows.examples, a.rows.examples)
    e0, e1 = epoch_rows(ds.lengths(), 0, 3, 128, True, True), epoch_rows(ds.lengths(), 1, 3, 128, True, True)
    assert e0.lists() != e1.lists()
    assert sorted(e0.examples.tolist()) == sorted(e1.examples.tolist()) == list(range(200))
    assert set(a.epoch_of_step.tolist()) == {0, 1} and a.epoch(len(a) - 1) == 1 and isinstance(a.epoch(0), int)
    assert a.epochs(200) == 2.0
    # the steps cut each epoch's rows in order; an epoch's last step may be short
    per_epoch = len(e0)
    assert a.step_rows(0) == e0.lists(0, 4) and a.step_rows(per_epoch // 4 + 1) == e1.lists(0, 4)
    assert len(a) == 2 * -(-per_epoch // 4) and a.n_rows == len(e0) + len(e1)
    assert [len(a.step_rows(s)) for s in range(len(a))].count(per_epoch % 4 or 4) >= 2


def test_max_steps_gives_a_prefix_of_the_same_plan_across_epochs():
    ds = make_ds(np.random.default_rng(0).integers(5, 60, 200))
    kw = dict(rows_per_step=4, row_len=128, packing=True, shuffle=True, seed=3, epochs=3)
    full = plan_steps(ds, max_steps=None, **kw)
    per_epoch = len(full) // 3
    for k in (0, 5, per_epoch, per_epoch + 2):
        limited = plan_steps(ds, max_steps=k, **kw)
        assert len(limited) == k
        assert [limited.step_rows(s) for s in range(k)] == [full.step_rows(s) for s in range(k)]
        assert np.array_equal(limited.step_offsets, full.step_offsets[: k + 1])
        assert np.array_equal(limited.rows.offsets, full.rows.offsets[: limited.n_rows + 1])
        assert np.array_equal(limited.rows.examples, full.rows.examples[: limited.rows.offsets[-1]])
    more = plan_steps(ds, max_steps=4 * per_epoch + 1, **kw)  # max_steps past `epochs`: more epochs
    assert len(more) == 4 * per_epoch + 1 and more.epoch(len(more) - 1) == 4
    assert [more.step_rows(s) for s in range(len(full))] == [full.step_rows(s) for s in range(len(full))]
    with pytest.raises(ValueError, match="empty dataset"):
        plan_steps(np.zeros(0, np.int64), max_steps=None, **kw)


def test_ranks_get_disjoint_shards_covering_the_step():
    step_rows = [[i] for i in range(10)]  # 10 rows, world 4, mb 2, accum 2 → some ranks short
    shards = [rank_micro_batches(step_rows, r, 4, 2, 2) for r in range(4)]
    assert all(len(s) == 2 for s in shards)  # every rank runs the same number of micro-batches
    got = sorted(i for s in shards for mb in s for row in mb for i in row)
    assert got == list(range(10))
    assert shards[3] == [[[3], [7]], []]  # rank 3's second micro-batch is empty


def test_an_epochs_short_last_step_gives_empty_micro_batches():
    ds = make_ds([5] * 10)  # padding mode: 10 rows, 8 a step (2 ranks × 2 rows × 2 micro-batches)
    plan = plan_steps(ds, rows_per_step=8, row_len=16, packing=False, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.step_offsets.tolist() == [0, 8, 10]
    last = [rank_micro_batches(plan.step_rows(1), r, 2, 2, 2) for r in range(2)]
    assert last == [[[[8]], []], [[[9]], []]]


def test_collate_shifts_labels_and_restarts_positions():
    ds = TokenizedDataset(np.array([10, 11, 12, 20, 21], np.int32), np.array([0, 1, 1, 0, 1], bool), np.array([0, 3, 5]))
    b = collate(ds, [[0, 1]], row_len=8, pad_id=0)
    assert b["input_ids"].tolist() == [[10, 11, 12, 20, 21, 0, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert b["labels"].tolist() == [[11, 12, IGNORE_INDEX, 21, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert int(b["num_tokens"]) == 5 and int(b["num_trainable"]) == 3 and float(b["attn_tokens_sq"]) == 9 + 4
    empty = collate(ds, [], row_len=8, pad_id=0)
    assert int(empty["num_trainable"]) == 0 and empty["input_ids"].shape[0] == 1
    padded = collate(ds, [[1]], row_len=256, pad_id=0, fixed_len=False)
    assert padded["input_ids"].shape == (1, 64)
    # the epoch's short last step keeps the full micro-batch shape with all-pad rows
    full = collate(ds, [[0, 1]], row_len=8, pad_id=0, min_rows=3)
    assert full["input_ids"].shape == (3, 8) and full["input_ids"][1:].eq(0).all() and full["labels"][1:].eq(IGNORE_INDEX).all()
    assert full["cu_seq_lens"].tolist() == [0, 3, 8, 16, 24]  # each all-pad row is one document
    for k in ("num_tokens", "num_trainable", "attn_tokens_sq"):
        assert float(full[k]) == float(b[k])  # nothing counted for the padding rows


def test_collate_refuses_a_row_longer_than_the_micro_batch():
    ds = TokenizedDataset(np.array([10, 11, 12, 20, 21], np.int32), np.ones(5, bool), np.array([0, 3, 5]))
    assert collate(ds, [[0, 1]], row_len=5, pad_id=0)["input_ids"].tolist() == [[10, 11, 12, 20, 21]]  # exactly full
    with pytest.raises(ValueError, match=r"row 1 of the micro-batch \(examples \[0, 1\]\) holds 5 tokens, more than its length 4"):
        collate(ds, [[0], [0, 1]], row_len=4, pad_id=0)


def test_packing_efficiency_is_non_pad_over_row_tokens():
    ds = make_ds([6, 5, 4, 3, 2])  # 20 tokens; best fit into rows of 10 → [6,4] [5,3,2]: 2 full rows
    plan = plan_steps(ds, rows_per_step=2, row_len=10, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.packing_efficiency(ds, 10) == 1.0
    plan = plan_steps(ds, rows_per_step=2, row_len=16, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.step_rows(0) == [[0, 1, 2], [3, 4]]  # 6, 5, 4 into one row (1 free); 3 opens the next, 2 joins it
    assert plan.packing_efficiency(ds, 16) == 20 / (plan.n_rows * 16)
    assert plan.packing_efficiency(ds.lengths(), 16) == plan.packing_efficiency(ds, 16)
    assert index_dtype(2**31 - 1) is np.int32 and index_dtype(2**31) is np.int64


def test_epochs_counts_passes_over_the_data_also_when_max_steps_stops_early():
    ds = make_ds([6, 5, 4, 3, 2])  # 5 examples, 2 rows of 10 per epoch
    kw = dict(rows_per_step=1, row_len=10, packing=True, shuffle=False, seed=0, max_steps=None)
    assert plan_steps(ds, epochs=3, **kw).epochs(5) == 3.0
    short = plan_steps(ds, epochs=3, **{**kw, "max_steps": 1})  # one row: [6, 4] (2 of 5 examples)
    assert short.epochs(5) == 0.4


def test_collate_document_boundaries_for_varlen_attention():
    ds = TokenizedDataset(np.array([10, 11, 12, 20, 21, 30], np.int32), np.ones(6, bool), np.array([0, 3, 5, 6]))
    b = collate(ds, [[0, 1], [2]], row_len=8, pad_id=0)
    # row 0: docs [0,3) [3,8) (the pad tail joins the last document); row 1: [8,16)
    assert b["cu_seq_lens"].dtype == torch.int32
    assert b["cu_seq_lens"].tolist() == [0, 3, 8, 16]
    assert collate(ds, [], row_len=8, pad_id=0)["cu_seq_lens"].tolist() == [0, 8]


def test_packed_loss_equals_each_document_alone():
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.model import load_model_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(load_model_config(ModelConfig(name_or_path="qwen2-tiny"))).eval()
    lengths = [20, 33, 11, 7]
    ds = make_ds(lengths, seed=2)

    def token_losses(b):
        logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits
        return F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="none").view(
            b["labels"].shape
        )

    with torch.no_grad():
        packed = token_losses(collate(ds, [[0, 1, 2, 3]], 96, 0))
        off = 0
        for i, n in enumerate(lengths):
            alone = token_losses(collate(ds, [[i]], 96, 0, fixed_len=False))
            torch.testing.assert_close(packed[0, off : off + n], alone[0, :n], rtol=1e-5, atol=1e-5)
            off += n
        # and packing really changed something vs. no document boundaries (positions not restarted)
        b = collate(ds, [[0, 1, 2, 3]], 96, 0)
        b["position_ids"] = torch.arange(96).unsqueeze(0)
        assert not torch.allclose(token_losses(b)[0, 20:53], packed[0, 20:53], atol=1e-3)

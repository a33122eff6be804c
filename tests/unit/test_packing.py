"""Packing, the step plan, sharding, and packed-vs-alone loss equality."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rayft.data.packing import IGNORE_INDEX, collate, epoch_rows, pack_rows, plan_steps, rank_micro_batches
from rayft.data.tokenize import TokenizedDataset


def make_ds(lengths, seed=0, vocab=5000):
    rng = np.random.default_rng(seed)
    toks = [rng.integers(0, vocab, n).astype(np.int32) for n in lengths]
    train = [rng.random(n) > 0.4 for n in lengths]
    return TokenizedDataset(np.concatenate(toks), np.concatenate(train), np.cumsum([0] + list(lengths)))


def test_best_fit_packing_places_every_example_once_within_row_len():
    rng = np.random.default_rng(1)
    lengths = rng.integers(5, 60, 500)
    rows = pack_rows(lengths, rng.permutation(500), 128)
    flat = sorted(i for r in rows for i in r)
    assert flat == list(range(500))
    assert max(lengths[r].sum() for r in rows) <= 128
    efficiency = lengths.sum() / (128 * len(rows))
    assert efficiency > 0.98  # best fit wastes little (next fit gives 0.86 on the same input)
    with pytest.raises(ValueError, match="more than the row length"):
        pack_rows(np.array([10, 200]), np.array([0, 1]), 128)


def test_best_fit_rule_on_a_small_case():
    # rows fill in the visiting order with the tightest row that still fits
    assert pack_rows(np.array([6, 5, 4, 3, 2]), np.arange(5), 10) == [[0, 2], [1, 3, 4]]


def test_plan_is_deterministic_and_depends_on_seed_and_epoch():
    ds = make_ds(np.random.default_rng(0).integers(5, 60, 200))
    kw = dict(rows_per_step=4, row_len=128, packing=True, shuffle=True, epochs=2, max_steps=None)
    a, b = plan_steps(ds, seed=3, **kw), plan_steps(ds, seed=3, **kw)
    assert a.rows == b.rows
    assert plan_steps(ds, seed=4, **kw).rows != a.rows
    assert epoch_rows(ds, 0, 3, 128, True, True) != epoch_rows(ds, 1, 3, 128, True, True)
    assert set(a.epoch_of_step) == {0, 1}
    limited = plan_steps(ds, seed=3, **{**kw, "max_steps": 5})
    assert limited.rows == a.rows[:5]


def test_ranks_get_disjoint_shards_covering_the_step():
    step_rows = [[i] for i in range(10)]  # 10 rows, world 4, mb 2, accum 2 → some ranks short
    shards = [rank_micro_batches(step_rows, r, 4, 2, 2) for r in range(4)]
    assert all(len(s) == 2 for s in shards)  # every rank runs the same number of micro-batches
    got = sorted(i for s in shards for mb in s for row in mb for i in row)
    assert got == list(range(10))
    assert shards[3] == [[[3], [7]], []]  # rank 3's second micro-batch is empty


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


def test_packing_efficiency_is_non_pad_over_row_tokens():
    ds = make_ds([6, 5, 4, 3, 2])  # 20 tokens; best fit into rows of 10 → [6,4] [5,3,2]: 2 full rows
    plan = plan_steps(ds, rows_per_step=2, row_len=10, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.packing_efficiency(ds, 10) == 1.0
    plan = plan_steps(ds, rows_per_step=2, row_len=16, packing=True, shuffle=False, seed=0, epochs=1, max_steps=None)
    assert plan.packing_efficiency(ds, 16) == 20 / (len(plan.rows[0]) * 16)


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

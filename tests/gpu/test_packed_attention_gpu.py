"""GPU-only: packed rows with variable-length FlashAttention and the fused loss give each document
the loss it has alone (bf16 tolerance). Runs on the GPU host: ``python3 -m pytest tests/gpu``."""

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def pg():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29571", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
    torch.cuda.set_device(0)
    yield
    dist.destroy_process_group()


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter's or gradient's whole value: FSDP2's DTensor gathered, a plain tensor (one GPU
    without FSDP2: parallel.single_worker) as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _model(attn: str, ce: str):
    from rayft.config import ModelConfig, ParallelConfig
    from rayft.train.model import build_sharded_model

    cfg = ModelConfig(name_or_path="qwen2.5-0.5b", attn_implementation=attn, config_overrides={"num_hidden_layers": 4})
    return build_sharded_model(
        cfg,
        ParallelConfig(),
        device=torch.device("cuda:0"),
        activation_checkpointing=False,
        compile_layers=False,
        seed=3,
        cross_entropy=ce,
    )


def _dataset():
    from rayft.data.tokenize import TokenizedDataset

    rng = np.random.default_rng(0)
    lengths = [300, 700, 41, 1000]
    toks = [rng.integers(0, 150000, n).astype(np.int32) for n in lengths]
    train = [rng.random(n) > 0.3 for n in lengths]
    return TokenizedDataset(np.concatenate(toks), np.concatenate(train), np.cumsum([0] + lengths))


@pytest.mark.parametrize("attn,ce", [("varlen", "fused"), ("varlen", "torch"), ("sdpa", "torch")])
def test_each_document_in_a_packed_row_has_its_alone_loss(pg, attn, ce):
    from rayft.data.packing import collate
    from rayft.train.step import micro_batch_loss

    model, ds = _model(attn, ce), _dataset()
    dev = torch.device("cuda:0")
    with torch.no_grad():
        packed = {k: v.to(dev) for k, v in collate(ds, [[0, 1, 2, 3]], 2048, 0).items()}
        together = float(micro_batch_loss(model, packed))
        alone = [
            float(micro_batch_loss(model, {k: v.to(dev) for k, v in collate(ds, [[i]], 2048, 0, fixed_len=False).items()}))
            for i in range(4)
        ]
    n = int(packed["num_trainable"])
    # sums of bf16-computed token losses: compare the means to bf16 tolerance
    assert together / n == pytest.approx(sum(alone) / n, rel=2e-2)
    assert together != pytest.approx(0.0)


def test_varlen_and_fused_match_the_reference_path(pg):
    from rayft.data.packing import collate
    from rayft.train.step import micro_batch_loss

    ds, dev = _dataset(), torch.device("cuda:0")
    batch = {k: v.to(dev) for k, v in collate(ds, [[0, 1], [2, 3]], 2048, 0).items()}
    losses = {}
    for attn, ce in [("sdpa", "torch"), ("varlen", "fused")]:
        model = _model(attn, ce)
        loss = micro_batch_loss(model, batch)
        loss.backward()
        grad = _whole(model.module.model.layers[0].mlp.down_proj.weight.grad).float()
        losses[attn] = (float(loss), grad)
        del model
    (l_ref, g_ref), (l_new, g_new) = losses["sdpa"], losses["varlen"]
    assert l_new == pytest.approx(l_ref, rel=1e-2)
    cos = torch.nn.functional.cosine_similarity(g_ref.flatten(), g_new.flatten(), dim=0)
    assert float(cos) > 0.99


def test_the_fused_loss_over_the_trained_rows_equals_it_over_every_row(pg):
    """liger's fused loss given only the trained rows (collate's trained_positions) against the same
    loss given every row: the same sum and the same gradients, to bf16 rounding and the change of
    summation order (the rows' losses are independent; an ignored row adds nothing). A micro-batch with no trained target
    (an empty rank's all-pad row) gives 0 through the plain path liger cannot take (no rows), and
    zero gradients that still reach the LM head."""
    from rayft.data.packing import collate
    from rayft.train.step import micro_batch_loss

    ds, dev = _dataset(), torch.device("cuda:0")
    batch = {k: v.to(dev) for k, v in collate(ds, [[0, 1], [2, 3]], 2048, 0).items()}
    n_rows, n_trained = batch["labels"].numel(), int(batch["num_trainable"])
    assert batch["trained_positions"].numel() == n_trained < 0.75 * n_rows  # prompts (30%) and padding left out
    model = _model("varlen", "fused")
    params = dict(model.module.named_parameters())
    results = {}
    for name, b in (("all rows", {k: v for k, v in batch.items() if k != "trained_positions"}), ("trained rows", batch)):
        loss = micro_batch_loss(model, b)
        loss.backward()
        results[name] = (float(loss), {p: _whole(t.grad).float().clone() for p, t in params.items()})
        model.module.zero_grad(set_to_none=True)
    (l_all, g_all), (l_sub, g_sub) = results["all rows"], results["trained rows"]
    # bf16 logits: cuBLAS may round a row differently at another row count, so bf16 tolerances
    assert l_sub == pytest.approx(l_all, rel=1e-3) and l_all > 0
    for p in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"):
        rel = float((g_sub[p] - g_all[p]).norm() / g_all[p].norm())
        assert rel < 1e-2 and float(g_all[p].abs().max()) > 0, (p, rel)

    empty = {**batch, "labels": torch.full_like(batch["labels"], -100), "trained_positions": batch["trained_positions"][:0]}
    loss = micro_batch_loss(model, empty)
    loss.backward()
    head = model.module.get_output_embeddings().weight.grad
    assert float(loss) == 0.0 and head is not None and float(_whole(head).abs().max()) == 0.0

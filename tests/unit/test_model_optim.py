"""The FSDP2 model build (one-rank gloo group on CPU) and the LR schedule."""

import os

import pytest
import torch
import torch.distributed as dist

from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.train.model import build_sharded_model, load_full_state_dict, load_model_config, matmul_params, tied_embeddings
from rayft.train.optim import lr_at


@pytest.fixture(scope="module")
def one_rank_group():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sharded_model_matches_the_reference_with_and_without_activation_checkpointing(one_rank_group):
    from transformers import AutoModelForCausalLM

    cfg = ModelConfig(name_or_path="qwen2-tiny")
    ref = AutoModelForCausalLM.from_config(load_model_config(cfg))
    ref.load_state_dict(load_full_state_dict(cfg, load_model_config(cfg), seed=7))
    ids = torch.randint(0, 151000, (2, 24))
    ref_logits = ref(input_ids=ids).logits
    ref_logits.sum().backward()
    grads = {}
    for ac in (False, True):
        m = build_sharded_model(cfg, ParallelConfig(), device=torch.device("cpu"), activation_checkpointing=ac, compile_layers=False, seed=7)
        assert tied_embeddings(m)
        # 2 layers of hidden 64 plus the 151,936 × 64 embedding, which the LM head shares
        assert matmul_params(m) == sum(p.numel() for p in ref.parameters()) == 9_798_208
        logits = m(input_ids=ids).logits
        torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
        logits.sum().backward()
        grads[ac] = m.model.layers[0].mlp.up_proj.weight.grad.full_tensor()
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[False], ref.model.layers[0].mlp.up_proj.weight.grad, rtol=1e-5, atol=1e-6)


def test_lr_schedule_warmup_then_cosine_to_the_floor():
    tc = TrainConfig(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    lrs = [lr_at(s, 14, tc) for s in range(14)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert lrs[9] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + __import__("math").cos(__import__("math").pi * 5 / 9)))
    assert lr_at(0, 1, TrainConfig(lr=1e-3)) == pytest.approx(1e-3)  # a one-step run trains at the full rate

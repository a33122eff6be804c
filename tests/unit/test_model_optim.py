"""The FSDP2 model build (one-rank gloo group on CPU) and the LR schedule."""

import pytest
import torch

from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.train.model import build_sharded_model, load_full_state_dict, load_model_config, matmul_params, tied_embeddings
from rayft.train.optim import lr_at


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
        m = build_sharded_model(
            cfg, ParallelConfig(), device=torch.device("cpu"), activation_checkpointing=ac, compile_layers=False, seed=7
        ).module
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


def test_preset_init_device_picks_the_gpu_when_twice_the_largest_init_unit_fits(monkeypatch):
    from transformers import AutoModelForCausalLM

    from rayft.train import model as model_lib
    from rayft.train.preset_init import largest_unit_params

    assert model_lib.preset_init_device(torch.device("cpu"), 10) == torch.device("cpu")
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (16 * gib, 24 * gib))
    cuda = torch.device("cuda", 0)
    # Qwen2.5-7B: 7.6B parameters (30.5 GB fp32), but built one unit at a time; its largest, the
    # untied 152,064 × 3,584 embedding, is 545M parameters: 4.4 GB doubled <= 16 GiB free -> the GPU
    with torch.device("meta"):
        q7 = AutoModelForCausalLM.from_config(load_model_config(ModelConfig(name_or_path="qwen2.5-7b")))
    assert largest_unit_params(q7) == 152_064 * 3_584
    assert model_lib.preset_init_device(cuda, largest_unit_params(q7)) == cuda
    assert model_lib.preset_init_device(cuda, 2 * gib) == cuda  # 8 GiB fp32, exactly half of the free memory
    assert model_lib.preset_init_device(cuda, 2 * gib + 1) == torch.device("cpu")
    # model.init_device pins it
    assert model_lib.preset_init_device(cuda, 7_615_616_512, "gpu") == cuda
    assert model_lib.preset_init_device(cuda, 10, "cpu") == torch.device("cpu")
    assert model_lib.preset_init_device(torch.device("cpu"), 10, "gpu") == torch.device("cpu")


def test_float8_config_checks_seq_len_and_plain_tensor_refuses_a_dtensor(one_rank_group):
    from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor

    from rayft.config import ConfigError
    from rayft.config_load import load_config
    from rayft.train.checkpoint import plain_tensor

    with pytest.raises(ValueError, match="train.float8 needs data.seq_len to be a multiple of 16.*got 1000"):
        from rayft.config import RayftConfig

        RayftConfig.model_validate({"data": {"synthetic": {"rows": 4}, "seq_len": 1000}, "train": {"float8": True}})
    assert RayftConfig.model_validate({"data": {"synthetic": {"rows": 4}, "seq_len": 1024}, "train": {"float8": True}}).train.float8
    t = torch.ones(4)
    assert plain_tensor(t) is t
    dt = distribute_tensor(torch.ones(4), DeviceMesh("cpu", [0]), [Replicate()])
    with pytest.raises(TypeError, match="DTensor is one rank's shard"):
        plain_tensor(dt)
    del ConfigError, load_config


def test_float8_converts_only_decoder_linears_and_keeps_the_model_close(one_rank_group):
    """train.float8 on CPU (PyTorch's CPU float8 matmul): the decoder layers' 7 linear layers
    each become Float8Linear, the LM head does not; the weights are the same seeded init; logits
    stay close to bf16-free fp32 ones; a step trains; the full state dict holds plain fp32 tensors."""
    pytest.importorskip("torchao.float8", reason="train.float8 needs torchao (pip install 'rayft[fp8]')")
    from rayft.train.checkpoint import full_model_state_dict

    cfg = ModelConfig(name_or_path="qwen2-tiny")
    cpu = torch.device("cpu")
    ref = build_sharded_model(cfg, ParallelConfig(), device=cpu, activation_checkpointing=False, compile_layers=False, seed=7).module
    sharded = build_sharded_model(
        cfg, ParallelConfig(), device=cpu, activation_checkpointing=False, compile_layers=False, seed=7, float8=True
    )
    m = sharded.module
    kinds = {n: type(mod).__name__ for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert sum(k == "Float8Linear" for k in kinds.values()) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers
    assert kinds["lm_head"] == "Linear"
    # one rank: no float8 all-gather (nothing to gather; the weights cast inside each layer instead)
    assert sharded.float8_all_gather is False
    assert {mod.config.enable_fsdp_float8_all_gather for mod in m.modules() if type(mod).__name__ == "Float8Linear"} == {False}
    sd, want = full_model_state_dict(m), full_model_state_dict(ref)
    assert type(sd["model.layers.0.mlp.up_proj.weight"]) is torch.Tensor
    assert sd["model.layers.0.mlp.up_proj.weight"].dtype == torch.float32
    for k in want:
        assert torch.equal(sd[k], want[k]), k
    ids = torch.randint(0, 151000, (2, 32))
    got, exp = m(input_ids=ids).logits, ref(input_ids=ids).logits
    rel = ((got - exp).norm() / exp.norm()).item()
    assert 0 < rel < 0.05  # float8 rounding (e4m3: 3 mantissa bits) changes the logits, a little
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    before = m.model.layers[0].mlp.up_proj.weight.full_tensor().clone()
    m(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sharded.after_optimizer_step()
    assert not torch.equal(m.model.layers[0].mlp.up_proj.weight.full_tensor(), before)
    assert torch.isfinite(m(input_ids=ids).logits).all()

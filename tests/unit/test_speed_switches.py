"""Which attention and loss implementations run where, and the loss method's paths agreeing (CPU)."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rayft.config import ModelConfig
from rayft.train.attention import resolve_attn_implementation, unsupported_attention_features
from rayft.train.loss import TokenLoss, logit_transforms, resolve_cross_entropy
from rayft.train.model import load_model_config

CPU = torch.device("cpu")


def test_auto_falls_back_on_cpu_and_explicit_gpu_kernels_are_refused():
    conf = load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b"))
    assert resolve_attn_implementation("auto", CPU, conf) == "sdpa"
    assert resolve_attn_implementation("flex_attention", CPU, conf) == "flex_attention"
    assert resolve_cross_entropy("auto", CPU, conf) == "torch"
    with pytest.raises(ValueError, match="varlen needs a CUDA device"):
        resolve_attn_implementation("varlen", CPU, conf)
    with pytest.raises(ValueError, match="fused needs a CUDA device and the liger-kernel package"):
        resolve_cross_entropy("fused", CPU, conf)


def test_models_whose_features_the_fast_paths_lack_are_routed_or_refused():
    assert unsupported_attention_features(load_model_config(ModelConfig(name_or_path="qwen2.5-7b"))) == []
    mistral = AutoConfig.for_model("mistral", sliding_window=4096)
    assert unsupported_attention_features(mistral) == ["sliding_window=4096"]
    assert resolve_attn_implementation("auto", CPU, mistral) == "sdpa"
    with pytest.raises(ValueError, match=r"does not implement this model's sliding_window=4096"):
        resolve_attn_implementation("varlen", CPU, mistral)
    gemma2 = AutoConfig.for_model("gemma2")
    assert logit_transforms(gemma2) == ["final_logit_softcapping=30.0"]
    assert resolve_cross_entropy("auto", CPU, gemma2) == "hf"
    with pytest.raises(ValueError, match=r"fused does not apply this model's final_logit_softcapping=30.0"):
        resolve_cross_entropy("fused", CPU, gemma2)


def _tiny_model_and_batch(length: int):
    """A seeded qwen2-tiny model and a [2, length] batch whose last targets are masked (−100)."""
    conf = load_model_config(ModelConfig(name_or_path="qwen2-tiny"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    ids = torch.randint(0, 1000, (2, length))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100
    return model, ids, torch.arange(length).expand(2, -1), labels


def test_loss_method_torch_and_hf_paths_give_the_same_sum():
    model, ids, pos, labels = _tiny_model_and_batch(16)
    labels[1, :5] = -100
    ref = torch.nn.functional.cross_entropy(
        model(input_ids=ids, position_ids=pos).logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
    )
    got = {}
    for impl in ("torch", "hf"):
        got[impl] = float(TokenLoss.create(impl).compute(model, ids, pos, labels))
    assert got["torch"] == pytest.approx(float(ref), rel=1e-6)
    assert got["hf"] == pytest.approx(float(ref), rel=1e-6)


def test_the_head_over_the_trained_positions_only_gives_the_same_loss_and_gradients():
    """trained_positions (collate's flat indices of the targets ≠ −100): the LM head runs over those
    rows only; the sum and every parameter's gradient equal the all-positions loss's. A micro-batch
    with no trained target (an empty rank's all-pad row) gives 0 and zero gradients."""
    model, ids, pos, labels = _tiny_model_and_batch(16)
    labels[1, :9] = -100
    loss = TokenLoss.create("torch")

    def loss_and_grads(lab, trained):
        model.zero_grad(set_to_none=True)
        out = loss.compute(model, ids, pos, lab, trained)
        out.backward()
        return float(out), {n: p.grad.clone() for n, p in model.named_parameters()}

    trained = torch.nonzero(labels.flatten() != -100).flatten()
    assert trained.numel() == 15 + 6
    full, full_grads = loss_and_grads(labels, None)
    sub, sub_grads = loss_and_grads(labels, trained)
    assert sub == pytest.approx(full, rel=1e-6) and full > 0
    for name, g in full_grads.items():
        torch.testing.assert_close(sub_grads[name], g, rtol=1e-5, atol=1e-7, msg=name)
    none = torch.full_like(labels, -100)
    empty, empty_grads = loss_and_grads(none, torch.zeros(0, dtype=torch.long))
    assert empty == 0.0 and all(float(g.abs().max()) == 0.0 for g in empty_grads.values())
    assert model.get_output_embeddings().weight.grad is not None  # still in the graph: FSDP2's hooks fire
    # and the head's work is what shrank: its matmul's FLOPs scale with the rows it runs over
    from torch.utils.flop_counter import FlopCounterMode

    def head_flops(trained):
        with FlopCounterMode(display=False) as counter:
            loss.compute(model, ids, pos, labels, trained)
        return counter.get_total_flops()

    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    assert head_flops(None) - head_flops(trained) == 2 * hidden * vocab * (32 - 21)


def test_varlen_gets_boundaries_only_for_rows_holding_several_documents(monkeypatch):
    """One document per row (random full rows, or a long example with a padding tail): plain causal
    attention, no boundaries; two documents in a row: the boundaries go to the attention."""
    import numpy as np

    from rayft.data.packing import collate
    from rayft.data.tokenize import TokenizedDataset
    from rayft.train.attention import VARLEN
    from rayft.train.step import micro_batch_loss

    class Fake:
        def __init__(self, impl):
            self.attn_implementation = impl
            self.kwargs = None

        def token_loss_sum(self, ids, pos, labels, trained_positions, **kw):
            self.kwargs, self.trained = kw, trained_positions
            return torch.zeros(())

    lengths = [16, 10, 6]
    ds = TokenizedDataset(np.arange(sum(lengths), dtype=np.int32) + 1, np.ones(sum(lengths), bool), np.cumsum([0] + lengths))
    one_per_row = collate(ds, [[0], [1]], 16, 0)  # row 1: 10 tokens and a padding tail
    two_in_a_row = collate(ds, [[0], [1, 2]], 16, 0)
    assert one_per_row["cu_seq_lens"].tolist() == [0, 16, 32] and two_in_a_row["cu_seq_lens"].tolist() == [0, 16, 26, 32]
    marked = []
    monkeypatch.setattr(torch._dynamo, "maybe_mark_dynamic", lambda t, dim: marked.append((t, dim)))
    m = Fake(VARLEN)
    micro_batch_loss(m, one_per_row)
    assert m.kwargs == {} and marked == []
    assert m.trained.tolist() == [*range(15), *range(16, 25)]  # each document's last token predicts nothing
    micro_batch_loss(m, two_in_a_row)
    assert m.kwargs["cu_seq_lens"].tolist() == [0, 16, 26, 32]
    assert len(marked) == 1 and marked[0][0] is two_in_a_row["cu_seq_lens"] and marked[0][1] == 0  # the document count: dynamic
    sdpa = Fake("sdpa")
    micro_batch_loss(sdpa, two_in_a_row)
    assert sdpa.kwargs == {}  # sdpa reads the boundaries from position_ids


def _fake_liger(monkeypatch, with_chunk_param: bool):
    """A stand-in for liger_kernel.transformers.functional whose fused loss is the plain one and
    records the keyword arguments it got (liger itself needs CUDA)."""
    import sys
    import types

    seen = []

    def plain(hidden, weight, target, ignore_index=-100, reduction="mean", accum_dtype=None, **kw):
        seen.append(kw)
        return torch.nn.functional.cross_entropy(hidden @ weight.t(), target, ignore_index=ignore_index, reduction=reduction)

    if with_chunk_param:

        def fused(hidden, weight, target, ignore_index=-100, reduction="mean", accum_dtype=None, chunk_mem_const=1):
            return plain(hidden, weight, target, ignore_index, reduction, accum_dtype, chunk_mem_const=chunk_mem_const)
    else:

        def fused(hidden, weight, target, ignore_index=-100, reduction="mean", accum_dtype=None):
            return plain(hidden, weight, target, ignore_index, reduction, accum_dtype)

    mods = {n: types.ModuleType(n) for n in ("liger_kernel", "liger_kernel.transformers", "liger_kernel.transformers.functional")}
    mods["liger_kernel.transformers.functional"].liger_fused_linear_cross_entropy = fused
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return seen


@pytest.mark.parametrize("with_chunk_param", [True, False])
def test_fused_loss_gets_the_configured_chunking_where_liger_has_it(monkeypatch, with_chunk_param):
    seen = _fake_liger(monkeypatch, with_chunk_param)
    model, ids, pos, labels = _tiny_model_and_batch(8)
    ref = float(TokenLoss.create("torch").compute(model, ids, pos, labels))
    if with_chunk_param:
        loss = TokenLoss.create("fused", chunk_mem=8)
    else:
        with pytest.warns(UserWarning, match=r"fused_loss_chunk_mem=8: this liger-kernel has no chunk_mem_const"):
            loss = TokenLoss.create("fused", chunk_mem=8)
    got = float(loss.compute(model, ids, pos, labels))
    assert got == pytest.approx(ref, rel=1e-6)
    assert seen == [{"chunk_mem_const": 8} if with_chunk_param else {}]


def test_gpu_memory_limit_is_a_fraction_of_the_card_and_refused_above_it_or_off_gpu(monkeypatch):
    from pydantic import ValidationError

    from rayft.config import TrainConfig
    from rayft.train.device import cap_gpu_memory, memory_fraction

    h200 = 143771 * 2**20  # bytes, nvidia-smi's memory.total of an H200
    assert memory_fraction(22.5, h200) == pytest.approx(22.5 * 1024 / 143771)  # an L4's usable 22.5 GiB: 16.0% of an H200
    assert memory_fraction(140.0, h200) == pytest.approx(140 * 1024 / 143771)
    with pytest.raises(ValueError, match=r"gpu_memory_limit_gib=141 exceeds NVIDIA H200's 140.4 GiB"):
        memory_fraction(141, h200, "NVIDIA H200")
    with pytest.raises(ValueError, match=r"caps GPU memory; this worker runs on cpu"):
        cap_gpu_memory(CPU, 22.5)
    set_calls = []  # the CUDA path, with the card's properties stood in for (no GPU here)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": h200})())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: set_calls.append((f, d)))
    gpu0 = torch.device("cuda", 0)
    assert cap_gpu_memory(gpu0, 22.5) == pytest.approx(22.5 * 1024 / 143771)
    assert set_calls == [(pytest.approx(22.5 * 1024 / 143771), gpu0)]
    with pytest.raises(ValidationError, match=r"gpu_memory_limit_gib\n  Input should be greater than or equal to 1"):
        TrainConfig(gpu_memory_limit_gib=5e-324)  # would round to a fraction of 0
    with pytest.raises(ValidationError, match=r"gpu_memory_limit_gib\n  Value error, expected a number, not a boolean"):
        TrainConfig(gpu_memory_limit_gib=True)
    with pytest.raises(ValidationError, match=r"fused_loss_chunk_mem\n  Value error, expected a number, not a boolean"):
        TrainConfig(fused_loss_chunk_mem=True)
    assert TrainConfig(gpu_memory_limit_gib=24).gpu_memory_limit_gib == 24.0
    with pytest.raises(ValidationError, match=r"gpu_memory_limit_gib\n  Input should be a finite number"):
        TrainConfig(gpu_memory_limit_gib=float("inf"))


def test_a_gpu_memory_limit_with_cpu_workers_is_a_config_error():
    from pathlib import Path

    from rayft.config import ConfigError
    from rayft.config_load import load_config

    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"  # train.use_gpu: false
    with pytest.raises(
        ConfigError, match=r"(?s)quickstart.yaml.*train.gpu_memory_limit_gib=22.5 caps GPU workers' memory, but train.use_gpu is false"
    ):
        load_config(quickstart, ["train.gpu_memory_limit_gib=22.5"])
    assert load_config(quickstart, ["train.gpu_memory_limit_gib=22.5", "train.use_gpu=auto"]).train.gpu_memory_limit_gib == 22.5


def test_liger_kernels_with_cpu_workers_is_a_config_error():
    from pathlib import Path

    from rayft.config import ConfigError
    from rayft.config_load import load_config

    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"  # train.use_gpu: false
    with pytest.raises(
        ConfigError, match=r"(?s)quickstart.yaml.*train.liger_kernels are CUDA \(Triton\) kernels, but train.use_gpu is false"
    ):
        load_config(quickstart, ["train.liger_kernels=true"])
    assert load_config(quickstart, ["train.liger_kernels=true", "train.use_gpu=auto"]).train.liger_kernels is True


def test_varlen_forward_builds_no_mask_and_skips_the_packed_check(monkeypatch):
    """The varlen implementation has no transformers mask function: a forward with position ids
    (the training forward) builds no mask and never runs transformers' packed-document check, whose
    ``all()`` waits for the device; on rows of one document it computes what ``sdpa`` computes."""
    from transformers import AutoConfig, AutoModelForCausalLM, masking_utils

    from rayft.train.attention import VARLEN, register_varlen
    from rayft.train.presets import PRESETS

    register_varlen()
    preset = dict(PRESETS["qwen2-tiny"])
    model_type = preset.pop("model_type")
    conf = AutoConfig.for_model(model_type, **preset)  # one config per model: from_config sets its attention on it
    torch.manual_seed(0)
    sdpa = AutoModelForCausalLM.from_config(conf, dtype=torch.float32, attn_implementation="sdpa")
    varlen = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **preset), dtype=torch.float32, attn_implementation=VARLEN)
    varlen.load_state_dict(sdpa.state_dict())
    checks = []
    real_check = masking_utils.find_packed_sequence_indices
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda pos: checks.append(pos) or real_check(pos))
    ids = torch.randint(0, conf.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(16).repeat(2, 1)
    with torch.no_grad():
        got = varlen(input_ids=ids, position_ids=pos, use_cache=False).logits  # as in training: no cache
        assert checks == []
        want = sdpa(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert len(checks) == 1  # the check is live: sdpa's forward ran it
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_varlen_refuses_queries_shorter_than_the_keys():
    """A decoding step with a KV cache (1 query, 5 keys): causal SDPA would align its mask to the
    first key, so the varlen implementation refuses it instead of attending to the wrong keys."""
    from rayft.train.attention import varlen_attention_forward

    q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="1 queries against 5 keys"):
        varlen_attention_forward(torch.nn.Module(), q, kv, kv, None)
    out, _ = varlen_attention_forward(torch.nn.Module(), kv, kv, kv, None)  # whole rows: plain causal attention
    assert out.shape == (1, 5, 2, 8)

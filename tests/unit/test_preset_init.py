"""A preset's seeded init, one unit at a time (rayft.train.preset_init): the same weights on 1 and 3
gloo ranks (one OS process each; 3 does not divide the rows evenly), with and without CPU offload,
equal to the unsharded reference, and distributed as transformers initialises the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

RANK = """
import json, sys
import torch, torch.distributed as dist
from rayft.config import ModelConfig, ParallelConfig
from rayft.train.model import build_sharded_model

rank, world, store, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.load(open(sys.argv[4]))
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
for preset in spec["presets"]:
    m = build_sharded_model(ModelConfig(name_or_path=preset), ParallelConfig(cpu_offload=spec["offload"]),
                            device=torch.device("cpu"), activation_checkpointing=False, compile_layers=False, seed=3).module
    torch.save({k: v.to_local().clone() for k, v in m.state_dict().items()}, f"{spec['out']}/{preset}-{world}-{rank}.pt")
dist.destroy_process_group()
"""

PRESETS = ["qwen2-tiny", "mistral-tiny"]  # tied embeddings and q/k/v biases; untied, no biases


def shards(tmp_path: Path, worlds: dict[int, bool]) -> dict[int, dict[str, list[dict[str, torch.Tensor]]]]:
    """Every rank's local shards of each preset, built on each ``world`` of gloo ranks (with CPU
    offload where ``worlds[world]``), all the groups' ranks at once: {world: {preset: [rank 0's, ...]}}."""
    (tmp_path / "rank.py").write_text(RANK)
    argvs = []
    for world, offload in worlds.items():
        (tmp_path / f"out-{world}").mkdir()
        spec = tmp_path / f"spec-{world}.json"
        spec.write_text(json.dumps({"presets": PRESETS, "out": str(tmp_path / f"out-{world}"), "offload": offload}))
        argvs += [[str(r), str(world), str(tmp_path / f"store-{world}"), str(spec)] for r in range(world)]
    ranks = run_ranks(tmp_path / "rank.py", argvs, tmp_path / "ranks")
    assert [rc for rc, _ in ranks] == [0] * len(argvs), "\n".join(o[-3000:] for _, o in ranks)
    return {w: {p: [torch.load(tmp_path / f"out-{w}" / f"{p}-{w}-{r}.pt") for r in range(w)] for p in PRESETS} for w in worlds}


def test_preset_init_is_the_same_at_any_world_size_and_equals_the_reference(tmp_path):
    from rayft.config import ModelConfig
    from rayft.train.model import load_full_model, load_model_config

    got = shards(tmp_path, {1: False, 3: True})
    one, three = got[1], got[3]
    for preset in PRESETS:
        cfg = ModelConfig(name_or_path=preset)
        conf = load_model_config(cfg)
        ref = load_full_model(cfg, conf, seed=3)
        want = ref.state_dict()
        assert set(one[preset][0]) == set(want)
        for key, full in want.items():
            assert torch.equal(one[preset][0][key], full), (preset, key)
            assert torch.equal(torch.cat([r[key] for r in three[preset]]), full), (preset, key)
        # transformers' init: linear and embedding weights ~ N(0, initializer_range), norms 1, biases 0
        std = conf.initializer_range
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight"):
                assert torch.equal(p, torch.ones_like(p)), name
            elif name.endswith(".bias"):
                assert torch.equal(p, torch.zeros_like(p)), name
            else:
                assert abs(p.mean().item()) < 0.1 * std and p.std().item() == pytest.approx(std, rel=0.1), name
        # each unit draws its own numbers: the layers differ, and the tied LM head is the embedding
        q = [layer.self_attn.q_proj.weight for layer in ref.model.layers]
        assert not torch.equal(q[0], q[1])
        assert (ref.lm_head.weight is ref.model.embed_tokens.weight) == conf.tie_word_embeddings
    # another seed, other weights
    other = load_full_model(ModelConfig(name_or_path="qwen2-tiny"), load_model_config(ModelConfig(name_or_path="qwen2-tiny")), seed=4)
    assert not torch.equal(other.model.layers[0].mlp.up_proj.weight, one["qwen2-tiny"][0]["model.layers.0.mlp.up_proj.weight"])


def test_init_units_cover_every_tensor_once():
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.model import load_model_config
    from rayft.train.preset_init import init_units, unit_tensor_names

    for preset, tied in (("qwen2-tiny", True), ("mistral-tiny", False)):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(load_model_config(ModelConfig(name_or_path=preset)))
        units = init_units(model)
        names = [n for prefix, unit in units for n in unit_tensor_names(model, prefix, unit)]
        assert len(names) == len(set(names))
        # every saved tensor once, but a tied LM head (the embedding's second name)
        assert set(model.state_dict()) - set(names) == ({"lm_head.weight"} if tied else set())
        assert [p for p, _ in units] == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm", "lm_head"]
        assert unit_tensor_names(model, *units[-1]) == ([] if tied else ["lm_head.weight"])


def test_a_module_holding_only_a_persistent_buffer_is_a_unit():
    """A module outside the layers that holds only a persistent buffer is an init unit (its buffer
    is filled like a parameter); a non-persistent buffer is not among the unit's tensors."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from rayft.train.preset_init import init_units, unit_tensor_names

    class Layer(GradientCheckpointingLayer):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

    class Counts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("big", torch.full((3,), 2**40 + 1, dtype=torch.int64))
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            self.counts = Counts()

    model = Model()
    assert [p for p, _ in init_units(model)] == ["layers.0", "layers.1", "counts"]
    assert unit_tensor_names(model, "counts", model.counts) == ["counts.big"]


def test_the_init_leaves_torchs_generator_as_it_was():
    from rayft.config import ModelConfig
    from rayft.train.model import load_full_model, load_model_config

    cfg = ModelConfig(name_or_path="qwen2-tiny")
    torch.manual_seed(123)
    want = torch.rand(4)
    torch.manual_seed(123)
    load_full_model(cfg, load_model_config(cfg), seed=3)
    assert torch.equal(torch.rand(4), want)

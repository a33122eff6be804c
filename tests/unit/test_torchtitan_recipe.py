"""The torchtitan recipes of `rayft bench train`, the parts that run without torchtitan or a GPU:
the preset ↔ flavour table against rayft's own presets, the flags torchtitan gets, the rows it is
fed, and the refusals before anything runs (torchtitan itself runs on the GPU host only)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rayft.benchmarks import torchtitan_recipe as tt
from rayft.benchmarks import train as bt
from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br
from rayft.benchmarks.recipes import padded_batch
from rayft.config import ModelConfig
from rayft.config_load import load_config
from rayft.data.tokenize import assemble
from rayft.train.model import load_model_config


@pytest.mark.parametrize("preset", sorted(tt.TORCHTITAN_MODELS))
def test_every_flavour_has_the_shape_of_rayfts_preset(preset):
    conf = load_model_config(ModelConfig(name_or_path=preset), "sdpa")
    tt.check_preset_shape(preset, conf)  # raises on the first field that differs
    assert conf.hidden_size == tt.TORCHTITAN_MODELS[preset][2]["hidden_size"]


def test_a_shape_mismatch_and_a_model_without_flavour_are_named():
    small = load_model_config(ModelConfig(name_or_path="qwen3-0.6b"), "sdpa")
    with pytest.raises(tt.TorchtitanRecipeError, match=r"preset qwen3-1.7b: hidden_size is 1024, torchtitan's flavour has 2048"):
        tt.check_preset_shape("qwen3-1.7b", small)
    with pytest.raises(tt.TorchtitanRecipeError, match=r"model.name_or_path='qwen2.5-1.5b'.*qwen3-0.6b, qwen3-1.7b"):
        tt.torchtitan_model("qwen2.5-1.5b")
    # torchtitan's own args (its field names), as its Trainer builds them
    args = SimpleNamespace(dim=2048, n_layers=28, n_heads=16, n_kv_heads=8, vocab_size=151936, head_dim=128, hidden_dim=6144)
    tt.check_flavour_args("qwen3-1.7b", args)
    args.hidden_dim = 3072
    with pytest.raises(tt.TorchtitanRecipeError, match=r"torchtitan qwen3 1.7B: hidden_dim is 3072, preset qwen3-1.7b has 6144"):
        tt.check_flavour_args("qwen3-1.7b", args)


def spec(**kw):
    base = dict(preset="qwen3-1.7b", seq_len=2048, micro_batch_size=8, steps=30, lr=1e-5, seed=7, num_workers=1,
                activation_checkpointing=False, float8=False, compile=True, out_dir="/runs/tt")  # fmt: skip
    return base | kw


def flags(args: list[str]) -> dict[str, str | None]:
    """--key value / --switch → {key: value or None}."""
    out, i = {}, 0
    while i < len(args):
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        out[args[i]] = args[i + 1] if has_value else None
        i += 2 if has_value else 1
    return out


def test_torchtitan_flags_for_bf16_and_float8():
    bf16 = flags(tt.torchtitan_args(spec()))
    assert bf16["--model.name"] == tt.SPEC_NAME and bf16["--model.flavor"] == "1.7B"
    assert (bf16["--training.seq_len"], bf16["--training.local_batch_size"], bf16["--training.steps"]) == ("2048", "8", "30")
    assert bf16["--activation_checkpoint.mode"] == "none" and "--compile.enable" in bf16
    assert bf16["--debug.seed"] == "7" and bf16["--optimizer.lr"] == "1e-05" and bf16["--job.dump_folder"] == "/runs/tt/torchtitan"
    assert "--model.converters" not in bf16
    fp8 = flags(tt.torchtitan_args(spec(float8=True, activation_checkpointing=True, compile=False)))
    assert fp8["--model.converters"] == "quantize.linear.float8" and fp8["--quantize.linear.float8.filter_fqns"] == "output"
    assert fp8["--activation_checkpoint.mode"] == "full" and "--compile.enable" not in fp8


@pytest.mark.parametrize("first,last", [(10, 11), (2, 2), (3, 7)])
def test_profiling_flags_record_the_same_steps_as_rayfts_profile_steps(first, last):
    """torchtitan builds torch.profiler.schedule(wait=freq - (warmup + active), warmup, active) and
    steps it once after each training step: the steps that schedule records are first..last."""
    import torch.profiler as tp

    f = flags(tt.torchtitan_args(spec(profile_steps=[first, last], steps=last)))
    assert "--profiling.enable_profiling" in f and f["--profiling.save_traces_folder"] == "profile_traces"
    freq, warmup, active = (int(f[k]) for k in ("--profiling.profile_freq", "--profiling.profiler_warmup", "--profiling.profiler_active"))
    sched = tp.schedule(wait=freq - (warmup + active), warmup=warmup, active=active)
    longest = first + last - 1 - warmup  # the longest run it profiles once
    recorded = [k + 1 for k in range(longest) if sched(k) in (tp.ProfilerAction.RECORD, tp.ProfilerAction.RECORD_AND_SAVE)]
    assert recorded == list(range(first, last + 1)) and sched(last - 1) == tp.ProfilerAction.RECORD_AND_SAVE
    # one step more and the next cycle traces (or warms up) again: refused, as is a window past the run
    assert sched(longest) != tp.ProfilerAction.NONE
    with pytest.raises(tt.TorchtitanRecipeError, match=rf"traces steps {first}-{last} once only in a run of {last} to {longest} steps"):
        tt.torchtitan_args(spec(profile_steps=[first, last], steps=longest + 1))
    with pytest.raises(tt.TorchtitanRecipeError):
        tt.profiling_args(first, last, steps=last - 1)
    # FIRST 1: no warm-up step, and the recording the last step's schedule starts is saved over the window's
    with pytest.raises(tt.TorchtitanRecipeError, match=r"needs FIRST >= 2"):
        tt.profiling_args(1, last, steps=last)
    assert "--profiling.enable_profiling" not in flags(tt.torchtitan_args(spec(profile_steps=None)))


def test_rows_are_shifted_for_torchtitans_loss_with_padding_ignored():
    ds = assemble([(np.array([5, 6, 7, 8], np.int32), np.ones(4, bool)), (np.array([9, 10], np.int32), np.ones(2, bool))])
    b = padded_batch(ds, [0, 1], 4, pad_id=0)
    inputs, labels = tt.shifted_rows(b)
    assert inputs.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert labels.tolist() == [[6, 7, 8, -100], [10, -100, -100, -100]]  # 3 + 1 predicted tokens: HF's shift inside the model


def job(tmp_path, model="qwen3-1.7b", use_gpu="auto"):
    f = tmp_path / "job.yaml"
    f.write_text(
        f"model: {{name_or_path: {model}}}\ndata: {{train_files: [a.json], seq_len: 16}}\n"
        f"train: {{num_workers: 1, use_gpu: {use_gpu}, micro_batch_size: 2}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    return f


def test_the_bench_refuses_torchtitan_on_cpu_and_for_a_model_without_flavour(tmp_path):
    with pytest.raises(br.BenchTrainError, match=r"model.name_or_path='qwen2-tiny': the torchtitan recipes run the presets"):
        bt.run_bench(
            job(tmp_path, "qwen2-tiny", "false"),
            recipes=["torchtitan"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            work_dir=tmp_path / "wd",
        )
    with pytest.raises(br.BenchTrainError, match=r"the torchtitan recipes run on CUDA GPUs only"):
        bt.run_bench(
            job(tmp_path, use_gpu="false"),
            recipes=["torchtitan-fp8"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            work_dir=tmp_path / "wd",
        )
    assert not (tmp_path / "wd").exists()  # refused before anything was written


def test_the_recipe_command_is_torchrun_with_a_spec_of_the_preset(tmp_path):
    cfg_file = job(tmp_path)
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], ["torchtitan-fp8"], ["random"], 4, 1, tmp_path / "wd", None)
    shared = {
        "model_dir": "m",
        "tokenizer_dir": "t",
        "data": {"random": {"file": "x.npz"}},
        "pad_id": 0,
        "decoder_layer_cls": "Qwen3DecoderLayer",
    }
    cmd = brc.recipe_command("torchtitan-fp8", "random", plan, cfg, 2, True, shared, tmp_path / "run")
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[5:7] == ["-m", "rayft.benchmarks.torchtitan_recipe"]
    got = json.loads(Path(cmd[-1]).read_text())
    assert (got["preset"], got["float8"], got["compile"], got["micro_batch_size"], got["seq_len"]) == ("qwen3-1.7b", True, True, 2, 16)
    settings = brc.recipe_settings("torchtitan-fp8", tmp_path / "run", cmd, cfg_file)  # before the run: what is planned
    assert settings["float8"] is True and settings["fsdp"] == 2 and settings["torchtitan"] == tt.TORCHTITAN_VERSION

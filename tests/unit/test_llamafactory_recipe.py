"""The llamafactory recipe of `rayft bench train`, the parts that run without LLaMA-Factory: the
arguments it is given, the packed rows it is fed, the token counts of a batch in its layouts, the
records and settings its callback writes, and the bench's wiring (LLaMA-Factory itself runs in
tests/integration/test_llamafactory_recipe.py where it is installed, and on the GPU host)."""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rayft.benchmarks import choices
from rayft.benchmarks import llamafactory_recipe as lf
from rayft.benchmarks import train as bt
from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br
from rayft.config_load import load_config


def spec(**kw):
    base = dict(seq_len=2048, micro_batch_size=16, steps=30, lr=1e-5, seed=7, num_workers=1, use_gpu=True,
                activation_checkpointing=False, decoder_layer_cls="Qwen2DecoderLayer", out_dir="/runs/lf")  # fmt: skip
    return base | kw


def test_arguments_for_one_gpu_on_ray():
    a = lf.llamafactory_args(spec(), "/runs/lf/llamafactory/model", "/runs/lf/llamafactory/rows", "sdpa", True)
    assert (a["stage"], a["finetuning_type"], a["do_train"]) == ("sft", "full", True)
    assert a["model_name_or_path"] == "/runs/lf/llamafactory/model" and a["tokenized_path"] == "/runs/lf/llamafactory/rows"
    assert a["dataset"] == lf.DATASET_NAME and a["template"] == "empty"
    assert (a["cutoff_len"], a["packing"], a["neat_packing"]) == (2048, True, True)
    assert (a["per_device_train_batch_size"], a["gradient_accumulation_steps"], a["max_steps"]) == (16, 1, 30)
    assert (a["learning_rate"], a["seed"], a["bf16"], a["use_cpu"]) == (1e-5, 7, True, False)
    assert (a["flash_attn"], a["enable_liger_kernel"], a["disable_gradient_checkpointing"]) == ("sdpa", True, True)
    assert (a["save_strategy"], a["eval_strategy"], a["report_to"], a["logging_steps"]) == ("no", "no", "none", 1)
    assert a["output_dir"] == "/runs/lf/llamafactory/output"
    assert a["ray_num_workers"] == 1 and "use_ray" not in a  # LLaMA-Factory reads USE_RAY from the environment
    assert "fsdp" not in a


def test_arguments_for_two_gpus_and_for_cpu():
    two = lf.llamafactory_args(spec(num_workers=2, activation_checkpointing=True), "m", "d", "fa2", False)
    assert two["ray_num_workers"] == 2 and two["fsdp"] == "full_shard auto_wrap"
    assert two["fsdp_config"] == {"transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}
    assert two["disable_gradient_checkpointing"] is False and two["flash_attn"] == "fa2"
    cpu = lf.llamafactory_args(spec(use_gpu=False, micro_batch_size=2), "m", "d", "sdpa", False)
    assert (cpu["bf16"], cpu["use_cpu"], cpu["per_device_train_batch_size"]) == (False, True, 2)
    assert "ray_num_workers" not in cpu


def test_attention_choice_and_the_cpu_world():
    assert lf.attention_choice(16, False) == ("sdpa", "flash-attn is not installed")
    attn, why = lf.attention_choice(16, True)
    assert attn == "sdpa" and "1 row per batch; the micro-batch is 16" in why
    assert lf.attention_choice(1, True)[0] == "fa2"
    lf.check_world(True, 8)
    lf.check_world(False, 1)
    with pytest.raises(lf.LlamaFactoryRecipeError, match=r"on CPU with one worker only \(train.num_workers is 2\)"):
        lf.check_world(False, 2)


def in_order(lengths, capacity):
    """A stand-in for LLaMA-Factory's greedy_knapsack: first fit, in the given order."""
    rows: list[list[int]] = []
    for n in lengths:
        for r in rows:
            if sum(r) + n <= capacity:
                r.append(n)
                break
        else:
            rows.append([n])
    return rows


def test_packed_rows_have_llamafactorys_neat_packing_layout():
    examples = [
        ([11, 12, 13], [False, True, True]),
        ([21, 22, 23, 24, 25, 26, 27, 28, 29], [True] * 9),  # 9 tokens: cut to the row's capacity (8 - 1)
        ([31, 32], [False, True]),
        ([41, 42], [True, False]),
    ]
    rows = lf.packed_rows(examples, seq_len=8, pad_id=0, knapsack=in_order)
    assert lf.pack_capacity(8) == 7
    assert rows["input_ids"] == [
        [11, 12, 13, 31, 32, 41, 42, 0],
        [21, 22, 23, 24, 25, 26, 27, 0],
    ]
    assert rows["attention_mask"] == [[1, 1, 1, 2, 2, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1, 0]]
    assert rows["position_ids"] == [[0, 1, 2, 0, 1, 0, 1, 0], [0, 1, 2, 3, 4, 5, 6, 0]]
    assert rows["labels"] == [
        [-100, 12, 13, -100, 32, 41, -100, -100],
        [21, 22, 23, 24, 25, 26, 27, -100],
    ]


def block_mask(index_mask: list[list[int]]) -> torch.Tensor:
    """LLaMA-Factory's 4-D additive mask of an index mask (0 where attended, dtype min elsewhere)."""
    m = torch.tensor(index_mask)
    same = (m[:, None, :, None] == m[:, None, None, :]) & (m[:, None, None, :] != 0)
    causal = torch.tril(torch.ones(m.shape[1], m.shape[1], dtype=torch.bool))
    return torch.where(same & causal, 0.0, torch.finfo(torch.float32).min)


def test_batch_token_counts_in_each_layout():
    index = [[1, 1, 1, 2, 2, 3, 3, 0], [1, 1, 1, 1, 1, 1, 1, 0]]
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 0], [0, 1, 2, 3, 4, 5, 6, 0]])
    want = (3 + 2 + 2 + 7, float(9 + 4 + 4 + 49))
    assert lf.packed_batch_stats(pos, block_mask(index)) == want  # sdpa: the 4-D mask
    assert lf.packed_batch_stats(pos, torch.tensor(index)) == want  # the 2-D index mask
    unpadded = torch.tensor([[0, 1, 2, 0, 1, 0, 1]])  # FlashAttention-2: padding removed, no mask
    assert lf.packed_batch_stats(unpadded, None) == (7, 17.0)


FORWARD_S = 0.02


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 2)
        self.config = SimpleNamespace(_attn_implementation="sdpa")
        self.is_gradient_checkpointing = False

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None):
        time.sleep(FORWARD_S)  # a step's time is at least its forward's
        return input_ids


def test_the_callback_pickles_and_writes_one_record_per_step(tmp_path):
    cb = lf.StepRecords(str(tmp_path), {"launcher": "planned", "attention": "?"}, use_gpu=False)
    cb = pickle.loads(pickle.dumps(cb))  # as LLaMA-Factory's Ray launcher sends it to its workers
    args = SimpleNamespace(process_index=0, world_size=1, bf16=False, optim="adamw_torch_fused", fsdp=[])
    model = TinyModel()
    cb.on_train_begin(args, SimpleNamespace(global_step=0), None, model=model)
    index = [[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]]
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 0]])
    for step, logs in ((1, {"loss": 2.5}), (2, {"grad_norm": 1.0})):  # step 2: no loss logged
        cb.on_step_begin(args, None, None)
        model(input_ids=torch.zeros(2, 6, dtype=torch.long), attention_mask=block_mask(index), position_ids=pos)
        cb.on_step_end(args, SimpleNamespace(global_step=step), None)
        cb.on_log(args, None, None, logs=logs)
    cb.on_train_end(args, None, None)
    recs = [json.loads(x) for x in (tmp_path / "steps.rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert all((r["tokens"], r["attn_tokens_sq"], r["peak_mem_gib"]) == (9, 29.0, None) for r in recs)
    assert recs[0]["loss"] == 2.5 and recs[1]["loss"] is None
    assert all(FORWARD_S <= r["step_time_s"] < 5 for r in recs)  # from the step's start to its end, the forward inside
    used = json.loads((tmp_path / "settings.json").read_text())
    assert used["launcher"] == "planned" and used["attention"] == "sdpa" and used["liger"] is False
    assert (used["param_dtype"], used["world_size"], used["optim"], used["fsdp"]) == ("float32", 1, "adamw_torch_fused", None)
    assert used["cross_entropy"] == "transformers (full logits)"
    assert set(lf.versions()) >= {"llamafactory", "transformers", "trl", "datasets"}


def test_a_step_without_exactly_one_counted_forward_is_an_error(tmp_path):
    """The counts are matched to steps in order: a step with no forward counted (or two) would shift
    every later step's tokens, so it stops the run instead of recording 0 tokens."""
    cb = lf.StepRecords(str(tmp_path), {}, use_gpu=False)
    args = SimpleNamespace(process_index=0, world_size=1, bf16=False, optim="adamw_torch_fused", fsdp=[])
    model = TinyModel()
    cb.on_train_begin(args, SimpleNamespace(global_step=0), None, model=model)
    cb.on_step_begin(args, None, None)
    with pytest.raises(lf.LlamaFactoryRecipeError, match="step 1: 0 forward calls counted, expected 1"):
        cb.on_step_end(args, SimpleNamespace(global_step=1), None)
    pos = torch.tensor([[0, 1, 2, 0]])
    for _ in range(2):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long), position_ids=pos)
    with pytest.raises(lf.LlamaFactoryRecipeError, match="step 2: 2 forward calls counted"):
        cb.on_step_end(args, SimpleNamespace(global_step=2), None)


def job(tmp_path, workers=1):
    f = tmp_path / "job.yaml"
    f.write_text(
        "model: {name_or_path: qwen2-tiny}\ndata: {train_files: [a.json], seq_len: 16}\n"
        f"train: {{num_workers: {workers}, use_gpu: false, micro_batch_size: 2}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    return f


def test_the_bench_lists_it_by_name_and_refuses_two_cpu_workers(tmp_path):
    assert "llamafactory" in choices.RECIPES and "llamafactory" not in choices.DEFAULT_RECIPES
    with pytest.raises(br.BenchTrainError, match=r"llamafactory recipe runs on CPU with one worker only"):
        bt.run_bench(job(tmp_path, 2), recipes=["llamafactory"], workloads=["random"], steps=3, warmup_steps=1, work_dir=tmp_path / "wd")
    assert not (tmp_path / "wd").exists()  # refused before anything was written


def test_the_recipe_command_and_its_planned_settings(tmp_path):
    cfg_file = job(tmp_path)
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], ["llamafactory"], ["random"], 4, 1, tmp_path / "wd", None)
    shared = {
        "model_dir": "m",
        "tokenizer_dir": "t",
        "data": {"random": {"file": "x.npz"}},
        "pad_id": 0,
        "decoder_layer_cls": "Qwen2DecoderLayer",
    }
    cmd = brc.recipe_command("llamafactory", "random", plan, cfg, 1, False, shared, tmp_path / "run")
    assert cmd == [sys.executable, "-m", "rayft.benchmarks.llamafactory_recipe", str(tmp_path / "run" / "spec.json")]
    got = json.loads(Path(cmd[-1]).read_text())
    assert (got["recipe"], got["micro_batch_size"], got["seq_len"], got["steps"], got["use_gpu"]) == ("llamafactory", 2, 16, 4, False)
    settings = brc.recipe_settings("llamafactory", tmp_path / "run", cmd, cfg_file)  # before the run: what is planned
    assert settings["launcher"] == "LLaMA-Factory in this process (CPU: no Ray)" and settings["liger"] is False
    assert settings["llamafactory"] == lf.LLAMAFACTORY_VERSION and settings["fsdp"] is None

"""The validation loss (rayft.train.evaluate) on one CPU rank (gloo): when it runs, and over a held-out
fraction of the training records, the global mean equals a single-process forward of the same weights.
The runs on Ray (tests/integration/test_train_ray.py) evaluate after every step, and with a held-out
fraction and the default schedule after the last step only."""

import json

import pytest
import torch
from reference_loss import single_process_loss
from rich.console import Console

from rayft.config_load import load_config
from rayft.train.driver import load_run_data
from rayft.train.evaluate import eval_is_due, eval_rows, evaluate

RECORDS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
    for a, b in [(1, 2), (30, 4), (7, 7), (12, 50), (9, 0)]
]


def test_eval_schedule():
    assert [s for s in range(0, 5) if eval_is_due(s, 4, None)] == [4]
    assert [s for s in range(0, 6) if eval_is_due(s, 5, 2)] == [0, 2, 4, 5]  # before training, each 2nd step, the last
    assert [s for s in range(0, 4) if eval_is_due(s, 3, 1)] == [0, 1, 2, 3]


def test_held_out_fraction_is_split_off_and_its_loss_is_the_global_mean(one_rank_group, tmp_path):
    from transformers import AutoModelForCausalLM

    from rayft.train.model import build_sharded_model, load_full_state_dict, load_model_config
    from rayft.train.step import micro_batch_loss

    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (tmp_path / "job.yaml").write_text(
        "model: {name_or_path: mistral-tiny}\n"
        "data: {train_files: [chat.jsonl], seq_len: 64, packing: false, seed: 1, cache_dir: null, validation_fraction: 0.4}\n"
        "train: {num_workers: 1, use_gpu: false, micro_batch_size: 1, seed: 5}\n"
    )
    cfg = load_config(tmp_path / "job.yaml")
    assert cfg.train.eval_every is None  # the default: evaluated once, after the last step
    data = load_run_data(cfg, Console(quiet=True))
    assert (len(data.train), len(data.validation)) == (3, 2)
    train_ids = {tuple(data.train.example(i)[0]) for i in range(3)}
    held_ids = {tuple(data.validation.example(i)[0]) for i in range(2)}
    assert len(train_ids | held_ids) == 5  # disjoint: no held-out record is trained on

    cpu = torch.device("cpu")
    model = build_sharded_model(cfg.model, cfg.parallel, device=cpu, activation_checkpointing=False, compile_layers=False, seed=5)
    got = evaluate(model, data.validation, eval_rows(data.validation, cfg), cfg, data.tokenizer.pad_token_id, cpu, micro_batch_loss)
    assert model.module.training  # evaluate() puts the module back as it found it

    conf = load_model_config(cfg.model)
    ref = AutoModelForCausalLM.from_config(conf)
    ref.load_state_dict(load_full_state_dict(cfg.model, conf, 5))  # the same seeded initial weights, unsharded
    want, count = single_process_loss(ref.eval(), data.validation, 64)
    assert got["eval_tokens"] == count
    assert got["eval_loss"] == pytest.approx(want, rel=1e-5, abs=0)

"""The end-of-run export on a one-rank gloo group (rayft.train.export): prepare_export's probe
logits and rank 0's tokenizer, then export_and_verify through both writers (the sharded one of a
run directory on a file system; the gathered one of object storage and converted checkpoints): the
files reload with transformers and give the trained model's logits, the check and its timings are
recorded, the driver's channel gets the export event; a tokenizer that cannot load fails prepare.
Each with FSDP2 over the one rank and with one worker's plain module (parallel.single_worker)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rayft.config import RayftConfig
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_dataset
from rayft.data.tokenizer import load_tokenizer
from rayft.train.events import ExportEvent, ProgressChannel
from rayft.train.export import export_and_verify, prepare_export
from rayft.train.model import build_sharded_model, load_model_config
from rayft.train.worker_args import WorkerArgs

PRESET, TOKENIZER = "qwen2-tiny", "qwen2.5"


class ListMailbox:
    """The driver's mailbox, in this process: what rank 0 posts, kept in order."""

    def __init__(self) -> None:
        self.events: list = []

    def post(self, event, wait: bool = False, timeout_s: float | None = None) -> None:
        self.events.append(event)

    def take(self) -> list:
        out, self.events = self.events, []
        return out


@pytest.fixture(scope="module", params=["fsdp2", "compute_copy"])
def trained(one_rank_group, request):
    """The model under FSDP2 over the one rank, and without it (parallel.single_worker: the plain
    module a one-GPU run trains; fp32 on the CPU, so no compute copies)."""
    cfg = RayftConfig.model_validate({"model": {"name_or_path": PRESET}, "data": {"train_files": ["x.jsonl"], "seq_len": 64},
                                      "train": {"use_gpu": False}, "parallel": {"single_worker": request.param}})  # fmt: skip
    tok = load_tokenizer(TOKENIZER)
    recs = [{"instruction": "Add 2 and 3.", "input": "", "output": "5"}, {"instruction": "Name a colour.", "input": "", "output": "Blue"}]
    ds = tokenize_dataset(tok, [to_conversation(r, f"r{i}", "alpaca") for i, r in enumerate(recs)], seq_len=64)
    model = build_sharded_model(cfg.model, cfg.parallel, device=torch.device("cpu"), activation_checkpointing=False,
                                compile_layers=False, seed=7)  # fmt: skip
    assert model.fsdp is (request.param == "fsdp2")
    return cfg, ds, model, load_model_config(cfg.model), tok.pad_token_id


def args_for(run_dir, pad_id: int, tokenizer: str = TOKENIZER) -> WorkerArgs:
    return WorkerArgs(config={}, dataset=None, validation=None, plan=None, pad_id=pad_id, data_fingerprint="f",
                      tokenizer=tokenizer, run_dir=str(run_dir), progress=ProgressChannel.silent())  # fmt: skip


@pytest.mark.parametrize("gathered", [False, True], ids=["sharded", "gathered"])
def test_prepared_inputs_then_the_export_reload_with_the_trained_logits(trained, tmp_path, gathered):
    cfg, ds, model, model_conf, pad_id = trained
    model = dataclasses.replace(model, export_gathered=gathered)
    args = args_for(tmp_path, pad_id)
    inputs = prepare_export(model, ds, cfg, args, torch.device("cpu"))
    n = int(inputs.probe["input_ids"].shape[1])
    assert inputs.ref_logits.shape == (1, n, model_conf.vocab_size) and inputs.ref_logits.dtype == torch.float32
    assert inputs.tokenizer is not None and inputs.tokenizer.pad_token_id == pad_id
    mailbox = ListMailbox()
    export_and_verify(model, model_conf, cfg, args, torch.device("cpu"), ProgressChannel(mailbox), inputs)

    check = json.loads((tmp_path / "hf" / "rayft_export_check.json").read_text())
    assert check["export_written_by"] == ("rank 0 (gathered)" if gathered else "every rank (sharded)")
    assert check["export_max_abs_logit_diff"] == 0.0  # fp32 on CPU, the same weights
    if not gathered:
        assert check["export_max_abs_weight_diff"] == 0.0
    phases = {"probe", "config_inputs", "logit_check", *(("gather_write",) if gathered else ("write", "read_back", "config_files"))}
    assert set(check["export_timings_s"]) == phases
    assert [type(e) for e in mailbox.events] == [ExportEvent]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        got = hf(input_ids=inputs.probe["input_ids"], position_ids=inputs.probe["position_ids"]).logits
    assert torch.equal(got, inputs.ref_logits)
    assert (tmp_path / "hf" / "tokenizer.json").is_file() and (tmp_path / "hf" / "generation_config.json").is_file()


def test_a_tokenizer_that_cannot_load_fails_prepare_before_any_file(trained, tmp_path):
    cfg, ds, model, _, pad_id = trained
    with pytest.raises(Exception, match="no-such-tokenizer"):
        prepare_export(model, ds, cfg, args_for(tmp_path, pad_id, tokenizer=str(tmp_path / "no-such-tokenizer")), torch.device("cpu"))
    assert list(tmp_path.iterdir()) == []

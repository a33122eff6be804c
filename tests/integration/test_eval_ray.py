"""Validation loss (eval_loss) in a real 2-worker FSDP2 run on embedded local Ray (CPU, fp32).

What is exactly comparable:
* the evaluation before training (``train.eval_every``) uses the initial weights, as step 1's
  training loss does (its forward runs before the update); with a validation set equal to the
  training set and a first step that holds every example, both are the mean cross-entropy over the
  same tokens under the same weights;
* each step here is a whole epoch, so the evaluation after step k and step k+1's training loss
  are the same mean under the same weights;
* the last evaluation uses the final weights, which the HF export holds (checked to 1e-5 in
  logits), so a single-process forward of the export over the validation set gives the same mean.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from rayft.config import load_config
from rayft.train.driver import load_run_data, run_training

pytestmark = pytest.mark.integration

RECORDS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
    for a, b in [(1, 2), (30, 4), (7, 7), (12, 50), (9, 0)]
]


# mistral-tiny (32,768-token vocabulary) rather than qwen2-tiny (151,936): the same checks at a quarter
# of the CPU per step (a tiny model's work is mostly its output layer)
PAD_ID = 0  # the padding id does not enter the loss (padded positions are not targets); any id in the vocabulary


def job(tmp_path, *overrides):
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: mistral-tiny}\n"
        "data: {train_files: [chat.jsonl], seq_len: 64, packing: false, shuffle: true, seed: 1, cache_dir: null}\n"
        "train: {num_workers: 2, use_gpu: false, micro_batch_size: 2, grad_accum_steps: 2, epochs: 3, lr: 3.0e-3, warmup_steps: 0, seed: 5}\n"
        f"checkpoint: {{storage_path: {tmp_path / 'runs'}, name: t}}\n"
    )
    return load_config(cfg_file, list(overrides))


def single_process_loss(model, ds) -> tuple[float, int]:
    """Mean CE over every trainable target of ``ds``, one example at a time, one process."""
    from rayft.data.packing import IGNORE_INDEX, collate

    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(ds)):
            b = collate(ds, [[i]], 64, PAD_ID, fixed_len=False)
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"]).logits
            total += F.cross_entropy(
                logits.flatten(0, 1).double(), b["labels"].flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
            ).item()
            count += int(b["num_trainable"])
    return total / count, count


def history(tmp_path):
    return [json.loads(line) for line in (tmp_path / "runs" / "t" / "rayft_metrics.jsonl").read_text().splitlines()]


def test_eval_every_step_on_the_training_set(ray_local, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = job(tmp_path, "data.validation_files=[chat.jsonl]", "train.eval_every=1")
    ds = load_run_data(cfg, Console(quiet=True)).validation
    n_targets = sum(int(ds.example(i)[1][1:].sum()) for i in range(len(ds)))
    summary = run_training(cfg, console=Console(quiet=True))
    hist = history(tmp_path)
    assert [h["step"] for h in hist] == [1, 2, 3]
    # step 1 holds all 5 examples (2 workers × 2 × 2 = 8 rows ≥ 5) and runs before the update
    assert hist[0]["trainable_tokens"] == n_targets
    assert summary["eval_loss_initial"] == pytest.approx(hist[0]["loss"], rel=1e-5, abs=0)
    # an evaluation after every step, over every validation target
    assert all(h["eval_tokens"] == n_targets for h in hist)
    assert all(0 < h["eval_loss"] < 20 for h in hist)
    # every step is one whole epoch, so step k+1's training loss (forward before its update) is the
    # loss of the weights after step k over the same tokens: the evaluation after step k
    for k in (0, 1):
        assert hist[k]["eval_loss"] == pytest.approx(hist[k + 1]["loss"], rel=1e-5, abs=0)
    assert summary["eval_loss_initial"] > hist[0]["eval_loss"] > hist[1]["eval_loss"] > hist[2]["eval_loss"]
    assert (summary["eval_loss"], summary["eval_step"]) == (hist[-1]["eval_loss"], 3)
    # the final evaluation equals a single-process forward of the exported final model
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "t" / "hf", dtype=torch.float32).eval()
    ref, count = single_process_loss(hf, ds)
    assert count == n_targets
    assert hist[-1]["eval_loss"] == pytest.approx(ref, rel=1e-5, abs=0)


def test_held_out_fraction_is_evaluated_once_at_the_end_by_default(ray_local, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = job(tmp_path, "data.validation_fraction=0.4", "train.epochs=2", "train.micro_batch_size=1", "train.grad_accum_steps=1")
    data = load_run_data(cfg, Console(quiet=True))
    assert (len(data.train), len(data.validation)) == (3, 2)
    summary = run_training(cfg, console=Console(quiet=True))
    hist = history(tmp_path)
    # 3 training examples over 2 workers × 1 row: 2 steps per epoch, 4 steps
    assert [h["step"] for h in hist] == [1, 2, 3, 4]
    assert ["eval_loss" in h for h in hist] == [False, False, False, True]
    assert summary["eval_loss_initial"] is None and summary["eval_step"] == 4
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "t" / "hf", dtype=torch.float32).eval()
    ref, count = single_process_loss(hf, data.validation)
    assert hist[-1]["eval_tokens"] == count
    assert hist[-1]["eval_loss"] == pytest.approx(ref, rel=1e-5, abs=0)

"""`rayft eval` through lm-evaluation-harness on a tiny random model: rayft's offline task scored
as the model's own log-likelihoods say, results written into the run directory; a task whose
dataset must come from the hub fails offline naming the task."""

import json

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("lm_eval", reason="rayft eval needs lm-eval (pip install 'rayft[eval]')")

from rayft.cli import app
from rayft.evals.harness import OWN_TASKS

DOCS = [json.loads(line) for line in (OWN_TASKS["rayft_sums"].parent / "rayft_sums.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def run_with_export(tmp_path_factory, qwen_tokenizer):
    """A run directory (rayft.yaml) whose hf/ holds a randomly initialised qwen2-tiny, as an export."""
    from rayft.config import ModelConfig
    from rayft.train.checkpoint import write_hf_model
    from rayft.train.model import load_full_model, load_model_config

    run = tmp_path_factory.mktemp("run")
    (run / "rayft.yaml").write_text("data: {train_files: [x.jsonl]}\n")
    (run / "rayft_summary.json").write_text(json.dumps({"steps": 7}))
    cfg = ModelConfig(name_or_path="qwen2-tiny")
    conf = load_model_config(cfg)
    write_hf_model(load_full_model(cfg, conf, seed=5).state_dict(), conf, qwen_tokenizer, run / "hf")
    return run


def choice_logliks(model, tok, doc: dict) -> list[float]:
    """log P(" " + choice | "Question: ...\\nAnswer:") for each choice: the sum over the choice's
    tokens of the model's log-softmax, the context encoded alone and the choice's tokens being
    what encoding the whole adds (no BOS: Qwen's tokenizer adds none)."""
    context = f"Question: {doc['question']}\nAnswer:"
    out = []
    for choice in doc["choices"]:
        ctx = tok(context, add_special_tokens=False)["input_ids"]
        whole = tok(context + " " + choice, add_special_tokens=False)["input_ids"]
        cont = whole[len(ctx) :]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([whole])).logits[0].double(), dim=-1)
        out.append(sum(logp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont)))
    return out


def test_eval_offline_task_equals_the_models_own_loglikelihoods(run_with_export, qwen_tokenizer):
    from transformers import AutoModelForCausalLM

    run = run_with_export
    res = CliRunner().invoke(app, ["eval", str(run), "--tasks", "rayft_sums", "--limit", "8", "--batch-size", "4"])
    assert res.exit_code == 0, res.output
    (path,) = (run / "eval").glob("*Z.json")
    out = json.loads(path.read_text())
    assert out["tasks"] == ["rayft_sums"] and list(out["results"]) == ["rayft_sums"] and out["step"] == 7
    assert out["model_dir"] == str(run / "hf")
    assert out["n-samples"]["rayft_sums"] == {"original": len(DOCS), "effective": 8}  # the file's 24 documents, 8 scored
    samples = [json.loads(line) for line in path.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == list(range(8))

    model = AutoModelForCausalLM.from_pretrained(run / "hf", dtype=torch.float32).eval()
    tok = qwen_tokenizer  # the export's
    ours = [choice_logliks(model, tok, d) for d in DOCS[:8]]
    for s in samples:  # each choice's log-likelihood, as the harness computed it
        assert [r[0] for r in s["filtered_resps"]] == pytest.approx(ours[s["doc_id"]], abs=1e-3)
    right = [max(range(4), key=lambda i: lls[i]) == d["answer"] for lls, d in zip(ours, DOCS)]
    assert 0 < sum(right) < 8  # seed 5: a score that neither all-wrong nor all-right answers would give
    assert out["results"]["rayft_sums"]["acc,none"] == pytest.approx(sum(right) / 8)
    assert "rayft_sums" in res.output and "acc" in res.output and f"{sum(right) / 8:.4f}" in res.output  # the table


def test_a_task_needing_the_hub_fails_offline_naming_it(run_with_export, tmp_path, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # offline: what a machine without the hub sees at once (without it, the hub's retries take ~20 s)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub_mc.yaml").write_text(
        "task: hub_mc\ndataset_path: some-org/not-cached-here\noutput_type: multiple_choice\ntest_split: test\n"
        "doc_to_text: '{{q}}'\ndoc_to_choice: '{{c}}'\ndoc_to_target: a\nmetric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]\n"
    )
    res = CliRunner().invoke(app, ["eval", str(run_with_export / "hf"), "--tasks", "hub_mc", "--include-path", str(tasks)])
    assert res.exit_code == 1
    msg = " ".join(res.output.split())
    assert "error: task hub_mc: its dataset some-org/not-cached-here must be downloaded from the Hugging Face hub" in msg
    assert "rayft's own: rayft_sums" in msg

    res = CliRunner().invoke(app, ["eval", str(run_with_export), "--step", "3", "--tasks", "rayft_sums"])
    assert res.exit_code == 1 and f"{run_with_export}: no complete checkpoint in this run" in " ".join(res.output.split())

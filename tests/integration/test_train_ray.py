"""The main job end to end on a real embedded local Ray: 2 CPU workers, FSDP2 over gloo; its evaluation
(train.eval_every, a held-out fraction) in the same runs."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from reference_loss import single_process_loss

from rayft.config_load import load_config
from rayft.train.driver import TrainError, load_run_data, run_training

pytestmark = pytest.mark.integration

RECORDS = [
    {"messages": [{"role": "user", "content": f"What is {a} plus {b}?"}, {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]}
    for a, b in [(1, 2), (30, 4), (7, 7), (12, 50), (9, 0)]
]


def job(tmp_path, *overrides, model="qwen2-tiny"):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        f"model: {{name_or_path: {model}}}\n"
        "data: {train_files: [chat.jsonl], seq_len: 64, packing: false, shuffle: true, seed: 1}\n"
        "train: {num_workers: 2, use_gpu: false, micro_batch_size: 2, grad_accum_steps: 2, epochs: 6, lr: 3.0e-3, warmup_steps: 0, seed: 5}\n"
        f"checkpoint: {{storage_path: {tmp_path / 'runs'}, name: t, every_steps: 3}}\n"
    )
    return load_config(cfg_file, list(overrides))


def reference_first_step_loss(cfg):
    """Mean CE over every trainable token of step 1's global batch, from an unsharded copy of the
    same initial weights: what the 2-worker FSDP2 run must report for step 1."""
    from transformers import AutoModelForCausalLM

    from rayft.train.model import load_full_state_dict, load_model_config
    from rayft.train.step_plan import make_plan

    ds = load_run_data(cfg, __import__("rich.console").console.Console(quiet=True)).train
    conf = load_model_config(cfg.model)
    model = AutoModelForCausalLM.from_config(conf)
    model.load_state_dict(load_full_state_dict(cfg.model, conf, cfg.train.seed))
    rows = make_plan(cfg, ds, 2).step_rows(0)
    return single_process_loss(model, ds, cfg.data.seq_len, rows)[0], len(rows)


@pytest.fixture(scope="module")
def fsdp2_run(ray_local, tmp_path_factory):
    """The module's main 2-worker run (qwen2-tiny, 6 steps; each step one whole epoch of the 5
    examples), shared by the tests that read it: a Ray Train run costs ~30 CPU-s of CI on 2 cores.
    Its features at once: TensorBoard, a profiled window, and an evaluation on the training set
    before training and after every step, and a last checkpoint of the model only. ``(folder, config,
    its summary, step 1's reference loss)``."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    cfg = job(
        tmp,
        "tracking.tensorboard=true",
        "train.profile_steps=[2,3]",
        "data.validation_files=[chat.jsonl]",
        "train.eval_every=1",
        "checkpoint.final_model_only=true",
    )
    ref_loss, n_rows = reference_first_step_loss(cfg)
    assert n_rows == 5  # 5 rows over 2 ranks × 2 micro-batches × 2: uneven, one micro-batch empty
    return tmp, cfg, run_training(cfg), ref_loss


def test_two_worker_fsdp2_run_loss_export_and_tied_weights(fsdp2_run, qwen_tokenizer):
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from rayft.cli import app
    from rayft.infer.model_dir import model_dir
    from rayft.train.checkpoint import export_run, find_checkpoints

    tmp_path, cfg, summary, ref_loss = fsdp2_run
    run = tmp_path / "runs" / "t"
    hist = [json.loads(line) for line in (run / "rayft_metrics.jsonl").read_text().splitlines()]
    losses = [h["loss"] for h in hist]

    assert summary["steps"] == 6 and [h["step"] for h in hist] == list(range(1, 7))
    # step 1's loss is the mean over all trainable tokens of the uneven global batch
    assert losses[0] == pytest.approx(ref_loss, rel=1e-5)
    assert losses[-1] < losses[0] - 1.0  # falls by more than one nat in 6 steps
    assert all(h["trainable_tokens"] > 0 and h["grad_norm"] > 0 for h in hist)
    # each step is one whole epoch of the 5 examples, one a row (no packing): its tokens, and Σ length² for MFU's attention term
    lengths = [int(n) for n in load_run_data(cfg, __import__("rich.console").console.Console(quiet=True)).train.lengths()]
    assert len(lengths) == 5 and max(lengths) <= cfg.data.seq_len
    assert all((h["tokens"], h["attn_tokens_sq"]) == (sum(lengths), sum(n * n for n in lengths)) for h in hist), hist[0]
    # tracking.tensorboard: the driver's event files hold the same per-step losses (float32) and learning rates
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(h["step"], float(np.float32(h["loss"]))) for h in hist]
    assert [e.value for e in events.Scalars("train/lr")] == [float(np.float32(h["lr"])) for h in hist]
    # train.eval_every 1: each step's evaluation, and the one before training at step 0 (written with the summary)
    evals = [(0, summary["eval_loss_initial"])] + [(h["step"], h["eval_loss"]) for h in hist]
    assert sorted((e.step, e.value) for e in events.Scalars("eval/loss")) == [(s, float(np.float32(v))) for s, v in evals]
    # `rayft eval --step 3`: step 3's checkpoint exported to a temporary directory (removed after) and
    # scored with lm-eval; each choice's log-likelihood is step 3's model's (as `rayft export` writes it)
    res = CliRunner().invoke(app, ["eval", str(run), "--step", "3", "--tasks", "rayft_sums", "--limit", "3"])
    assert res.exit_code == 0, res.output
    (result,) = (run / "eval").glob("*Z.json")
    ev = json.loads(result.read_text())
    assert ev["step"] == 3 and ev["n-samples"]["rayft_sums"]["effective"] == 3 and not Path(ev["model_dir"]).exists()
    step3 = AutoModelForCausalLM.from_pretrained(export_run(str(run), step=3, out=tmp_path / "step3")).eval()
    tok = qwen_tokenizer  # the run's (and its exports')
    for sample in map(json.loads, result.with_suffix(".samples.jsonl").read_text().splitlines()):
        for (context, choice), (ll, _) in zip(sample["arguments"], sample["filtered_resps"]):
            ctx, whole = (tok(t, add_special_tokens=False)["input_ids"] for t in (context, context + choice))
            with torch.no_grad():
                logp = torch.log_softmax(step3(torch.tensor([whole])).logits[0].double(), -1)
            assert ll == pytest.approx(sum(logp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))), abs=1e-3)
    # train.profile_steps [2, 3]: those steps marked in the metrics; each rank's trace holds their two
    # step ranges (CPU workers: operators, no GPU kernels) and its operators' table
    from rayft.benchmarks.trace_kernels import load_events, summarize

    assert [h.get("profiled", False) for h in hist] == [False, True, True, False, False, False]
    for r in (0, 1):
        events = load_events(run / "profile" / f"rank{r}.trace.json.gz")
        assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {"ProfilerStep#2", "ProfilerStep#3"}
        assert summarize(events).steps == 2 and any(e.get("name") == "aten::mm" for e in events)
        ops = (run / "profile" / f"rank{r}.ops.txt").read_text()
        assert ops.startswith(f"steps 2-3, rank {r}\n") and "aten::mm" in ops and "Self CPU" in ops
    # worker setup is reported once, with the first step, and includes the model build
    assert hist[0]["time_setup_s"] >= hist[0]["time_setup_model_build_s"] > 0
    assert not any("time_setup_s" in h for h in hist[1:])
    # where the wall time went: every phase measured, one after the other, together the whole run
    wall = summary["wall_s"]
    phases = ("ray", "checks", "data", "workers_start", "data_wait", "worker_setup", "first_step", "checkpoint_buffers", "steps", "end")
    assert set(wall) == {*phases, "total"}
    parts = sum(v for k, v in wall.items() if k != "total")
    assert all(v >= 0 for v in wall.values()) and parts == pytest.approx(wall["total"], abs=0.05)
    # the timeline's wall clock, for a caller timing the whole process (bench/gpu/wall_time.sh)
    clock = summary["timeline_unix"]
    assert clock["end"] - clock["start"] == pytest.approx(wall["total"]) and clock["start"] > time.time() - 3600
    # the data phase's parts, each measured, within the phase, which ran beside the workers' start
    data_parts = summary["data_timings_s"]
    assert set(data_parts) == {"imports", "tokenizer", "store", "total", "plan_and_checks"} and all(v >= 0 for v in data_parts.values())
    assert (
        data_parts["tokenizer"] > 0 and data_parts["imports"] + data_parts["tokenizer"] + data_parts["store"] <= data_parts["total"] + 0.01
    )
    # the workers waited for the data (and the plan) at most for what their own start did not cover
    beyond = data_parts["total"] + data_parts["plan_and_checks"] - wall["workers_start"]
    assert wall["data_wait"] <= max(0.0, beyond) + 0.5

    # the HF export loads, keeps the embeddings tied, and reproduces the trained model's logits
    check = json.loads((run / "hf" / "rayft_export_check.json").read_text())
    assert check["export_tied"] is True and check["export_max_abs_logit_diff"] < 1e-5
    # written by both ranks, no gather: every tensor read back equal to the shards that wrote it
    assert check["export_written_by"] == "every rank (sharded)" and check["export_max_abs_weight_diff"] == 0.0
    assert check["export_tensors"] == 26  # the LM head is the embedding: stored once
    # rank 0's time per export phase, each measured
    timings = check["export_timings_s"]
    assert set(timings) == {"probe", "config_inputs", "write", "read_back", "config_files", "logit_check"} and all(
        v > 0 for v in timings.values()
    )
    assert sorted(p.name for p in (run / "hf").glob("*.safetensors")) == ["model.safetensors"]  # 39 MB: one file
    hf = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    assert hf.config.tie_word_embeddings is True
    # 2 layers of hidden 64 and the 151,936 × 64 embedding, stored once (the LM head shares it)
    assert sum(p.numel() for p in hf.parameters()) == 9_798_208

    # the DCP checkpoints are complete; exporting the last one gives the same weights, still tied
    assert [s for s, _ in find_checkpoints(run)] == [3, 6]
    # checkpoint.final_model_only: step 6 holds the weights only, without AdamW's two moments; half of step 3's
    # bytes here, not a third, as the tied embedding (99% of this model) is stored under both of its names
    import torch.distributed.checkpoint as dcp

    from rayft.train.checkpoint_files import directory_bytes, read_state

    ckpt3, ckpt6 = run / "checkpoint_0000003", run / "checkpoint_0000006"
    assert (read_state(ckpt3)["contents"], read_state(ckpt6)["contents"]) == ("model+optimizer", "model")
    keys3, keys6 = (set(dcp.FileSystemReader(str(c)).read_metadata().state_dict_metadata) for c in (ckpt3, ckpt6))
    assert keys6 == {k for k in keys3 if k.startswith("model.")} and any(k.startswith("optim.") for k in keys3)
    assert 0.45 < directory_bytes(ckpt6) / directory_bytes(ckpt3) < 0.55
    assert [c["contents"] for c in summary["checkpoints"]] == ["model+optimizer", "model"]
    # each rank writes checkpoint.write_threads (default 8) files in parallel
    shards = sorted(p.name for p in (run / "checkpoint_0000006").glob("*.distcp"))
    assert shards == [f"__{r}_{i}.distcp" for r in (0, 1) for i in range(8)]
    # `rayft chat/generate RUN --step 6` export the checkpoint on the fly into a temporary directory
    with model_dir(run, step=6) as tmp_export:
        assert tmp_export != run / "hf"
        again = AutoModelForCausalLM.from_pretrained(tmp_export)
        gen = json.loads((tmp_export / "generation_config.json").read_text())
    assert not tmp_export.exists()
    with model_dir(run) as final:  # no step: the end-of-run export
        assert final == run / "hf"
    assert again.lm_head.weight is again.model.embed_tokens.weight
    for (k, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(again.state_dict().items())):
        assert torch.equal(a, b), k
    # the offline export holds one file's tensors at a time: split into files of ≤ 5 MiB, the same weights
    split = export_run(str(run), step=6, out=tmp_path / "split", file_bytes=5 * 2**20)
    assert len(list(split.glob("model-*-of-*.safetensors"))) >= 2 and (split / "model.safetensors.index.json").exists()
    parts = AutoModelForCausalLM.from_pretrained(split)
    for (k, a), (_, b) in zip(sorted(hf.state_dict().items()), sorted(parts.state_dict().items())):
        assert torch.equal(a, b), k
    assert again.config.eos_token_id == 151643 and again.config.use_cache is True and hf.config.use_cache is True
    # both exports stop generating at ChatML's end of turn <|im_end|>, then the base EOS
    assert gen["eos_token_id"] == [151645, 151643] == hf.generation_config.eos_token_id


def test_eval_every_step_on_the_training_set(fsdp2_run):
    """train.eval_every 1 with the training set as the validation set (data.validation_files). What
    is exactly comparable: the evaluation before training uses the initial weights, as step 1's
    training loss does (its forward runs before the update), over the same tokens (step 1 holds every
    example: 2 workers × 2 × 2 = 8 rows ≥ 5); each step is a whole epoch, so the evaluation after step
    k and step k+1's training loss are the same mean under the same weights; the last evaluation uses
    the final weights, which the export holds, so a single-process forward of it gives the same mean."""
    from rich.console import Console
    from transformers import AutoModelForCausalLM

    tmp_path, cfg, summary, _ = fsdp2_run
    ds = load_run_data(cfg, Console(quiet=True)).validation
    n_targets = sum(int(ds.example(i)[1][1:].sum()) for i in range(len(ds)))
    hist = [json.loads(line) for line in (tmp_path / "runs" / "t" / "rayft_metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hist] == [1, 2, 3, 4, 5, 6]
    assert hist[0]["trainable_tokens"] == n_targets
    assert summary["eval_loss_initial"] == pytest.approx(hist[0]["loss"], rel=1e-5, abs=0)
    # an evaluation after every step, over every validation target
    assert all(h["eval_tokens"] == n_targets for h in hist)
    for k in range(5):
        assert hist[k]["eval_loss"] == pytest.approx(hist[k + 1]["loss"], rel=1e-5, abs=0), k
    evals = [summary["eval_loss_initial"]] + [h["eval_loss"] for h in hist]
    assert all(a > b for a, b in zip(evals, evals[1:])), evals  # falls after every step
    assert (summary["eval_loss"], summary["eval_step"]) == (hist[-1]["eval_loss"], 6)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "t" / "hf", dtype=torch.float32).eval()
    ref, count = single_process_loss(hf, ds, cfg.data.seq_len)
    assert count == n_targets
    assert hist[-1]["eval_loss"] == pytest.approx(ref, rel=1e-5, abs=0)


def test_a_model_only_last_checkpoint_is_not_resumed(fsdp2_run, tmp_path):
    """--resume of a run whose last checkpoint holds the model only is refused before any worker
    starts: with steps left (no optimizer state to go on with) and without (nothing to train)."""
    import shutil

    src, _, _, _ = fsdp2_run
    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    shutil.copytree(src / "runs" / "t" / "checkpoint_0000006", run / "checkpoint_0000006")
    here = f"checkpoint.storage_path={tmp_path / 'runs'}"  # the fixture's data file (its path is part of the fingerprint)
    t0 = time.perf_counter()
    with pytest.raises(TrainError, match=r"holds the model's weights only \(checkpoint.final_model_only\).* from its step 6 to 8"):
        run_training(job(src, "data.validation_files=[chat.jsonl]", "train.epochs=8", here), resume=str(run))
    with pytest.raises(TrainError, match=r"already holds step 6 of this run's 6: nothing to train"):
        run_training(job(src, "data.validation_files=[chat.jsonl]", here), resume=str(run))
    assert time.perf_counter() - t0 < 30 and sorted(p.name for p in run.iterdir()) == ["checkpoint_0000006"]


def test_float8_run_trains_checkpoints_and_exports_plain_weights(ray_local, tmp_path):
    """train.float8 on 2 CPU workers (PyTorch's CPU float8 matmul): step 1's loss is close to the
    full-precision reference, the loss falls, the DCP checkpoint exports to plain fp32 weights, the
    export check says the trained model ran float8, and a resume loads the checkpoint back into the
    float8 model (FSDP2's float8 all-gather weights). With a held-out fraction and no
    train.eval_every, the only evaluation is after the last step (the default schedule)."""
    pytest.importorskip("torchao.float8", reason="train.float8 needs torchao (pip install 'rayft[fp8]')")
    from transformers import AutoModelForCausalLM

    from rayft.train.checkpoint import export_run

    # mistral-tiny (32,768-token vocabulary): float8 acts on the decoder's linears, which every family has; a
    # quarter of qwen2-tiny's output-layer work per step on CPU
    held_out = "data.validation_fraction=0.4"  # 2 of the 5 records; 3 train, one step an epoch
    cfg = job(tmp_path, "train.float8=true", "train.epochs=2", held_out, model="mistral-tiny")
    first = run_training(cfg)
    run = tmp_path / "runs" / "t"
    hist = [json.loads(line) for line in (run / "rayft_metrics.jsonl").read_text().splitlines()]
    assert len(hist) == 2 and all(h["float8"] is True for h in hist)
    assert ["eval_loss" in h for h in hist] == [False, True] and hist[1]["eval_tokens"] > 0
    assert first["eval_loss_initial"] is None and (first["eval_loss"], first["eval_step"]) == (hist[1]["eval_loss"], 2)
    ref_loss, _ = reference_first_step_loss(cfg)
    assert hist[0]["loss"] == pytest.approx(ref_loss, rel=2e-2)  # float8 rounding of step 1's matmuls only
    assert hist[1]["loss"] < hist[0]["loss"]
    check = json.loads((run / "hf" / "rayft_export_check.json").read_text())
    assert check["trained_float8"] is True and 0 < check["export_max_abs_logit_diff"] < 0.5
    assert check["export_max_abs_weight_diff"] == 0.0  # the fp32 master weights, exactly, though the matmuls ran float8
    exported = AutoModelForCausalLM.from_pretrained(export_run(str(run)))
    w = exported.model.layers[0].mlp.up_proj.weight
    assert type(w.data) is torch.Tensor and torch.isfinite(w).all()
    final = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert torch.equal(final.model.layers[0].mlp.up_proj.weight, w)  # the last checkpoint is the trained model

    # resuming loads the float8 run's DCP checkpoint back into a float8 model and goes on
    summary = run_training(
        job(tmp_path, "train.float8=true", "train.epochs=3", held_out, "checkpoint.export_hf=false", model="mistral-tiny"), resume=str(run)
    )
    assert summary["resumes"][0]["step"] == 2 and summary["steps"] == 3
    hist = [json.loads(line) for line in (run / "rayft_metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hist] == [1, 2, 3] and hist[2]["float8"] is True and hist[2]["loss"] < hist[0]["loss"]
    assert ["eval_loss" in h for h in hist] == [False, True, True] and summary["eval_step"] == 3


def test_a_profile_window_past_the_last_step_is_refused_before_the_workers(ray_local, tmp_path):
    with pytest.raises(TrainError, match=r"train.profile_steps=\[5, 7\] but the run has only 6 steps: nothing would be written"):
        run_training(job(tmp_path, "train.profile_steps=[5,7]"))
    assert not (tmp_path / "runs" / "t").exists()


def test_too_many_gpus_fails_fast_with_a_clear_message(ray_local, tmp_path):
    cfg = job(tmp_path, "train.use_gpu=true", "train.num_workers=4")
    t0 = time.perf_counter()
    with pytest.raises(TrainError, match=r"train.num_workers=4 needs 4 GPUs but the Ray cluster has 0"):
        run_training(cfg)
    assert time.perf_counter() - t0 < 30


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a Ray cluster without GPUs (use_gpu: auto must pick CPU workers)")
def test_a_gpu_memory_cap_on_cpu_workers_fails_fast(ray_local, tmp_path):
    with pytest.raises(
        TrainError, match=r"train.gpu_memory_limit_gib=22.5 caps GPU workers' memory, but this run's workers are CPU workers"
    ):
        run_training(job(tmp_path, "train.use_gpu=auto", "train.gpu_memory_limit_gib=22.5"))  # auto: no GPU here
    with pytest.raises(TrainError, match=r"train.liger_kernels are CUDA \(Triton\) kernels, but this run's workers are CPU workers"):
        run_training(job(tmp_path, "train.use_gpu=auto", "train.liger_kernels=true"))


def test_empty_dataset_is_an_error_before_any_worker(tmp_path):
    # every example loses its only trainable token to truncation
    long = {"messages": [{"role": "user", "content": "x " * 200}, {"role": "assistant", "content": "y"}]}
    (tmp_path / "chat.jsonl").write_text(json.dumps(long) + "\n")
    cfg = job(tmp_path)
    (tmp_path / "chat.jsonl").write_text(json.dumps(long) + "\n")
    with pytest.raises(TrainError, match=r"empty dataset: no example with a trainable token"):
        run_training(cfg)


def test_bad_record_is_reported_before_any_worker(tmp_path):
    cfg = job(tmp_path)
    (tmp_path / "chat.jsonl").write_text(json.dumps(RECORDS[0]) + "\n{oops\n")
    with pytest.raises(TrainError, match=r"chat\.jsonl:2: invalid JSON"):
        run_training(cfg)

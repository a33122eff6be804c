"""rayft bench train: cost arithmetic, batch token counts, rank merging, figures, the Markdown
table from a synthetic results file, the per-run failure path, and data.synthetic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rayft.benchmarks import train as bt
from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br
from rayft.benchmarks.recipes import batch_token_stats, padded_batch, rank_rows, step_rows
from rayft.cli import app
from rayft.config import ConfigError
from rayft.config_load import load_config
from rayft.data.synthetic import random_dataset
from rayft.data.tokenize import assemble


def test_cost_per_million_tokens_from_the_catalog_price_of_l4():
    p = br.gpu_price("NVIDIA L4")
    assert p["instance"] == "g6.12xlarge" and p["gpus_per_instance"] == 4 and p["instance_usd_per_hour"] == 4.6016
    assert p["usd_per_gpu_hour"] == pytest.approx(1.1504, abs=1e-12)
    assert p["date"] == "2026-11-30" and "on-demand" in p["source"].lower()
    # 1.1504 USD per GPU-hour at 1,000 tokens/s/GPU: 3.6 M tokens per GPU-hour → 0.31955... USD per 1M tokens
    assert br.usd_per_million_tokens(p["usd_per_gpu_hour"], 1000.0) == pytest.approx(1.1504 / 3.6, rel=1e-12)
    assert br.usd_per_million_tokens(None, 1000.0) is None


def test_h200_maps_to_p5en_whose_price_is_not_in_the_catalog():
    p = br.gpu_price("NVIDIA H200")
    assert p["instance"] == "p5en.48xlarge" and p["usd_per_gpu_hour"] is None and "--usd-per-gpu-hour" in p["note"]
    given = br.gpu_price("NVIDIA H200", usd_per_gpu_hour=5.0)
    assert given["usd_per_gpu_hour"] == 5.0 and "command line" in given["source"]
    assert br.gpu_price("Some GPU")["note"].startswith("no instance mapped")


def test_padded_batch_counts_exact_non_padding_tokens():
    ds = assemble([(np.arange(1, n + 1, dtype=np.int32), np.ones(n, bool)) for n in (3, 7, 5)])
    b = padded_batch(ds, [0, 1, 2], 8, pad_id=0)
    assert b["tokens"] == 15 and b["attn_tokens_sq"] == 9 + 49 + 25
    assert b["input_ids"].shape == (3, 8) and int(b["attention_mask"].sum()) == 15
    assert (b["labels"][0, 3:] == -100).all() and b["labels"][1, :7].tolist() == list(range(1, 8))
    assert step_rows(5, 2, 4) == [3, 4, 0, 1]  # step 2 of 4 rows over 5 examples wraps around
    # the sample recipe's ranks: each its micro-batch of the step's rows, dealt out in turn, none twice
    assert [rank_rows(5, 2, 2, r, 2) for r in (0, 1)] == [[3, 0], [4, 1]]
    assert rank_rows(5, 2, 4, 0, 1) == step_rows(5, 2, 4)
    # the random workload's rows fill seq_len exactly: every row of a step counts whole, no padding
    rnd = random_dataset(12, 64, 32768, seed=0)
    b = padded_batch(rnd, step_rows(len(rnd), 2, 4), 64, pad_id=0)
    assert b["tokens"] == 4 * 64 and b["attn_tokens_sq"] == 4 * 64**2 and (b["labels"] != -100).all()


def test_batch_token_stats_padded_and_padding_free():
    padded = {"input_ids": torch.zeros(2, 6, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6])}
    assert batch_token_stats(padded) == (9, 9.0 + 36.0)
    free = {"input_ids": torch.zeros(1, 7, dtype=torch.long), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1]])}
    assert batch_token_stats(free) == (7, 9.0 + 4.0 + 4.0)
    full = {"input_ids": torch.zeros(2, 4, dtype=torch.long)}
    assert batch_token_stats(full) == (8, 32.0)


def test_merge_ranks_and_summarize():
    r0 = [{"step": s, "step_time_s": 1.0, "tokens": 100, "attn_tokens_sq": 10000.0, "peak_mem_gib": 2.0} for s in (1, 2, 3)]
    r1 = [
        {"step": s, "step_time_s": 2.0 if s == 3 else 0.5, "tokens": 100, "attn_tokens_sq": 10000.0, "peak_mem_gib": 3.0} for s in (1, 2, 3)
    ]
    merged = br.merge_ranks([r0, r1])
    assert [m["step_time_s"] for m in merged] == [1.0, 1.0, 2.0] and merged[0]["tokens"] == 200 and merged[0]["peak_mem_gib"] == 3.0
    figs = br.summarize(merged, 1, 2, lambda span: 1000.0 + span, 1e6)
    assert figs["steps_measured"] == 2
    assert figs["tokens_per_s_per_gpu"] == pytest.approx((100.0 + 50.0) / 2)  # median of 200/1/2 and 200/2/2
    assert figs["attn_span_tokens"] == 100.0 and figs["flops_per_token"] == 1100.0
    assert figs["mfu"] == pytest.approx(75.0 * 1100.0 / 1e6)
    assert figs["step_time_s"]["p50"] == 1.5 and figs["step_time_s"]["p10"] == pytest.approx(1.1)
    assert figs["tokens_per_s_per_gpu_window"] == pytest.approx(400 / 3.0 / 2)  # steps 2 and 3: 400 tokens in 1 + 2 s
    run = {"recipe": "rayft", "workload": "real", "status": "ok", **figs, "steps": merged}
    doc = {"figures": {"runs": [run], "price": {}, "warmup_steps": 1, "world_size": 2}}
    assert "slow steps count in full): rayft × real 67 tokens/s/GPU." in br.markdown_table(doc)
    del run["tokens_per_s_per_gpu_window"]  # a results file from before the figure: computed from its steps
    assert br.run_window_rate(run, 1, 2) == pytest.approx(400 / 3.0 / 2) and br.run_window_rate(run, 0, 2) == pytest.approx(600 / 4.0 / 2)
    assert br.run_window_rate({"steps": []}, 1, 2) is None
    assert br.run_window_rate(run, None, 2) is None and br.run_window_rate(run, 1, None) is None  # the file does not say: no guess
    for bad in (0, -0.5, "x", None, True):
        broken = {"steps": [{**m, "step_time_s": bad} if m["step"] == 3 else m for m in merged]}
        with pytest.raises(ValueError, match=rf"step 3: step_time_s must be a positive number of seconds, got {bad!r}"):
            br.run_window_rate(broken, 1, 2)
    for bad in (-1, float("nan"), float("inf"), None, True):
        broken = {"steps": [{**m, "tokens": bad} if m["step"] == 2 else m for m in merged]}
        with pytest.raises(ValueError, match=r"step 2: tokens must be a number >= 0"):
            br.run_window_rate(broken, 1, 2)
    for bad in ("123", float("nan"), -5, 0, True):
        with pytest.raises(ValueError, match=r"tokens_per_s_per_gpu_window must be a positive number"):
            br.run_window_rate({**run, "tokens_per_s_per_gpu_window": bad}, 1, 2)
    bad_figures = (
        (-3, 2, "warmup_steps"),
        (4.5, 2, "warmup_steps"),
        (True, 2, "warmup_steps"),
        (1, 0, "world_size"),
        (1, 0.5, "world_size"),
        (1, True, "world_size"),
    )
    for warm, world, what in bad_figures:
        with pytest.raises(ValueError, match=rf"figures.{what} must be an integer"):
            br.run_window_rate(run, warm, world)
    with pytest.raises(br.BenchTrainError, match="none after the 3 warm-up"):
        br.summarize(merged, 3, 2, None, None)
    assert "excluding_report" not in figs and "loss" not in merged[0]


def test_the_sample_recipes_report_time_is_measured_apart():
    """sample-recipe logs report_s (its per-step ray.train.report): a second figure leaves it out."""

    def rank(times, reports, losses):
        return [
            {"step": s + 1, "step_time_s": t, "report_s": r, "tokens": 100, "attn_tokens_sq": 1e4, "peak_mem_gib": None, "loss": l}
            for s, (t, r, l) in enumerate(zip(times, reports, losses))
        ]

    merged = br.merge_ranks(
        [rank([2.0, 2.0, 2.0], [1.5, 1.5, 1.0], [4.0, 3.0, 2.0]), rank([1.9, 2.0, 2.5], [1.0, 1.6, 1.6], [2.0, 1.0, 1.0])]
    )
    assert [m["step_time_excl_report_s"] for m in merged] == pytest.approx([0.9, 0.5, 1.0])  # max over ranks of (step - report)
    assert [m["report_s"] for m in merged] == [1.5, 1.6, 1.6] and [m["loss"] for m in merged] == [3.0, 2.0, 1.5]
    figs = br.summarize(merged, 1, 2, lambda span: 1000.0, 1e6)
    assert figs["tokens_per_s_per_gpu"] == pytest.approx(45.0)  # median of 200 / 2.0 / 2 and 200 / 2.5 / 2
    ex = figs["excluding_report"]
    assert ex["tokens_per_s_per_gpu"] == pytest.approx(150.0) and ex["report_s_median"] == pytest.approx(1.6)  # (200 + 100) / 2
    assert ex["mfu"] == pytest.approx(150.0 * 1000.0 / 1e6)
    doc = {"figures": {"runs": [{"recipe": "sample-recipe", "workload": "random", "status": "ok", **figs}], "price": {}}}
    assert (
        "sample-recipe × random without its per-step `ray.train.report` (median 1.60 s a call, part of every step above): 150 tokens/s/GPU, MFU 15.0%."
        in br.markdown_table(doc)
    )


def synthetic_results(path: Path) -> Path:
    ok = {
        "recipe": "rayft",
        "workload": "random",
        "status": "ok",
        "tokens_per_s_per_gpu": 43272.4,
        "mfu": 0.411,
        "peak_mem_gib": 54.62,
        "step_time_s": {"p10": 0.37, "p50": 0.38, "p90": 0.4, "min": 0.3, "max": 0.5},
        "usd_per_1m_tokens": 0.0123,
        "micro_batch_size": 16,
    }
    bad = {"recipe": "trl-best", "workload": "real", "status": "failed", "error": "exit 1\n  Traceback ..."}
    doc = {
        "command": "rayft bench train x.yaml",
        "git_commit": "abcdef1234567890",
        "environment": {"gpu_model": "NVIDIA H200"},
        "figures": {
            "model": "qwen2.5-1.5b",
            "seq_len": 2048,
            "micro_batch_size": 8,
            "world_size": 2,
            "steps": 30,
            "warmup_steps": 5,
            "price": {"usd_per_gpu_hour": None, "note": "the catalog has no On-Demand price for p5en.48xlarge"},
            "runs": [ok, bad],
        },
    }
    path.write_text(json.dumps(doc))
    return path


def test_table_command_regenerates_markdown_from_a_results_file(tmp_path):
    res = synthetic_results(tmp_path / "r.json")
    out = CliRunner().invoke(app, ["bench", "table", str(res)])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "r.md").read_text()
    assert "| rayft | random | 16 | 43,272 | 41.1% | 54.6 | 0.370 / 0.380 / 0.400 | 0.0123 | ok |" in md
    assert "| trl-best | real | 8 | — | — | — | — | — | failed: exit 1 |" in md  # an old file's runs: the file's micro-batch
    assert "2 × NVIDIA H200" in md and "Cost: not computed: the catalog has no On-Demand price" in md
    pytest.importorskip("matplotlib")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_a_failed_recipe_keeps_the_others_results(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "model: {name_or_path: mistral-tiny}\ndata: {synthetic: {rows: 4}, seq_len: 16}\n"
        f"train: {{num_workers: 2, use_gpu: false, micro_batch_size: 1}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )

    def runner(cmd, env, log, timeout_s):
        log.write_text("line 1\nboom: the recipe crashed\n")
        if "sample" in cmd:  # sample-recipe: write two ranks' step records as the real recipe does
            run_dir = Path(json.loads(Path(cmd[-1]).read_text())["out_dir"])
            for rank in (0, 1):
                (run_dir / f"steps.rank{rank}.jsonl").write_text(
                    "".join(
                        json.dumps({"step": s, "step_time_s": 0.5, "tokens": 16, "attn_tokens_sq": 256.0, "peak_mem_gib": None}) + "\n"
                        for s in (1, 2, 3)
                    )
                )
            return 0
        return 1

    def bench(recipes, name, run, **options):
        return bt.run_bench(
            cfg,
            recipes=recipes,
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            out=tmp_path / f"{name}.json",
            work_dir=tmp_path / name,
            runner=run,
            **options,
        )

    path, figs = bench(["sample-recipe", "trl-default"], "res", runner)
    ok, bad = figs["runs"]
    assert ok["status"] == "ok" and ok["tokens_per_s_per_gpu"] == 32.0  # 2 ranks × 16 tokens / 0.5 s / 2 GPUs
    assert ok["mfu"] is None and ok["attn_span_tokens"] == 16.0
    assert bad["status"] == "failed" and "exit 1" in bad["error"] and "boom: the recipe crashed" in bad["error"]
    doc = json.loads(path.read_text())
    assert doc["figures"]["runs"][1]["status"] == "failed" and doc["command"].startswith("rayft bench train")
    assert "failed: exit 1" in path.with_suffix(".md").read_text()
    assert doc["figures"]["trl_compile"] is False and "--trl-compile" not in doc["command"]
    # --trl-compile: in the results' command and figures, the TRL run's spec and its row's label
    specs = []

    def spec_runner(cmd, env, log, timeout_s):
        if "trl" in cmd:
            specs.append(json.loads(Path(cmd[-1]).read_text()))
        return runner(cmd, env, log, timeout_s)

    path, figs = bench(["sample-recipe", "trl-best"], "res2", spec_runner, trl_compile=True)
    doc = json.loads(path.read_text())
    assert "--trl-compile" in doc["command"] and doc["figures"]["trl_compile"] is True
    assert [s["compile"] for s in specs] == [True]
    trl_run = doc["figures"]["runs"][1]
    assert trl_run["recipe"] == "trl-best" and trl_run["label"] == "trl-best + compile" and trl_run["settings"]["compile"] is True


def test_the_trl_compile_option_reaches_the_bench(tmp_path, monkeypatch):
    import rayft.benchmarks.train as train_bench

    seen = {}

    def fake_run_bench(*args, **kwargs):
        seen.update(kwargs)
        raise br.BenchTrainError("stop here")

    monkeypatch.setattr(train_bench, "run_bench", fake_run_bench)
    for argv, want in ((["--trl-compile"], True), ([], False)):
        out = CliRunner().invoke(app, ["bench", "train", str(tmp_path / "job.yaml"), *argv])
        assert out.exit_code == 1 and "stop here" in out.output and seen["trl_compile"] is want


def test_random_dataset_and_the_synthetic_config(tmp_path):
    ds = random_dataset(3, 16, 100, seed=7)
    assert len(ds) == 3 and ds.lengths().tolist() == [16, 16, 16] and ds.trainable.all()
    assert ds.tokens.min() >= 0 and ds.tokens.max() < 100
    assert np.array_equal(ds.tokens, random_dataset(3, 16, 100, seed=7).tokens)
    assert not np.array_equal(ds.tokens, random_dataset(3, 16, 100, seed=8).tokens)
    f = tmp_path / "c.yaml"
    f.write_text("data: {synthetic: {rows: 5, seed: 2}}\n")
    assert load_config(f).data.synthetic.rows == 5
    f.write_text("data: {synthetic: {rows: 5}, train_files: [x.json]}\n")
    with pytest.raises(ConfigError, match="data.synthetic replaces"):
        load_config(f)
    f.write_text("data: {seq_len: 16}\n")
    with pytest.raises(ConfigError, match="train_files is required"):
        load_config(f)


def test_rayft_random_workload_wins_over_a_user_train_files_override(tmp_path):
    """bench_train.sh passes --set data.train_files=[...]; the random workload must still load."""
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: qwen2-tiny}\ndata: {train_files: [a.json], seq_len: 16}\n"
        f"train: {{num_workers: 2, use_gpu: false, micro_batch_size: 3}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    user = ["data.train_files=[x.json,y.json]", "train.lr=0.5"]
    cfg = load_config(cfg_file, user)
    plan = brc.Plan(cfg_file, user, ["rayft"], ["random", "real"], 4, 1, tmp_path / "wd", None)
    for workload in ("random", "real"):
        cmd = brc.recipe_command("rayft", workload, plan, cfg, 2, False, {}, tmp_path / "run")
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        got = load_config(cfg_file, sets)
        assert got.train.lr == 0.5 and got.train.max_steps == 4 and got.train.compile is True
        if workload == "random":
            assert got.data.train_files == [] and got.data.synthetic.rows == 4 * 2 * 3
        else:
            assert got.data.train_files == ["x.json", "y.json"] and got.data.synthetic is None


def test_rayft_set_and_the_fp8_recipe_reach_only_the_rayft_runs(tmp_path):
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: qwen2-tiny}\ndata: {train_files: [a.json], seq_len: 16}\n"
        f"train: {{num_workers: 2, use_gpu: false, micro_batch_size: 3}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    cfg = load_config(cfg_file)
    plan = brc.Plan(
        cfg_file,
        [],
        ["rayft", "rayft-fp8"],
        ["random"],
        4,
        1,
        tmp_path / "wd",
        None,
        rayft_overrides=["train.micro_batch_size=5", "train.fused_loss_chunk_mem=2"],
    )
    model_dir, tok_dir = tmp_path / "wd" / "model", tmp_path / "wd" / "tokenizer"
    shared = {
        "model_dir": str(model_dir),
        "tokenizer_dir": str(tok_dir),
        "data": {"random": {"file": "x.npz"}},
        "pad_id": 0,
        "decoder_layer_cls": "Qwen2DecoderLayer",
    }
    for recipe, fp8 in (("rayft", False), ("rayft-fp8", True)):
        cmd = brc.recipe_command(recipe, "random", plan, cfg, 2, False, shared, tmp_path / recipe)
        got = load_config(cfg_file, [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"])
        assert got.train.micro_batch_size == 5 and got.train.float8 is fp8
        assert got.data.synthetic.rows == 4 * 2 * 5  # sized by the rayft runs' own micro-batch
        assert got.model.name_or_path == "qwen2-tiny"  # no shared model directory written: rayft's own seeded init
        settings = brc.recipe_settings(recipe, tmp_path / recipe, cmd, cfg_file)
        assert settings["micro_batch_size"] == 5 and settings["float8"] is fp8 and settings["fused_loss_chunk_mem"] == 2
    model_dir.mkdir(parents=True)  # a directory an earlier bench left: not this bench's, not used
    cmd = brc.recipe_command("rayft", "random", plan, cfg, 2, False, shared, tmp_path / "r1")
    assert load_config(cfg_file, [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]).model.name_or_path == "qwen2-tiny"
    shared["model_written"] = True
    cmd = brc.recipe_command("rayft", "random", plan, cfg, 2, False, shared, tmp_path / "r2")
    got = load_config(cfg_file, [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"])
    assert got.model.name_or_path == str(model_dir) and got.model.tokenizer == str(tok_dir)  # the other recipes' weights
    cmd = brc.recipe_command("sample-recipe", "random", plan, cfg, 2, False, shared, tmp_path / "s")
    assert json.loads(Path(cmd[-1]).read_text())["micro_batch_size"] == 3  # --rayft-set does not reach the others


def test_float8_check_compares_the_two_rayft_runs_step_by_step():
    def run(recipe, losses, workload="real", status="ok"):
        return {
            "recipe": recipe,
            "workload": workload,
            "status": status,
            "steps": [{"step": i + 1, "loss": v} for i, v in enumerate(losses)],
        }

    runs = [
        run("rayft", [10.0, 8.0, 6.0]),
        run("rayft-fp8", [10.1, 8.0, 6.3]),
        run("rayft", [11.0], "random"),
        run("rayft-fp8", [11.0], "random", status="failed"),
    ]
    chk = br.float8_check(runs)
    assert list(chk) == ["real"]  # random: the float8 run failed
    c = chk["real"]
    assert c["steps"] == [1, 2, 3] and c["loss_fp8"] == [10.1, 8.0, 6.3]
    assert (
        c["max_abs_diff"] == pytest.approx(0.3) and c["max_rel_diff"] == pytest.approx(0.05) and c["final_rel_diff"] == pytest.approx(0.05)
    )
    md = br.markdown_table({"figures": {"runs": [], "price": {}, "float8_check": chk}})
    assert (
        "Float8 check (real): rayft-fp8's loss vs rayft's over 3 steps: max relative difference 5.00%, at the last step 5.00% (6.0000 bf16, 6.3000 float8)."
        in md
    )


def test_a_bad_rayft_set_is_an_error_before_anything_runs(tmp_path):
    with pytest.raises(br.BenchTrainError, match=r"(?s)--rayft-set: .*train.micro_batch_size .*greater than or equal to 1"):
        bt.run_bench(
            tiny_job(tmp_path),
            recipes=["rayft"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            work_dir=tmp_path / "wd",
            rayft_overrides=["train.micro_batch_size=0"],
        )
    with pytest.raises(br.BenchTrainError, match=r"--rayft-set is for the rayft recipes \(rayft, rayft-fp8\), and none runs"):
        bt.run_bench(
            tiny_job(tmp_path),
            recipes=["sample-recipe"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            work_dir=tmp_path / "wd",
            rayft_overrides=["train.micro_batch_size=2"],
        )
    for bad, why in [
        ("train.max_steps=9", "the benchmark sets train.max_steps itself"),
        ("train.float8=true", "sets train.float8 itself"),
        ("checkpoint.storage_path=/x", "sets checkpoint.storage_path itself"),
        ("train={num_workers: 1}", "sets train itself"),
    ]:
        with pytest.raises(br.BenchTrainError, match=why):
            bt.run_bench(
                tiny_job(tmp_path),
                recipes=["rayft"],
                workloads=["random"],
                steps=3,
                warmup_steps=1,
                work_dir=tmp_path / "wd",
                rayft_overrides=[bad],
            )
    # valid alone, invalid with the rayft recipes' own data.packing=true: refused before anything runs
    with pytest.raises(br.BenchTrainError, match=r"(?s)--rayft-set: .*flash_attention_2 with data.packing needs train.micro_batch_size: 1"):
        bt.run_bench(
            tiny_job(tmp_path),
            recipes=["rayft"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            work_dir=tmp_path / "wd",
            rayft_overrides=["model.attn_implementation=flash_attention_2", "train.micro_batch_size=2"],
        )
    with pytest.raises(br.BenchTrainError, match="rayft recipe is the bf16 baseline; run float8 as the rayft-fp8 recipe"):
        bt.run_bench(tiny_job(tmp_path), ["train.float8=true"], ["rayft", "rayft-fp8"], ["random"], 3, 1, work_dir=tmp_path / "wd")
    with pytest.raises(br.BenchTrainError, match="names a recipe twice"):
        bt.run_bench(
            tiny_job(tmp_path), recipes=["rayft", "rayft"], workloads=["random"], steps=3, warmup_steps=1, work_dir=tmp_path / "wd"
        )
    with pytest.raises(br.BenchTrainError, match="--recipes is empty"):
        bt.run_bench(tiny_job(tmp_path), recipes=[], workloads=["random"], steps=3, warmup_steps=1, work_dir=tmp_path / "wd")
    for nan in ("nan", "rayft-fp8=nan", "rayft=inf"):
        with pytest.raises(br.BenchTrainError, match="not a finite number of seconds"):
            bt.parse_timeouts(nan)
    with pytest.raises(br.BenchTrainError, match="unknown recipe 'rayft-fp16'"):
        bt.run_bench(tiny_job(tmp_path), recipes=["rayft-fp16"], workloads=["random"], steps=3, warmup_steps=1, work_dir=tmp_path / "wd")


def tiny_job(tmp_path, model: str = "mistral-tiny") -> Path:
    """A 2-worker CPU bench config on random rows; mistral-tiny (a 32,768-token vocabulary) writes the
    shared model directory in a fifth of qwen2-tiny's time."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"model: {{name_or_path: {model}}}\ndata: {{synthetic: {{rows: 4}}, seq_len: 16}}\n"
        f"train: {{num_workers: 2, use_gpu: false, micro_batch_size: 1}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    return cfg


def write_steps(cmd, n=3):
    """What the sample / TRL recipes write: two ranks' step records into the spec's out_dir."""
    run_dir = Path(json.loads(Path(cmd[-1]).read_text())["out_dir"])
    for rank in (0, 1):
        (run_dir / f"steps.rank{rank}.jsonl").write_text(
            "".join(
                json.dumps({"step": s, "step_time_s": 0.5, "tokens": 16, "attn_tokens_sq": 256.0, "peak_mem_gib": None}) + "\n"
                for s in range(1, n + 1)
            )
        )


def test_results_are_written_after_every_run_and_a_runner_exception_is_one_runs_failure(tmp_path):
    out = tmp_path / "res.json"
    seen = []

    def runner(cmd, env, log, timeout_s):
        seen.append([(r["recipe"], r["status"]) for r in json.loads(out.read_text())["figures"]["runs"]])
        if "trl" in cmd:
            raise OSError("cannot start torchrun")
        write_steps(cmd)
        return 0

    path, figs = bt.run_bench(
        tiny_job(tmp_path),
        recipes=["trl-default", "sample-recipe"],
        workloads=["random"],
        steps=3,
        warmup_steps=1,
        out=out,
        work_dir=tmp_path / "wd",
        runner=runner,
    )
    # before run 1 nothing has run; before run 2 run 1's failure is on disk already
    assert seen == [[("trl-default", "not run"), ("sample-recipe", "not run")], [("trl-default", "failed"), ("sample-recipe", "not run")]]
    bad, ok = figs["runs"]
    assert bad["status"] == "failed" and "runner error: OSError('cannot start torchrun')" in bad["error"]
    assert ok["status"] == "ok" and ok["tokens_per_s_per_gpu"] == 32.0 and figs["complete"] is True
    assert ok["settings"] == brc.SAMPLE_SETTINGS and bad["settings"]["gradient_checkpointing"] is False
    assert "| sample-recipe | random | 1 | 32 |" in path.with_suffix(".md").read_text()


def test_deadline_cuts_each_runs_limit_and_skips_runs_that_cannot_fit(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(bt, "_clock", lambda: now[0])
    limits = {}

    def runner(cmd, env, log, timeout_s):
        recipe = json.loads(Path(cmd[-1]).read_text())["recipe"]
        limits[recipe] = timeout_s
        now[0] += {"sample-recipe": 100.0, "trl-default": 70.0}[recipe]  # the run's duration
        write_steps(cmd)
        return 0

    path, figs = bt.run_bench(
        tiny_job(tmp_path),
        recipes=["sample-recipe", "trl-default", "trl-best"],
        workloads=["random"],
        steps=3,
        warmup_steps=1,
        out=tmp_path / "res.json",
        work_dir=tmp_path / "wd",
        runner=runner,
        timeout_s=bt.parse_timeouts("sample-recipe=150,trl-default=120,trl-best=120"),
        deadline_s=200,
    )
    # sample: min(150, 200 - 0 - 10) = 150; trl-default: min(120, 200 - 100 - 10) = 90; trl-best: 200 - 170 - 10 = 20 s < 30: skipped
    assert limits == {"sample-recipe": 150.0, "trl-default": 90.0}
    s, d, b = figs["runs"]
    assert s["status"] == d["status"] == "ok" and s["timeout_s"] == 150.0 and d["timeout_s"] == 90.0
    assert b["status"] == "skipped: no time left" and b["error"].startswith("20 s left before --deadline-s 200")
    assert "| trl-best | random | 1 | — | — | — | — | — | skipped: no time left |" in path.with_suffix(".md").read_text()


def test_parse_timeouts():
    assert bt.parse_timeouts("300") == 300.0 and bt.parse_timeouts(None) is None
    assert bt.parse_timeouts("rayft=200, trl-best=120") == {"rayft": 200.0, "trl-best": 120.0}
    with pytest.raises(br.BenchTrainError, match="not RECIPE=SECONDS"):
        bt.parse_timeouts("rayft=200,bogus=3")
    with pytest.raises(br.BenchTrainError, match="not a number"):
        bt.parse_timeouts("rayft=fast")


def test_sigterm_writes_the_runs_done_and_marks_the_rest_not_run(tmp_path):
    import os
    import signal

    out = tmp_path / "res.json"
    before = signal.getsignal(signal.SIGTERM)

    def runner(cmd, env, log, timeout_s):
        if "trl" in cmd:  # the second run is in flight when the bench gets SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)
        write_steps(cmd)
        return 0

    with pytest.raises(bt.BenchInterrupted, match=r"after 1 of 3 runs"):
        bt.run_bench(
            tiny_job(tmp_path),
            recipes=["sample-recipe", "trl-default", "trl-best"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            out=out,
            work_dir=tmp_path / "wd",
            runner=runner,
        )
    runs = json.loads(out.read_text())["figures"]["runs"]
    assert [(r["recipe"], r["status"]) for r in runs] == [("sample-recipe", "ok"), ("trl-default", "not run"), ("trl-best", "not run")]
    assert runs[0]["tokens_per_s_per_gpu"] == 32.0
    assert "| trl-best | random | 1 | — | — | — | — | — | not run |" in out.with_suffix(".md").read_text()
    assert signal.getsignal(signal.SIGTERM) == before  # the bench's handler is removed again


def trl_spec(tmp_path, recipe="trl-best", workload="real", ac=False):
    return {
        "recipe": recipe,
        "workload": workload,
        "steps": 3,
        "micro_batch_size": 2,
        "lr": 1e-4,
        "seq_len": 64,
        "seed": 0,
        "use_gpu": False,
        "num_workers": 2,
        "decoder_layer_cls": "Qwen2DecoderLayer",
        "out_dir": str(tmp_path),
        "activation_checkpointing": ac,
    }


def test_trl_settings_gradient_checkpointing_completion_only_and_attention(tmp_path):
    from rayft.benchmarks.recipes import trl_attention, trl_config_kwargs, trl_planned_settings

    trl = pytest.importorskip("trl")
    assert (
        trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False).gradient_checkpointing is True
    )  # TRL's default: why it is set explicitly
    kw = trl_config_kwargs(trl_spec(tmp_path))
    assert kw["gradient_checkpointing"] is False and kw["completion_only_loss"] is True and kw["packing"] is True
    assert trl.SFTConfig(**kw).gradient_checkpointing is False
    assert trl_config_kwargs(trl_spec(tmp_path, ac=True))["gradient_checkpointing"] is True
    assert "completion_only_loss" not in trl_config_kwargs(trl_spec(tmp_path, workload="random"))
    # no CUDA: trl-best falls back to sdpa and is labelled so
    assert trl_attention(trl_spec(tmp_path)) == "sdpa"
    st = trl_planned_settings(trl_spec(tmp_path))
    assert st["label"] == "trl-best (sdpa)" and st["attention"] == "sdpa" and st["padding_free"] is True and st["fsdp"] == 1
    assert trl_planned_settings(trl_spec(tmp_path, recipe="trl-default"))["label"] == "trl-default"


def test_trl_compile_reaches_only_the_trl_runs_and_names_their_rows(tmp_path):
    from rayft.benchmarks.recipes import trl_config_kwargs, trl_planned_settings

    cfg_file = tiny_job(tmp_path, "qwen2-tiny")
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], ["rayft", "trl-best", "trl-default"], ["random"], 4, 1, tmp_path / "wd", None, trl_compile=True)
    shared = {
        "model_dir": str(tmp_path / "model"),
        "tokenizer_dir": str(tmp_path / "tok"),
        "data": {"random": {"file": "x.npz"}},
        "pad_id": 0,
        "decoder_layer_cls": "Qwen2DecoderLayer",
    }
    for recipe in ("trl-best", "trl-default"):
        cmd = brc.recipe_command(recipe, "random", plan, cfg, 2, False, shared, tmp_path / recipe)
        spec = json.loads(Path(cmd[-1]).read_text())
        assert spec["compile"] is True
        kw = trl_config_kwargs(spec)
        assert kw["torch_compile"] is True
        if importlib.util.find_spec("trl") is not None:  # the bench extra: TRL takes the field as given
            from trl import SFTConfig

            assert SFTConfig(**kw).torch_compile is True
        # no settings file written (a run that failed before it): the planned settings still name the compiled run
        got = brc.recipe_settings(recipe, tmp_path / recipe, cmd, cfg_file)
        assert got["compile"] is True and got["label"] == f"{recipe} + compile"
    assert trl_planned_settings(spec)["label"] == "trl-default + compile"
    assert trl_planned_settings(trl_spec(tmp_path) | {"compile": True})["label"] == "trl-best (sdpa) + compile"
    plain = brc.Plan(cfg_file, [], ["rayft", "trl-best"], ["random"], 4, 1, tmp_path / "wd", None)
    rayft_cmd = brc.recipe_command("rayft", "random", plan, cfg, 2, False, shared, tmp_path / "rayft")
    assert rayft_cmd == brc.recipe_command("rayft", "random", plain, cfg, 2, False, shared, tmp_path / "rayft")  # untouched
    cmd = brc.recipe_command("trl-best", "random", plain, cfg, 2, False, shared, tmp_path / "plain")
    spec = json.loads(Path(cmd[-1]).read_text())
    assert "torch_compile" not in trl_config_kwargs(spec)
    assert brc.recipe_settings("trl-best", tmp_path / "plain", cmd, cfg_file)["compile"] is False
    assert "label" not in brc.recipe_settings("trl-best", tmp_path / "plain", cmd, cfg_file)
    with pytest.raises(br.BenchTrainError, match=r"--trl-compile is for the TRL recipes \(trl-default, trl-best\), and none runs"):
        bt.run_bench(cfg_file, recipes=["rayft"], workloads=["random"], steps=3, warmup_steps=1, work_dir=tmp_path / "wd", trl_compile=True)


def test_trl_best_takes_varlen_attention_only_from_a_trl_that_passes_boundaries(tmp_path, monkeypatch):
    """TRL 0.24 (LLaMA-Factory 0.9.5's) passes position ids only: varlen attention would then see
    each packed row as one document, so trl-best runs sdpa there."""
    from rayft.benchmarks import recipes
    from rayft.train import attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(attention, "resolve_attn_implementation", lambda name, device: attention.VARLEN)
    gpu = trl_spec(tmp_path) | {"use_gpu": True}
    monkeypatch.setattr(recipes, "trl_passes_boundaries", lambda: False)
    assert recipes.trl_attention(gpu) == "sdpa"
    monkeypatch.setattr(recipes, "trl_passes_boundaries", lambda: True)
    assert recipes.trl_attention(gpu) == attention.VARLEN
    if importlib.util.find_spec("trl") is None:
        monkeypatch.undo()
        assert recipes.trl_passes_boundaries() is False  # no TRL: no boundaries


def test_varlen_attention_reads_trl_padding_free_kwargs(monkeypatch):
    """TRL's padding-free collator passes cu_seq_lens_q / max_length_q; rayft's own cu_seq_lens path keeps max = L."""
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    from rayft.train import attention

    calls = []

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls.append((cu_q.tolist(), cu_k.tolist(), max_q, max_k))
        return q

    monkeypatch.setattr(varlen, "varlen_attn", fake)
    q = torch.randn(1, 4, 7, 8)
    k = v = torch.randn(1, 2, 7, 8)
    cu = torch.tensor([0, 3, 5, 7], dtype=torch.int32)
    out, _ = attention.varlen_attention_forward(None, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=3, max_length_k=3)
    assert calls[-1] == ([0, 3, 5, 7], [0, 3, 5, 7], 3, 3) and out.shape == (1, 7, 4, 8)
    attention.varlen_attention_forward(None, q, k, v, None, cu_seq_lens=cu)  # rayft's path: unchanged
    assert calls[-1] == ([0, 3, 5, 7], [0, 3, 5, 7], 7, 7)
    n_calls = len(calls)
    out, _ = attention.varlen_attention_forward(None, q, k, v, None, scaling=0.3)  # no boundaries: plain causal rows
    assert len(calls) == n_calls and out.shape == (1, 7, 4, 8)  # SDPA, not the varlen kernel
    kk, vv = (t.repeat_interleave(2, dim=1) for t in (k, v))
    scores = (q @ kk.transpose(-1, -2)) * 0.3
    scores = scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    want = (scores.softmax(-1) @ vv).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_shared_model_is_rayfts_seeded_init_built_once(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rayft.train.model import load_full_state_dict, load_model_config

    cfg_file = tiny_job(tmp_path, "qwen2-tiny")  # tied embeddings: the LM head has no tensor of its own
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], ["sample-recipe"], ["random"], 3, 1, tmp_path / "wd", None)
    plan.work_dir.mkdir()
    from rayft.train import preset_init

    built = []
    real = preset_init.unit_state
    monkeypatch.setattr(preset_init, "unit_state", lambda model, prefix, *a: built.append(prefix) or real(model, prefix, *a))
    from rich.console import Console

    shared = brc.prepare_model_and_data(cfg, plan, 2, Console(quiet=True))
    # one init: each unit with tensors of its own built once (the tied LM head has none)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(load_model_config(cfg.model, "sdpa"))
    assert built == [p for p, u in preset_init.init_units(meta) if preset_init.unit_tensor_names(meta, p, u)]
    assert built == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"]
    saved = load_file(str(Path(shared["model_dir"]) / "model.safetensors"))
    want = load_full_state_dict(cfg.model, load_model_config(cfg.model, "sdpa"), cfg.train.seed)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(saved[name].float(), want[name])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f.update(
            float8_check={"real": {"steps": [], "loss_bf16": [], "loss_fp8": [], "max_rel_diff": 0.1, "final_rel_diff": 0.1}}
        ),
        lambda f: f.update(float8_check=[1, 2]),
        lambda f: f.update(float8_check={"real": None}),
        lambda f: f.update(
            float8_check={"real": {"steps": [1], "loss_bf16": [1.0], "loss_fp8": [1.0], "max_rel_diff": "0.1", "final_rel_diff": 0.1}}
        ),
        lambda f: f["runs"][0].update(excluding_report=[1]),
        lambda f: f["runs"][0].update(excluding_report={"tokens_per_s_per_gpu": "x", "report_s_median": 1.0}),
    ],
)
def test_table_names_the_file_for_malformed_new_fields(tmp_path, mutate):
    res = synthetic_results(tmp_path / "r.json")
    doc = json.loads(res.read_text())
    mutate(doc["figures"])
    res.write_text(json.dumps(doc))
    out = CliRunner().invoke(app, ["bench", "table", str(res)])
    assert out.exit_code == 1
    assert f"{res}: not a `rayft bench train` results file" in " ".join(out.output.split()) and "Traceback" not in out.output


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda runs: runs[1].pop("status"), r"figures.runs\[1\]: no 'status' field"),
        (lambda runs: runs[0].update(step_time_s=[0.3]), r"figures.runs\[0\]: TypeError: list indices"),
        (
            lambda runs: runs[0].update(tokens_per_s_per_gpu="fast"),
            r"figures.runs\[0\]: tokens_per_s_per_gpu must be a positive finite number, got 'fast'",
        ),
        (
            lambda runs: runs[0].update(tokens_per_s_per_gpu_window=-1.0),
            r"figures.runs\[0\]: tokens_per_s_per_gpu_window must be a positive number, got -1.0",
        ),
        (
            lambda runs: runs[0].update(steps=[{"step": 9, "step_time_s": 0, "tokens": 5}]),
            r"figures.runs\[0\]: step 9: step_time_s must be a positive",
        ),
        (lambda runs: runs.append(["not", "a", "run"]), r"figures.runs\[2\]: TypeError: list indices"),
        (
            lambda runs: runs[0].update(tokens_per_s_per_gpu=10**400),
            r"figures.runs\[0\]: tokens_per_s_per_gpu must be a positive finite number, got 1000",
        ),
        (
            lambda runs: runs[0].update(tokens_per_s_per_gpu=float("nan")),
            r"figures.runs\[0\]: tokens_per_s_per_gpu must be a positive finite number, got nan",
        ),
        (lambda runs: runs[0].update(mfu=-3), r"figures.runs\[0\]: mfu must be a non-negative finite number or null, got -3"),
        (
            lambda runs: runs[0]["step_time_s"].update(p50=float("inf")),
            r"figures.runs\[0\]: step_time_s.p50 must be a positive finite number, got inf",
        ),
        (lambda runs: runs[0].update(recipe=["a"], label=None), r"figures.runs\[0\]: recipe must be a string, got \['a'\]"),
        (lambda runs: runs[1].update(status=1), r"figures.runs\[1\]: status must be a string, got 1"),
    ],
)
def test_table_errors_name_the_run(tmp_path, mutate, message):
    doc = json.loads(synthetic_results(tmp_path / "r.json").read_text())
    mutate(doc["figures"]["runs"])
    with pytest.raises(ValueError, match=message):
        br.markdown_table(doc)


def test_table_command_writes_the_good_files_when_one_is_bad(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"figures": {"runs": [{"recipe": "rayft", "workload": "random"}]}}))
    good = synthetic_results(tmp_path / "good.json")
    out = CliRunner().invoke(app, ["bench", "table", str(bad), str(good)], env={"COLUMNS": "500"})  # no wrap inside the long tmp paths
    text = " ".join(out.output.split())
    assert out.exit_code == 1
    assert f"{bad}: not a `rayft bench train` results file (ValueError: figures.runs[0]: no 'status' field)" in text
    assert "| rayft | random | 16 | 43,272 |" in (tmp_path / "good.md").read_text()  # the file after the bad one is still written
    assert not (tmp_path / "bad.md").exists()
    assert f"1 of 2 results files not tabulated: {bad}" in text


def test_markdown_table_whole_output():
    """Every part of a table at once, pinned (it was byte-identical before and after the per-run
    refactor). By hand: rayft's whole window is 3 × 65,536 tokens ÷ (0.6 + 0.7 + 0.6) s ÷ 2 GPUs = 51,739."""
    st = {"p10": 0.37, "p50": 0.38, "p90": 0.4, "min": 0.3, "max": 0.5}
    doc = {
        "git_commit": "abcdef1234567890",
        "environment": {"gpu_model": "NVIDIA H200"},
        "figures": {
            "model": "qwen2.5-1.5b",
            "seq_len": 2048,
            "micro_batch_size": 8,
            "world_size": 2,
            "steps": 4,
            "warmup_steps": 1,
            "price": {
                "usd_per_gpu_hour": 4.9,
                "instance": "p5en.48xlarge",
                "instance_usd_per_hour": 39.2,
                "gpus_per_instance": 8,
                "source": "catalog",
                "date": "2026-11-30",
            },
            "float8_check": {
                "random": {
                    "steps": [1, 2],
                    "loss_bf16": [2.0, 1.5],
                    "loss_fp8": [2.0, 1.501],
                    "max_rel_diff": 0.000667,
                    "final_rel_diff": 0.000667,
                }
            },
            "runs": [
                {
                    "recipe": "rayft",
                    "label": "rayft (mb 16)",
                    "workload": "random",
                    "status": "ok",
                    "tokens_per_s_per_gpu": 53009.4,
                    "mfu": 0.553,
                    "peak_mem_gib": 76.8,
                    "step_time_s": st,
                    "usd_per_1m_tokens": 0.0257,
                    "micro_batch_size": 16,
                    "settings": {"compile": True, "chunk": 8},
                    "steps": [{"step": s, "step_time_s": t, "tokens": 65536} for s, t in ((1, 9.0), (2, 0.6), (3, 0.7), (4, 0.6))],
                },
                {
                    "recipe": "sample-recipe",
                    "workload": "random",
                    "status": "ok",
                    "tokens_per_s_per_gpu": 8143.0,
                    "mfu": None,
                    "peak_mem_gib": None,
                    "step_time_s": st,
                    "usd_per_1m_tokens": None,
                    "tokens_per_s_per_gpu_window": 8000.5,
                    "excluding_report": {"tokens_per_s_per_gpu": 37323.0, "report_s_median": 1.57, "mfu": 0.39},
                },
                {
                    "recipe": "trl-best",
                    "workload": "real",
                    "status": "failed",
                    "error": "exit 124 (time limit 130 s)\nTraceback",
                    "settings": {"packing": True},
                },
            ],
        },
    }
    assert br.markdown_table(doc).split("\n") == [
        "| recipe | workload | micro-batch | tokens/s/GPU | MFU | peak GiB | step s p10 / p50 / p90 | USD / 1M tokens | status |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
        "| rayft (mb 16) | random | 16 | 53,009 | 55.3% | 76.8 | 0.370 / 0.380 / 0.400 | 0.0257 | ok |",
        "| sample-recipe | random | 8 | 8,143 | — | — | 0.370 / 0.380 / 0.400 | — | ok |",
        "| trl-best | real | 8 | — | — | — | — | — | failed: exit 124 (time limit 130 s) |",
        "",
        "- rayft (mb 16) × random: compile True, chunk 8",
        "- trl-best × real: packing True",
        "",
        "2 × NVIDIA H200, model qwen2.5-1.5b, seq 2048, micro-batch 8 rows/GPU unless the table says otherwise, 4 steps (median over steps after 1); tokens = non-padding tokens; commit abcdef123456.",
        "The measured steps as a whole (their tokens ÷ their summed time; slow steps count in full): rayft (mb 16) × random 51,739, sample-recipe × random 8,000 tokens/s/GPU.",
        "sample-recipe × random without its per-step `ray.train.report` (median 1.57 s a call, part of every step above): 37,323 tokens/s/GPU, MFU 39.0%.",
        "Float8 check (random): rayft-fp8's loss vs rayft's over 2 steps: max relative difference 0.07%, at the last step 0.07% (1.5000 bf16, 1.5010 float8).",
        "Cost: p5en.48xlarge $39.2/h ÷ 8 GPUs = $4.9 per GPU-hour (catalog, 2026-11-30).",
    ]


def test_table_cells_keep_their_column(tmp_path):
    doc = json.loads(synthetic_results(tmp_path / "r.json").read_text())
    doc["figures"]["runs"][0].update(recipe="ray|ft", workload="ran\ndom")
    row = br.markdown_table(doc).splitlines()[2]
    assert row.startswith("| ray\\|ft | ran dom | 16 | 43,272 |") and row.count(" | ") == 8


def test_table_command_survives_overflow_and_deep_nesting(tmp_path):
    over = tmp_path / "over.json"
    over.write_text(synthetic_results(tmp_path / "x.json").read_text().replace("43272.4", "1" + "0" * 400))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    good = synthetic_results(tmp_path / "good.json")
    out = CliRunner().invoke(app, ["bench", "table", str(over), str(deep), str(good)], env={"COLUMNS": "500"})
    text = " ".join(out.output.split())
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert (
        f"{over}: not a `rayft bench train` results file (ValueError: figures.runs[0]: tokens_per_s_per_gpu must be a positive finite"
        in text
    )
    assert f"{deep}: not a `rayft bench train` results file (RecursionError" in text
    assert (tmp_path / "good.md").exists() and not (tmp_path / "over.md").exists() and not (tmp_path / "deep.md").exists()
    assert f"2 of 3 results files not tabulated: {over}, {deep}" in text

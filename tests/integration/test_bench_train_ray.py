"""rayft bench train recipes on CPU workers (gloo) with the mistral-tiny preset (a 32,768-token
vocabulary: a quarter of qwen2-tiny's output-layer work per step; what is counted here does not
depend on the model): per-step token counts of sample-recipe (one worker; on real rows where ../shared
is present, else random), the rayft recipe's command and its planned rows (no run: its loop is the
main job's), and trl-default under torchrun.
Heavier than the unit tests (~1 min in all on 2 cores): marked integration."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br
from rayft.benchmarks.recipes import load_dataset, padded_batch, rank_rows, run_sample
from rayft.config_load import load_config

pytestmark = pytest.mark.integration
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def inputs(tmp_path, workloads, recipes=("sample-recipe",), seq_len=64):
    if "real" in workloads and not (SHARED / "alpaca_en_demo.json").exists():
        pytest.skip(f"needs {SHARED}/alpaca_*_demo.json (the project's ../shared folder)")
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: mistral-tiny}\n"
        f"data: {{train_files: [{SHARED}/alpaca_en_demo.json, {SHARED}/alpaca_zh_demo.json], format: alpaca, seq_len: {seq_len}, max_examples: 12, cache_dir: null}}\n"
        f"train: {{num_workers: 2, use_gpu: false, micro_batch_size: 2, lr: 1.0e-4}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], list(recipes), list(workloads), 3, 1, tmp_path / "wd", None)
    plan.work_dir.mkdir()
    shared = brc.prepare_model_and_data(cfg, plan, 2, Console(quiet=True))
    from rayft.data.tokenizer import load_tokenizer

    shared["pad_id"] = load_tokenizer(shared["tokenizer_dir"]).pad_token_id  # as `rayft bench train` sets it
    return cfg, plan, shared


def spec_of(cmd):
    return json.loads(Path(cmd[-1]).read_text())


# One run of the sample recipe (a Ray Train run costs ~30 CPU-s of CI on 2 cores): on real rows, whose
# padded counts are the stricter check, where ../shared is present (CI has it); else on random rows.
# Both workloads' rows are unit-tested without Ray (tests/unit/test_bench_train.py).
SAMPLE_WORKLOAD = "real" if (SHARED / "alpaca_en_demo.json").exists() else "random"


def test_sample_recipe_steps_and_token_counts(ray_local, tmp_path, workload=SAMPLE_WORKLOAD):
    """One worker (the sample's FSDP1 over one gloo rank): what is checked is the recipe's steps and
    its token counts; how a step's rows are dealt out to several ranks (``rank_rows``) and how the
    ranks' records merge are unit-tested (tests/unit/test_bench_train.py). A second worker cost
    ~10 CPU-s of CI."""
    L = 64 if workload == "random" else 256  # real: alpaca rows shorter than 256 tokens get padding
    cfg, plan, shared = inputs(tmp_path, [workload], seq_len=L)
    spec = spec_of(brc.recipe_command("sample-recipe", workload, plan, cfg, 1, False, shared, tmp_path / "run"))
    run_sample(spec)
    recs = br.read_step_files(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3]
    ds = load_dataset(spec["data"])
    for s, r in enumerate(recs):
        rows = rank_rows(len(ds), s, 2, 0, 1)  # 1 worker × micro-batch 2
        want = padded_batch(ds, rows, L, shared["pad_id"])["tokens"]
        if workload == "random":
            assert want == 2 * 64  # 2 full rows of seq_len per step
        else:
            assert want == sum(min(L, int(ds.lengths()[i])) for i in rows) and want < 2 * L  # padded rows
        assert r["tokens"] == want and r["step_time_s"] > 0
    losses = [json.loads(x)["loss"] for x in (tmp_path / "run" / "steps.rank0.jsonl").read_text().splitlines()]
    assert all(abs(v - math.log(32768)) < 1.5 for v in losses)  # ≈ ln(32768) = 10.4 for the random-init tiny model


def test_rayft_recipe_on_synthetic_rows(tmp_path):
    """The rayft recipe's command is rayft's own `rayft train` with --set options: what is checked here
    is that they load and give the planned rows (3 steps × 1 worker × 2 full rows of 64 tokens). The run
    itself is not started: its loop is the main job's, whose per-step token counts the main run checks
    (tests/integration/test_train_ray.py), and a Ray Train run costs ~45 CPU-s of CI on 2 cores."""
    from rayft.train.driver import load_run_data
    from rayft.train.step_plan import make_plan

    cfg, plan, shared = inputs(tmp_path, ["random"], recipes=("rayft",))
    cmd = brc.recipe_command("rayft", "random", plan, cfg, 1, False, shared, tmp_path / "run")
    assert cmd[1:4] == ["-m", "rayft.cli", "train"] and cmd[4] == str(plan.config)
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert "data.synthetic={rows: 6, seed: 0}" in sets and "train.compile=true" in sets  # 3 steps × 1 worker × 2 rows
    assert "train.num_workers=1" in sets and "train.grad_accum_steps=1" in sets
    assert "checkpoint.save_final=false" in sets  # a benchmark writes no 18 GB final checkpoint
    run_cfg = load_config(plan.config, sets)
    assert run_cfg.checkpoint.storage_path == str(tmp_path / "run") and run_cfg.checkpoint.name == "rayft"
    ds = load_run_data(run_cfg, Console(quiet=True)).train
    assert len(ds) == 6 and ds.lengths().tolist() == [64] * 6
    steps = make_plan(run_cfg, ds, 1)
    rows = [steps.step_rows(s) for s in range(len(steps))]
    assert [len(r) for r in rows] == [2, 2, 2] and all(len(row) == 1 for r in rows for row in r)  # 2 rows of one example a step
    assert sorted(row[0] for r in rows for row in r) == list(range(6))  # each example once


def test_trl_default_under_torchrun(tmp_path):
    pytest.importorskip("trl", reason="trl is not installed (pip install 'rayft[bench]')")
    cfg, plan, shared = inputs(tmp_path, ["random"], recipes=("trl-default",))
    cmd = brc.recipe_command("trl-default", "random", plan, cfg, 2, False, shared, tmp_path / "run")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = br.read_step_files(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3] and all(r["tokens"] == 4 * 64 for r in recs)
    used = json.loads((tmp_path / "run" / "settings.json").read_text())  # what the run reports it used
    assert used["label"] == "trl-default" and used["attention"] == "sdpa" and used["gradient_checkpointing"] is False
    assert used["padding_free"] is False and used["fsdp"] == 1
    st = brc.recipe_settings("trl-default", tmp_path / "run", cmd, plan.config)
    assert st == used

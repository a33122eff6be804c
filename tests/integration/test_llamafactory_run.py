"""The ``llamafactory`` recipe of `rayft bench train` run for real on CPU: LLaMA-Factory 0.9.5's SFT
stage on the qwen2-tiny preset for 3 steps, on the bench's random and real rows, one process
(LLaMA-Factory's Ray launcher needs GPUs; the recipe runs its workflow in-process on CPU). Skipped
where LLaMA-Factory is not installed (CI does not install it: it pins trl <= 0.24 and datasets
<= 4.0, below the TRL recipes' pins)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br
from rayft.benchmarks.llamafactory_recipe import pack_capacity
from rayft.benchmarks.recipes import load_dataset
from rayft.config_load import load_config

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("llamafactory") is None,
        reason="llamafactory is not installed (pip install llamafactory==0.9.5; see the module doc of rayft.benchmarks.llamafactory_recipe)",
    ),
]
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SEQ = {"random": 64, "real": 256}  # real: several alpaca examples per packed row


def inputs(tmp_path, workload):
    if workload == "real" and not (SHARED / "alpaca_en_demo.json").exists():
        pytest.skip(f"needs {SHARED}/alpaca_*_demo.json (the project's ../shared folder)")
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        f"data: {{train_files: [{SHARED}/alpaca_en_demo.json, {SHARED}/alpaca_zh_demo.json], format: alpaca, seq_len: {SEQ[workload]}, max_examples: 24, cache_dir: null}}\n"
        f"train: {{num_workers: 1, use_gpu: false, micro_batch_size: 2, lr: 1.0e-4, activation_checkpointing: false}}\n"
        f"checkpoint: {{storage_path: {tmp_path}}}\n"
    )
    cfg = load_config(cfg_file)
    plan = brc.Plan(cfg_file, [], ["llamafactory"], [workload], 3, 1, tmp_path / "wd", None)
    plan.work_dir.mkdir()
    shared = brc.prepare_model_and_data(cfg, plan, 1, Console(quiet=True))
    from rayft.data.tokenizer import load_tokenizer

    shared["pad_id"] = load_tokenizer(shared["tokenizer_dir"]).pad_token_id  # as `rayft bench train` sets it
    return cfg, plan, shared


@pytest.mark.parametrize("workload", ["random", "real"])
def test_llamafactory_recipe_runs_three_steps_on_cpu(tmp_path, workload):
    datasets = pytest.importorskip("datasets")
    cfg, plan, shared = inputs(tmp_path, workload)
    run_dir = tmp_path / "run"
    cmd = brc.recipe_command("llamafactory", workload, plan, cfg, 1, False, shared, run_dir)
    assert cmd[:3] == [sys.executable, "-m", "rayft.benchmarks.llamafactory_recipe"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]

    recs = br.read_step_files(run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["step_time_s"] > 0 and r["peak_mem_gib"] is None for r in recs)
    raw = [json.loads(x) for x in (run_dir / "steps.rank0.jsonl").read_text().splitlines()]
    assert all(isinstance(r["loss"], float) and r["loss"] > 0 for r in raw)
    L = SEQ[workload]
    if workload == "random":  # one example of seq_len - 1 tokens per packed row, 2 rows per step
        assert all(r["tokens"] == 2 * (L - 1) and r["attn_tokens_sq"] == 2 * (L - 1) ** 2 for r in recs)
    # the rows LLaMA-Factory got (its sampler shuffles them): each step trained two of them
    rows = datasets.load_from_disk(str(run_dir / "llamafactory" / "rows"))
    assert len(rows[0]["input_ids"]) == L
    lengths = [[row.count(k) for k in range(1, max(row) + 1)] for row in rows["attention_mask"]]
    stats = [(sum(d), sum(n * n for n in d)) for d in lengths]
    pairs = {(a[0] + b[0], float(a[1] + b[1])) for i, a in enumerate(stats) for b in stats[i + 1 :]}
    assert all((r["tokens"], r["attn_tokens_sq"]) in pairs for r in recs)
    ds = load_dataset(shared["data"][workload]["file"])
    assert sum(map(sum, lengths)) == sum(min(int(n), pack_capacity(L)) for n in ds.lengths())  # every example, cut
    if workload == "real":
        assert max(map(len, lengths)) > 1  # rows of several examples

    used = json.loads((run_dir / "settings.json").read_text())  # rank 0's report
    assert used["attention"] == "sdpa" and used["liger"] is False and used["gradient_checkpointing"] is False
    assert used["use_ray"] is False and used["world_size"] == 1 and used["bf16"] is False
    given = json.loads((run_dir / "llamafactory_args.json").read_text())  # what LLaMA-Factory was given
    assert given["versions"]["llamafactory"] == "0.9.5"
    assert given["args"]["neat_packing"] is True and given["args"]["cutoff_len"] == L and given["args"]["stage"] == "sft"
    assert brc.recipe_settings("llamafactory", run_dir, cmd, plan.config) == used

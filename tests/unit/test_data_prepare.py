"""`rayft data prepare`: the token store written ahead of training, with the report lines; what
`rayft train` then runs to load its data (load_run_data) opens the store and tokenizes nothing."""

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rayft.cli import app
from rayft.config_load import load_config

RECORDS = [{"instruction": f"Add {a} and {b}.", "output": f"{a + b}"} for a, b in [(1, 2), (30, 4), (7, 7), (12, 50), (9, 0), (3, 3)]] + [
    {"text": "A raw web document. " * 60}
]


def job(tmp_path, cache="cache"):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + '{"instruction": "no output"}\n')
    f = tmp_path / "job.yaml"
    f.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        f"data: {{train_files: [data.jsonl], seq_len: 128, on_bad_record: skip, validation_fraction: 0.2, cache_dir: {cache}}}\n"
        "train: {num_workers: 1, use_gpu: false}\n"
    )
    return f


def test_prepare_then_train_tokenizes_nothing(tmp_path, monkeypatch):
    cfg_file = job(tmp_path, tmp_path / "cache")
    res = CliRunner().invoke(app, ["data", "prepare", str(cfg_file)])
    assert res.exit_code == 0, res.output
    out = [line for line in res.output.splitlines() if line]  # the transient progress bar leaves a blank line
    (store,) = (tmp_path / "cache").iterdir()
    data_file = tmp_path / "data.jsonl"
    assert out[:2] == [
        "data: skipped 1 bad record(s) of 8 (data.on_bad_record: skip):",
        f"  missing_field: 1 (first: {data_file}:8: missing field 'output')",
    ]
    assert out[2].startswith("data: 6 records (5 conversations, 1 text documents) → ")
    assert out[3].startswith("validation (data.validation_fraction=0.2 of the training records, seed 0): 1 records → 1 examples")
    assert out[4:] == [
        f"data: every skipped record's location and reason: {store}/skipped_records.jsonl",
        f"data: wrote the tokenized store {store}",
        f"data: token store {store}: 8 training examples and 1 validation examples; rayft train {cfg_file} uses it without tokenizing",
    ]
    assert [json.loads(line)["where"] for line in (store / "skipped_records.jsonl").read_text().splitlines()] == [f"{data_file}:8"]
    mtimes = {p: p.stat().st_mtime_ns for p in store.rglob("*")}

    import rayft.data.tokenize
    from rayft.train.driver import load_run_data

    calls = []
    real = rayft.data.tokenize.tokenize_example
    monkeypatch.setattr(rayft.data.tokenize, "tokenize_example", lambda *a, **k: calls.append(1) or real(*a, **k))
    console = Console(record=True, width=400)
    d = load_run_data(load_config(cfg_file), console)  # what `rayft train` runs before Ray starts its workers
    assert calls == [] and d.cache == "hit" and (len(d.train), len(d.validation)) == (8, 1)
    assert console.export_text().splitlines() == [*out[:5], f"data: used the tokenized store {store} (no file read or tokenized)"]
    assert {p: p.stat().st_mtime_ns for p in store.rglob("*")} == mtimes
    # the counter is real: another seq_len is another store, tokenized
    load_run_data(load_config(cfg_file, ["data.seq_len=48"]), Console(quiet=True))
    assert len(calls) == 7


def test_prepare_needs_a_cache_dir_and_reports_bad_data(tmp_path):
    res = CliRunner().invoke(app, ["data", "prepare", str(job(tmp_path, "null"))])
    assert (
        res.exit_code == 2 and "error: data.cache_dir is null: rayft data prepare writes the token store under data.cache_dir" in res.output
    )
    cfg_file = job(tmp_path, tmp_path / "cache")
    res = CliRunner().invoke(app, ["data", "prepare", str(cfg_file), "--set", "data.on_bad_record=error"])
    assert res.exit_code == 1 and f"error: {tmp_path / 'data.jsonl'}:8: missing field 'output'" in res.output
    assert not any((tmp_path / "cache").glob("*/manifest.json"))


@pytest.mark.parametrize("extra", ["data.synthetic={rows: 4}"])
def test_prepare_refuses_synthetic_data(tmp_path, extra):
    res = CliRunner().invoke(
        app,
        ["data", "prepare", str(job(tmp_path)), "--set", "data.train_files=[]", "--set", "data.validation_fraction=null", "--set", extra],
    )
    assert res.exit_code == 2 and "data.synthetic has nothing to prepare" in res.output


def test_a_node_local_cache_dir_on_a_multi_node_cluster(monkeypatch):
    """rayft train puts the store under the run directory (checkpoint storage every node sees), with a
    note; with that storage node-local too, it refuses, naming data.cache_dir."""
    import rayft.train.ray_cluster as rc
    from rayft.config import RayftConfig
    from rayft.train.errors import TrainError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = RayftConfig.model_validate(
        {
            "data": {"train_files": ["x.jsonl"], "cache_dir": "/local/cache"},
            "ray": {"address": "10.0.0.1:6379"},
            "checkpoint": {"storage_path": "/fsx/runs"},
        }
    )
    blind = {"/local/cache": ["10.0.0.2"], "/fsx/runs": []}
    monkeypatch.setattr(rc, "nodes_missing_storage", lambda p: blind[p])
    said, connected = [], []
    assert rc.shared_store_root(cfg, "/local/cache", "/fsx/runs/r1", lambda: connected.append(1), said.append) == "/fsx/runs/r1/tokenized"
    assert connected == [1] and said == [
        "data: data.cache_dir=/local/cache is node-local (Ray nodes 10.0.0.2 cannot see it): the token store goes under the run "
        "directory, /fsx/runs/r1/tokenized; set data.cache_dir to a shared path or an s3:// URI to reuse it across runs"
    ]
    assert rc.shared_store_root(cfg, "s3://b/cache", "/fsx/runs/r1", None, said.append) == "s3://b/cache"
    blind["/fsx/runs"] = ["10.0.0.2"]
    with pytest.raises(TrainError, match=r"checkpoint.storage_path=/fsx/runs is node-local: Ray nodes 10.0.0.2 cannot see it"):
        rc.shared_store_root(cfg, "/local/cache", "/fsx/runs/r1", lambda: None, said.append)
    local = RayftConfig.model_validate({"data": {"train_files": ["x.jsonl"]}})  # the embedded Ray: one node, nothing to check
    assert rc.shared_store_root(local, "/local/cache", "/runs/r1", None, said.append) == "/local/cache"

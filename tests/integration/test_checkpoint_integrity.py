"""Checkpoint digests end to end on a real embedded Ray with 2 CPU workers: 1 MiB of random bytes
written into the middle of one DCP shard (its size unchanged) is found by `rayft checkpoint
verify`, refused by `rayft export`, and skipped by `--resume`, whose losses then equal the
uninterrupted run's."""

import hashlib
import json
import os
import shutil
import time

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.config import load_config
from rayft.train.checkpoint import CheckpointError, export_run, find_checkpoints
from rayft.train.driver import run_training

pytestmark = pytest.mark.integration

RECORDS = [
    {"messages": [{"role": "user", "content": f"What is {a} times {b}?"}, {"role": "assistant", "content": f"{a} times {b} is {a * b}."}]}
    for a in range(2, 5)
    for b in range(3, 7)
]  # 12 conversations: with 8 rows a step, each epoch is one full step and one short (uneven) step


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("integrity")
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return d


def config(workdir, name):
    f = workdir / "job.yaml"
    f.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        "data: {train_files: [chat.jsonl], seq_len: 64, packing: false, seed: 3}\n"
        "train: {num_workers: 2, use_gpu: false, micro_batch_size: 2, grad_accum_steps: 2, epochs: 4, lr: 3.0e-3, seed: 1}\n"
        f"checkpoint: {{storage_path: {workdir / 'runs'}, every_steps: 2, keep_last: 3, export_hf: false}}\n"
    )
    return load_config(f, [f"checkpoint.name={name}"])


def losses(run):
    return {h["step"]: h["loss"] for h in map(json.loads, (run / "rayft_metrics.jsonl").read_text().splitlines())}


def blake2b_of(path):
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


@pytest.fixture(scope="module")
def baseline(ray_local, workdir):
    run_training(config(workdir, "base"))
    run = workdir / "runs" / "base"
    assert [s for s, _ in find_checkpoints(run)] == [4, 6, 8]
    return losses(run)


@pytest.fixture(scope="module")
def corrupted(baseline, workdir):
    """A copy of the uninterrupted run (without Ray's bookkeeping of its name) whose last
    checkpoint has 1 MiB of random bytes in the middle of its largest shard: (run, shard, the
    recorded digest, the shard's digest now)."""
    run = workdir / "runs" / "corrupt"
    shutil.copytree(workdir / "runs" / "base", run)
    (run / "checkpoint_manager_snapshot.json").unlink()
    shard = max((run / "checkpoint_0000008").glob("*.distcp"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.seek(size // 2 - (1 << 19))
        f.write(os.urandom(1 << 20))
    assert shard.stat().st_size == size
    expected = json.loads((shard.parent / "rayft_state.json").read_text()).get("digests", {}).get(shard.name)
    got = blake2b_of(shard)
    assert got != expected
    return run, shard, expected, got


def test_every_checkpoint_records_the_digest_of_each_of_its_files(baseline, workdir):
    ckpt = workdir / "runs" / "base" / "checkpoint_0000008"
    state = json.loads((ckpt / "rayft_state.json").read_text())
    files = sorted(p.name for p in ckpt.iterdir() if p.name != "rayft_state.json")
    assert files == sorted([".metadata", "config.json", *(f"__{r}_{i}.distcp" for r in (0, 1) for i in range(8))])
    assert state["digest_algorithm"] == "blake2b-128"
    assert state["digests"] == {name: blake2b_of(ckpt / name) for name in files}  # both ranks' shards, gathered by rank 0


def test_verify_names_the_corrupt_shard(corrupted, capsys):
    run, shard, expected, got = corrupted
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(run)])
    took = time.perf_counter() - t0
    assert res.exit_code == 1
    assert res.stdout.splitlines() == [
        "step 4 (checkpoint_0000004): intact (18 files match their blake2b-128 digests)",
        "step 6 (checkpoint_0000006): intact (18 files match their blake2b-128 digests)",
        f"step 8 (checkpoint_0000008): corrupt: {shard.name} expected {expected}, got {got}",
    ]
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(run), "--step", "6"])
    assert res.exit_code == 0 and res.stdout.startswith("step 6 (checkpoint_0000006): intact")
    with capsys.disabled():
        print(f"\n[timing] rayft checkpoint verify of 3 qwen2-tiny checkpoints: {took:.2f} s")


def test_export_refuses_the_corrupt_checkpoint(corrupted):
    run, shard, expected, got = corrupted
    message = f"checkpoint 8 is corrupt ({shard}: expected blake2b-128 {expected}, got {got})"
    with pytest.raises(CheckpointError) as e:
        export_run(str(run))
    assert str(e.value) == message
    res = CliRunner().invoke(app, ["export", str(run)])
    assert res.exit_code == 1 and message in " ".join(res.stderr.split())
    assert not (run / "hf-step8").exists()


def test_resume_falls_back_to_the_newest_intact_checkpoint(corrupted, baseline, workdir, capfd):
    run, shard, expected, got = corrupted
    summary = run_training(config(workdir, "corrupt"), resume=str(run))
    err = " ".join(capfd.readouterr().err.split())  # the console may wrap long lines
    assert summary["resumes"][0]["step"] == 6
    assert f"warning: checkpoint 8 is corrupt ({shard}: expected blake2b-128 {expected}, got {got}): skipping it" in err
    assert "from its checkpoint of step 6" in err
    got_losses = losses(run)
    assert sorted(got_losses) == list(range(1, 9))
    for step in range(1, 9):
        assert got_losses[step] == pytest.approx(baseline[step], abs=1e-5), step
    # the resumed run wrote its step-8 checkpoint afresh: every checkpoint is intact again
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(run)])
    assert res.exit_code == 0 and res.stdout.count(": intact (") == 3

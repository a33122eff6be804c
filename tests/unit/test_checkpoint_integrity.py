"""Checkpoint digests on real DCP checkpoints written in-process (a one-rank gloo group): recorded
while writing, checked before a resume or an export, old state files accepted as unverifiable,
partial directories of failed saves removed, and the free-space warning."""

import errno
import hashlib
import io
import json
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rich.console import Console
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from transformers import PretrainedConfig
from typer.testing import CliRunner

from rayft.cli import app
from rayft.train.checkpoint import (
    CheckpointError,
    async_save_shards,
    load_sharded,
    resolve_resume_dir,
    save_shards,
    verify_run,
    write_state,
)
from rayft.train.checkpoint_files import (
    checkpoint_dirs,
    directory_bytes,
    free_space_warning,
    last_checkpoint_bytes,
    newest_intact,
    verify_checkpoint,
)
from rayft.train.errors import TrainError
from rayft.train.hashing_writer import HashingFileSystemWriter
from rayft.train.run_dir import prepare_run_dir


def model_and_optimizer(seed: int):
    """A small real model (two 1024² layers: 8 MiB of fp32 weights) with one AdamW step's state."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    return model, opt


def write_checkpoint(run: Path, step: int, seed: int = 0, digests: bool = True, threads: int = 3) -> Path:
    """A real checkpoint directory as CheckpointWriter writes it: DCP shards through the hashing
    writer, then config.json and the state file (without digests: as an earlier rayft wrote it)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = run / f"checkpoint_{step:07d}"
    model, opt = model_and_optimizer(seed)
    msd, osd = get_state_dict(model, opt)
    writer = HashingFileSystemWriter(str(path), thread_count=threads)
    save_shards({"model": msd, "optim": osd}, str(path), writer)
    write_state(str(path), {"step": step, "world_size": 1}, PretrainedConfig(), writer.digests if digests else None)
    return path


def blake2b_of(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def overwrite_middle(path: Path, n: int = 1 << 20) -> None:
    """Write ``n`` random bytes into the middle of a file, its size unchanged."""
    size = path.stat().st_size
    assert size > n
    with open(path, "r+b") as f:
        f.seek(size // 2 - n // 2)
        f.write(os.urandom(n))
    assert path.stat().st_size == size


def largest_shard(path: Path) -> Path:
    return max(path.glob("*.distcp"), key=lambda p: p.stat().st_size)


def test_every_file_gets_its_digest_while_written(one_rank_group, tmp_path):
    path = write_checkpoint(tmp_path, 5)
    state = json.loads((path / "rayft_state.json").read_text())
    on_disk = {p.name for p in path.iterdir()} - {"rayft_state.json"}
    assert on_disk == {".metadata", "config.json", "__0_0.distcp", "__0_1.distcp", "__0_2.distcp"}
    assert state["digest_algorithm"] == "blake2b-128"
    assert state["digests"] == {name: blake2b_of(path / name) for name in on_disk}
    assert state["step"] == 5 and state["world_size"] == 1
    check = verify_checkpoint(path)
    assert (check.status, check.step, check.files, check.problem) == ("intact", 5, 5, None)


def test_an_async_save_records_the_same_digests(one_rank_group, tmp_path):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = model_and_optimizer(0)
    msd, osd = get_state_dict(model, opt)
    path = tmp_path / "checkpoint_0000002"
    writer = HashingFileSystemWriter(str(path), thread_count=2)
    async_save_shards({"model": msd, "optim": osd}, str(path), writer, dist.new_group(backend="gloo")).result()
    assert writer.digests == {p.name: blake2b_of(p) for p in path.iterdir()}
    assert set(writer.digests) == {".metadata", "__0_0.distcp", "__0_1.distcp"}


def test_a_corrupt_shard_is_named_with_both_digests(one_rank_group, tmp_path):
    path = write_checkpoint(tmp_path, 8)
    shard = largest_shard(path)
    expected = json.loads((path / "rayft_state.json").read_text())["digests"][shard.name]
    overwrite_middle(shard)
    check = verify_checkpoint(path)
    got = blake2b_of(shard)
    assert check.status == "corrupt" and got != expected
    assert [(m.file, m.expected, m.got) for m in check.mismatches] == [(shard.name, expected, got)]
    assert check.problem == f"checkpoint 8 is corrupt ({shard}: expected blake2b-128 {expected}, got {got})"
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(tmp_path)])
    assert res.exit_code == 1
    assert res.stdout == f"step 8 (checkpoint_0000008): corrupt: {shard.name} expected {expected}, got {got}\n"


def test_resume_skips_a_corrupt_checkpoint_for_the_newest_intact_one(one_rank_group, tmp_path, capsys):
    run = tmp_path / "run"
    older = write_checkpoint(run, 4, seed=4)
    newest = write_checkpoint(run, 6, seed=6)
    overwrite_middle(largest_shard(newest))
    (run / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray Train's bookkeeping: no checkpoint, no warning
    assert checkpoint_dirs(run) == [older, newest] and [c.step for c in verify_run(run)] == [4, 6]
    # the workers' side: rank 0 verifies, warns, and picks step 4
    assert resolve_resume_dir(None, None, str(run)) == str(older)
    out = capsys.readouterr().out
    assert "incomplete" not in out
    assert f"[rayft] WARNING: checkpoint 6 is corrupt ({largest_shard(newest)}: expected blake2b-128 " in out
    assert out.rstrip().endswith(": skipping it")
    # a checkpoint the driver verified for --resume is taken without reading it again
    assert resolve_resume_dir(None, str(newest), str(run)) == str(newest)
    # the driver's side (--resume): the same choice, the same warning
    buf = io.StringIO()
    assert prepare_run_dir(str(run), str(run), None, Console(file=buf, width=400)) == str(older)
    text = buf.getvalue()
    assert "incomplete" not in text
    assert "warning: checkpoint 6 is corrupt (" in text and "resuming" in text and "from its checkpoint of step 4" in text
    # the loaded weights are the intact checkpoint's
    model, opt = model_and_optimizer(seed=99)
    assert load_sharded(model, opt, str(older))["step"] == 4
    ref, _ = model_and_optimizer(seed=4)
    assert torch.equal(model[0].weight, ref[0].weight)
    # nothing intact left: resume refuses, naming the run
    overwrite_middle(largest_shard(older))
    with pytest.raises(CheckpointError, match=r"no intact checkpoint to resume from \(every complete one is corrupt\)"):
        resolve_resume_dir(None, None, str(run))
    with pytest.raises(TrainError, match=r"no intact checkpoint in .* \(every complete one is corrupt\)"):
        prepare_run_dir(str(run), str(run), None, Console(file=io.StringIO()))


def test_a_checkpoint_without_digests_is_accepted_as_unverifiable(one_rank_group, tmp_path):
    run = tmp_path / "run"
    old = write_checkpoint(run, 3, seed=3, digests=False)
    assert "digests" not in json.loads((old / "rayft_state.json").read_text())
    check = verify_checkpoint(old)
    assert check.status == "unverifiable" and check.problem is None
    noted = []
    assert newest_intact(run, noted.append) == (3, old)
    assert [c.status for c in noted] == ["unverifiable"]
    assert (
        noted[0].remark()
        == f"checkpoint 3 ({old}) cannot be verified: its rayft_state.json records no digests (written by an earlier rayft)"
    )
    buf = io.StringIO()
    assert prepare_run_dir(str(run), str(run), None, Console(file=buf, width=400)) == str(old)
    assert "note: checkpoint 3" in buf.getvalue() and "cannot be verified" in buf.getvalue()
    model, opt = model_and_optimizer(seed=0)
    assert load_sharded(model, opt, str(old))["step"] == 3
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(run)])
    assert res.exit_code == 0
    assert (
        res.stdout == "step 3 (checkpoint_0000003): unverifiable: its rayft_state.json records no digests (written by an earlier rayft)\n"
    )


def test_a_model_only_checkpoint_loads_the_weights_and_refuses_to_continue_training(one_rank_group, tmp_path):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from rayft.train.run_dir import check_resume_steps

    run = tmp_path / "run"
    full = write_checkpoint(run, 4, seed=4)
    path = run / "checkpoint_0000006"
    trained, _ = model_and_optimizer(seed=6)
    writer = HashingFileSystemWriter(str(path), thread_count=2)
    save_shards({"model": get_model_state_dict(trained)}, str(path), writer)
    write_state(str(path), {"step": 6, "world_size": 1, "contents": "model"}, PretrainedConfig(), writer.digests)
    # the weights without AdamW's two moments: about a third of the full checkpoint's bytes
    assert 0.30 < directory_bytes(path) / directory_bytes(full) < 0.36
    assert verify_checkpoint(path).status == "intact"
    # loading takes the weights and leaves the optimizer's state as it was
    model, opt = model_and_optimizer(seed=99)
    moments = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    state = load_sharded(model, opt, str(path))
    assert state["step"] == 6 and state["contents"] == "model"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), trained.state_dict().values()))
    assert all(torch.equal(opt.state_dict()["state"][0][k], v) for k, v in moments.items())
    # --resume picks it (the newest intact one); the driver refuses it with steps left, and any checkpoint without
    assert prepare_run_dir(str(run), str(run), None, Console(file=io.StringIO())) == str(path)
    with pytest.raises(TrainError, match=r"holds the model's weights only .* cannot continue from its step 6 to 8"):
        check_resume_steps(str(path), 8)
    with pytest.raises(TrainError, match=r"checkpoint_0000006 already holds step 6 of this run's 6: nothing to train"):
        check_resume_steps(str(path), 6)
    with pytest.raises(TrainError, match=r"checkpoint_0000004 already holds step 4 of this run's 3: nothing to train"):
        check_resume_steps(str(full), 3)
    check_resume_steps(str(full), 8)  # a full checkpoint (no contents: as an earlier rayft wrote it) continues
    with pytest.raises(
        TrainError, match=r"checkpoint_0000004/rayft_state.json: contents 'weights' is neither 'model' nor 'model\+optimizer'"
    ):
        check_resume_steps(str(full), 8, {"step": 4, "contents": "weights"})


def test_verify_lists_every_checkpoint_and_fails_on_an_incomplete_one(one_rank_group, tmp_path):
    write_checkpoint(tmp_path, 2)
    partial = write_checkpoint(tmp_path, 4)
    (partial / "rayft_state.json").unlink()  # the save was interrupted before rank 0 finished it
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(tmp_path)])
    assert res.exit_code == 1
    assert res.stdout.splitlines() == [
        "step 2 (checkpoint_0000002): intact (5 files match their blake2b-128 digests)",
        "step 4 (checkpoint_0000004): incomplete: no rayft_state.json (interrupted save?)",
    ]
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(tmp_path), "--step", "2"])
    assert res.exit_code == 0 and res.stdout.count("\n") == 1
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(tmp_path), "--step", "3"])
    assert res.exit_code == 1 and "no checkpoint at step 3 (have [2, 4])" in res.stderr
    res = CliRunner().invoke(app, ["checkpoint", "verify", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "nope: no such run directory" in res.stderr


class CallerKnowingWriter(HashingFileSystemWriter):
    """The hashing writer, remembering which thread called ``write_data`` (the others are the extra
    writer threads DCP starts when ``thread_count`` > 1)."""

    def write_data(self, plan, planner):
        self.caller = threading.current_thread()
        return super().write_data(plan, planner)


@pytest.fixture
def full_disk(monkeypatch):
    """DCP's local file system on a volume that fills up: each file fails with ENOSPC, as a real
    file does on a full disk, once 1 MiB of it is written; with several writer threads only the
    extra threads' files fail (their errors are the ones FileSystemWriter alone loses)."""
    original = FileSystem.create_stream

    class Filling:
        def __init__(self, stream, fails):
            self.stream, self.left, self.fails = stream, 1 << 20, fails

        def write(self, b):
            mv = memoryview(b).cast("B")
            if self.fails and len(mv) > self.left:
                self.stream.write(mv[: self.left])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.left -= len(mv)
            return self.stream.write(mv)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    @contextmanager
    def create_stream(self, path, mode):
        writer = full_disk_writer[0]
        fails = writer.thread_count == 1 or threading.current_thread() is not writer.caller
        with original(self, path, mode) as f:
            yield Filling(f, fails)

    full_disk_writer: list = []
    monkeypatch.setattr(FileSystem, "create_stream", create_stream)
    return full_disk_writer


# threads=3: the disk fills up in the writer threads other than the calling one, whose errors
# FileSystemWriter alone would lose (finishing a checkpoint whose metadata lacks their files)
@pytest.mark.parametrize("mode,threads", [("sync", 1), ("sync", 3), ("async", 3)])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the extra threads' lost errors
def test_a_save_that_runs_out_of_space_removes_its_partial_directory(one_rank_group, tmp_path, full_disk, mode, threads):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, opt = model_and_optimizer(0)
    msd, osd = get_state_dict(model, opt)
    path = tmp_path / "checkpoint_0000006"
    writer = CallerKnowingWriter(str(path), thread_count=threads)
    full_disk.append(writer)
    with pytest.raises(CheckpointException, match=r"OSError: \[Errno 28\] No space left on device"):  # DCP's, on every rank
        if mode == "sync":
            save_shards({"model": msd, "optim": osd}, str(path), writer)
        else:
            async_save_shards({"model": msd, "optim": osd}, str(path), writer, dist.new_group(backend="gloo")).result()
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_the_free_space_warning_compares_the_last_checkpoint_with_the_free_bytes(one_rank_group, tmp_path, monkeypatch):
    write_checkpoint(tmp_path, 2)
    last = write_checkpoint(tmp_path, 4)
    size = directory_bytes(last)
    assert size == sum(p.stat().st_size for p in last.iterdir()) and size > 16 << 20  # weights + AdamW's two moments
    assert last_checkpoint_bytes(tmp_path) == size
    assert last_checkpoint_bytes(tmp_path / "empty") is None
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=size - 1))
    msg = free_space_warning(tmp_path / "checkpoint_0000006", size)
    gb = f"{(size - 1) / 1e9:.2f} GB free but the last checkpoint took {size / 1e9:.2f} GB"
    assert msg == f"{tmp_path / 'checkpoint_0000006'} has {gb}: this one may not fit (a failed save removes its partial directory)"
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=size))
    assert free_space_warning(tmp_path / "checkpoint_0000006", size) is None


def test_pinned_buffers_are_prestaged_only_for_periodic_saves(one_rank_group, monkeypatch):
    """A run that saves only at the end (or never) does not pin a host copy of its whole state after
    the first step, nor for its one save (12 bytes per parameter: 87 GB for Mistral-7B, ~178 s of
    pinning on one H200)."""
    from rayft.config import CheckpointConfig
    from rayft.train import checkpoint_writer

    staged = []
    monkeypatch.setattr(checkpoint_writer, "on_gpu", lambda model: True)  # the decision, not the copy, is under test
    monkeypatch.setattr(checkpoint_writer.CheckpointWriter, "_new_writer", lambda self, path, cache: staged.append(cache) or _Stage())
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    for every_steps, every_minutes, want in ((None, None, None), (5, None, True), (None, 2.0, True)):
        saver = checkpoint_writer.CheckpointWriter(CheckpointConfig(every_steps=every_steps, every_minutes=every_minutes), None)
        assert saver.reuses_pinned_buffers(model) == bool(want)  # what a later save() stages into
        got = saver.prestage(model, opt)
        assert (got is not None or None) == want, (every_steps, every_minutes, got)
    assert staged == [True, True]
    assert checkpoint_writer.CheckpointWriter(CheckpointConfig(every_steps=5, async_save=False), None).prestage(model, opt) is None


class _Stage:
    """Stands in for DCP's staging writer: records what it was asked to stage."""

    def stage(self, state):
        self.state = state
        return state

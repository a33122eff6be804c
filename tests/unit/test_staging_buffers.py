"""The host buffers async saves stage into, allocated on a thread (rayft.train.staging_buffers):
DCP's stager copies a real FSDP2 model + AdamW state into them, reusing them, with the values intact."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from rayft.train.staging_buffers import BackgroundStaging, empty_host_like


def sharded_model_and_optimizer():
    """An FSDP2-sharded two-layer model and its AdamW after one step (needs a process group)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return model, opt


@pytest.fixture
def sharded_state(one_rank_group):
    """An FSDP2-sharded two-layer model after one AdamW step: DTensor weights and moments, a 0-dim step count."""
    msd, osd = get_state_dict(*sharded_model_and_optimizer())
    return {"model": msd, "optim": osd}


def test_empty_host_like_keeps_structure_and_meshes(sharded_state):
    twin = empty_host_like(sharded_state, pin=False)
    w, tw = sharded_state["model"]["0.weight"], twin["model"]["0.weight"]
    assert isinstance(tw, DTensor) and tw.placements == w.placements and tw.device_mesh == w.device_mesh
    assert tw.shape == w.shape == (16, 8) and tw.dtype == w.dtype and tw.to_local().device.type == "cpu"
    assert tw.to_local().data_ptr() != w.to_local().data_ptr()  # its own memory, not a view of the model's
    steps = [s["step"] for s in twin["optim"]["state"].values()]
    assert len(steps) == 4 and all(s.dim() == 0 and s.device.type == "cpu" for s in steps)
    assert twin["optim"]["param_groups"] == sharded_state["optim"]["param_groups"]  # lists of plain values, as they were


def test_stager_copies_into_background_buffers_and_reuses_them(sharded_state, tmp_path):
    staging = BackgroundStaging(sharded_state, pin=torch.cuda.is_available())
    buffers = staging.result()
    assert staging.done() and staging.finished >= staging.started
    writer = dcp.FileSystemWriter(str(tmp_path), cache_staged_state_dict=True)
    writer.state_dict_cache = buffers  # as CheckpointWriter hands them over
    staged = writer.stage(sharded_state)
    for key in ("0.weight", "1.bias"):
        got, want = staged["model"][key], sharded_state["model"][key]
        assert got.to_local().data_ptr() == buffers["model"][key].to_local().data_ptr()  # copied into, not reallocated
        assert torch.equal(got.to_local(), want.to_local())
    moments = next(iter(sharded_state["optim"]["state"].values()))
    staged_moments = next(iter(staged["optim"]["state"].values()))
    assert torch.equal(staged_moments["exp_avg_sq"].to_local(), moments["exp_avg_sq"].to_local())
    assert int(staged_moments["step"]) == int(moments["step"]) == 1
    dcp.save(staged, storage_writer=writer)  # the staged copy saves as DCP shards
    assert (tmp_path / ".metadata").is_file()


def test_zero_dim_and_empty_shards_follow_torchs_own_stager(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate

    mesh = init_device_mesh("cpu", (1,))
    scalar = DTensor.from_local(torch.tensor(3.0), mesh, [Replicate()])
    empty = DTensor.from_local(torch.empty(0, 4), mesh, [Replicate()])
    state = {"scalar": scalar, "empty": empty, "t": (torch.ones(2), 7, "x", None)}
    twin = empty_host_like(state, pin=False)
    assert twin["scalar"] is scalar  # a 0-dim DTensor is the live object, as in torch's _create_cpu_state_dict
    assert isinstance(twin["empty"], DTensor) and twin["empty"].shape == (0, 4)
    assert isinstance(twin["t"], tuple) and twin["t"][1:] == (7, "x", None) and twin["t"][0].shape == (2,)
    writer = dcp.FileSystemWriter("/nonexistent", cache_staged_state_dict=True)
    writer.state_dict_cache = twin
    staged = writer.stage(state)
    assert torch.equal(staged["t"][0], torch.ones(2)) and staged["t"][0] is twin["t"][0]


def test_background_error_reaches_the_caller():
    staging = BackgroundStaging({"model": {"w": object()}}, pin=False)
    with pytest.raises(TypeError, match="cannot stage a object"):
        staging.result()
    assert staging.done()


def test_compile_cache_dir_replaces_only_torchs_default(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from rayft.train.model import use_compile_cache_dir

    ours = str(tmp_path / "compile")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what importing Inductor leaves
    assert use_compile_cache_dir(ours) == ours and os.environ["TORCHINDUCTOR_CACHE_DIR"] == ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own
    assert use_compile_cache_dir(ours) == str(tmp_path / "mine")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    (tmp_path / "file").write_text("")
    said = []
    assert use_compile_cache_dir(str(tmp_path / "file" / "compile"), say=said.append) == default_cache_dir()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "compiling with torch's cache directory instead" in said[0]


def test_a_run_that_ends_before_its_first_save_only_warns_of_failed_buffers(one_rank_group, monkeypatch, capfd):
    """prestage's thread on a host that cannot pin (this CPU machine, made to look like a GPU run):
    the loop never waits on it, and the run's end reports the failure as a warning, not an error."""
    from types import SimpleNamespace

    from rayft.train import checkpoint_writer

    model = torch.nn.Linear(4, 4)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    monkeypatch.setattr(checkpoint_writer, "on_gpu", lambda m: True)
    ccfg = SimpleNamespace(every_steps=10, every_minutes=None, async_save=True, periodic_async=True, write_threads=1)
    saver = checkpoint_writer.CheckpointWriter(ccfg, model_config=None)
    assert saver.prestage(model, opt) is not None
    assert saver.wait() == []
    assert "staging buffers could not be allocated" in capfd.readouterr().err


def test_a_model_only_save_stages_into_the_periodic_saves_buffers(one_rank_group, monkeypatch, tmp_path):
    """checkpoint.final_model_only after periodic async saves: the last save's writer copies the
    weights into the model part of the pinned buffers the periodic saves reuse (the same memory),
    and what it writes loads back as those weights. Unpinned here (a CPU machine made to look like a
    GPU run); without the buffers (no periodic save) it stages into plain memory."""
    from functools import partial
    from types import SimpleNamespace

    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from rayft.train import checkpoint_writer

    model, opt = sharded_model_and_optimizer()
    monkeypatch.setattr(checkpoint_writer, "on_gpu", lambda m: True)
    monkeypatch.setattr(checkpoint_writer, "BackgroundStaging", partial(BackgroundStaging, pin=False))
    ccfg = SimpleNamespace(every_steps=10, every_minutes=None, async_save=True, periodic_async=True, write_threads=1)
    saver = checkpoint_writer.CheckpointWriter(ccfg, model_config=None)
    assert checkpoint_writer.CheckpointWriter(ccfg, model_config=None).model_only_writer(str(tmp_path)).cache_staged_state_dict is False
    saver.prestage(model, opt)
    assert saver.wait() == []  # takes the buffers (no save in flight)
    writer = saver.model_only_writer(str(tmp_path / "final"))
    weights = {"model": get_model_state_dict(model)}
    staged = writer.stage(weights)
    full = saver.model_only_writer(str(tmp_path)).state_dict_cache["model"]
    for key, want in weights["model"].items():
        got = staged["model"][key].to_local()
        assert got.data_ptr() == full[key].to_local().data_ptr() and torch.equal(got, want.to_local()), key
    dcp.save(staged, storage_writer=writer)
    loaded = {"model": {k: torch.zeros_like(v) for k, v in weights["model"].items()}}
    dcp.load(loaded, checkpoint_id=str(tmp_path / "final"))
    assert all(torch.equal(loaded["model"][k].to_local(), v.to_local()) for k, v in weights["model"].items())

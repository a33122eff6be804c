"""The host buffers async saves stage into, allocated on a thread (rayft.train.staging_buffers):
DCP's stager copies a real FSDP2 model + AdamW state into them, reusing them, with the values intact."""

import threading

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from rayft.train.staging_buffers import BackgroundStaging, empty_host_like


@pytest.fixture
def sharded_state(one_rank_group):
    """An FSDP2-sharded two-layer model after one AdamW step: DTensor weights and moments, a 0-dim step count."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
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


def test_background_error_reaches_the_caller():
    staging = BackgroundStaging({"model": {"w": object()}}, pin=False)
    with pytest.raises(TypeError, match="cannot stage a object"):
        staging.result()
    assert not any(t.name == "rayft-staging-buffers" for t in threading.enumerate())

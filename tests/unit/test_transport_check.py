"""The run's side of issue 20: ray.verify_transport and train.nccl_flight_recorder in the config, the
workers' environment they set, and the checks before the workers start. The end-of-run check
itself runs against a real local Ray job in tests/integration/test_doctor_job.py."""

from __future__ import annotations

import os
import textwrap

import pytest

from rayft.config import ConfigError
from rayft.config_load import load_config
from rayft.train.errors import TrainError
from rayft.train.ray_cluster import PINNED_REGISTER, check_worker_environment, flight_recorder_env, pinned_register_conf, worker_env_vars


def config(tmp_path, extra: str = ""):
    (tmp_path / "d.jsonl").write_text("{}\n")
    p = tmp_path / "job.yaml"
    p.write_text(textwrap.dedent("data:\n  train_files: d.jsonl\n") + textwrap.dedent(extra))
    return load_config(p)


def test_config_fields(tmp_path):
    cfg = config(tmp_path)
    assert (cfg.ray.verify_transport, cfg.train.nccl_flight_recorder) == (None, False)
    cfg = config(tmp_path, "ray:\n  verify_transport: efa\ntrain:\n  nccl_flight_recorder: true\n")
    assert (cfg.ray.verify_transport, cfg.train.nccl_flight_recorder) == ("efa", True)
    with pytest.raises(ConfigError, match=r"ray.verify_transport \(line 4\)"):
        config(tmp_path, "ray:\n  verify_transport: infiniband\n")


def test_workers_environment(tmp_path, monkeypatch):
    for k in ("NCCL_DEBUG", "NCCL_NET", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(k, raising=False)
    assert worker_env_vars() == {"TOKENIZERS_PARALLELISM": "false"}  # the old call, unchanged
    cfg = config(tmp_path, "ray:\n  verify_transport: nvlink\ntrain:\n  nccl_flight_recorder: true\n")
    import torch

    new = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 9)
    buffer, dump = (
        ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE") if new else ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    )
    assert worker_env_vars(cfg, "/fsx/runs/r1") == {
        "TOKENIZERS_PARALLELISM": "false",
        "NCCL_DEBUG": "INFO",  # the check reads NCCL_DEBUG=INFO lines
        buffer: "2000",
        dump: "/fsx/runs/r1/flight_recorder/rank_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    # GPU workers with periodic async saves pin their staging buffers by registering; not without them
    periodic = config(tmp_path, "checkpoint:\n  every_steps: 10\n")
    assert worker_env_vars(periodic, None, use_gpu=True)["PYTORCH_CUDA_ALLOC_CONF"] == PINNED_REGISTER
    assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_env_vars(periodic, None, use_gpu=False)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_env_vars(cfg, None, use_gpu=True)  # no periodic saves: one plain copy
    sync = config(tmp_path, "checkpoint:\n  every_steps: 10\n  async_save: false\n")
    assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_env_vars(sync, None, use_gpu=True)
    monkeypatch.setenv("NCCL_DEBUG", "TRACE")  # the user's own level wins
    assert worker_env_vars(cfg, "/fsx/runs/r1")["NCCL_DEBUG"] == "TRACE"


def test_pinned_register_joins_the_users_allocator_setting():
    assert pinned_register_conf({}) == {"PYTORCH_CUDA_ALLOC_CONF": PINNED_REGISTER}
    assert pinned_register_conf({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True," + PINNED_REGISTER
    }
    assert pinned_register_conf({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}) == {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True," + PINNED_REGISTER
    }
    both = {"PYTORCH_ALLOC_CONF": "a:1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # CUDA reads its own first
    assert pinned_register_conf(both) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True," + PINNED_REGISTER}
    assert pinned_register_conf({"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:False"}) == {}  # the user's choice stands


def test_embedded_ray_start_turns_the_preemption_watcher_off_for_its_processes_only(monkeypatch):
    from rayft.train.ray_cluster import without_preemption_watcher

    key = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    monkeypatch.delenv(key, raising=False)
    with without_preemption_watcher():
        assert os.environ[key] == "0"  # what the embedded Ray's processes inherit
    assert key not in os.environ  # this process: as before (Ray Train passes a driver's own setting on)
    monkeypatch.setenv(key, "1")
    with without_preemption_watcher():
        assert os.environ[key] == "1"  # the user's setting stands
    assert os.environ[key] == "1"


def test_flight_recorder_names_by_torch_version():
    assert flight_recorder_env("/d", "2.13.0+cpu") == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": "/d/rank_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert flight_recorder_env("/d", "2.6.0") == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/rank_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def test_flight_recorder_needs_a_file_system_for_its_dumps(tmp_path):
    cfg = config(tmp_path, "train:\n  nccl_flight_recorder: true\ncheckpoint:\n  storage_path: s3://bucket/runs\n")
    with pytest.raises(TrainError) as e:
        check_worker_environment(cfg, use_gpu=False)
    assert str(e.value) == (
        "train.nccl_flight_recorder writes each rank's dump into the run directory, but checkpoint.storage_path="
        "s3://bucket/runs is not a file system: use one every node mounts (e.g. /fsx), or turn the recorder off"
    )

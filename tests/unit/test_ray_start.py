"""What rayft.train.ray_start relies on in Ray without starting one: Ray Train's controller gets its
autoscaling coordinator from the very function that start_autoscaling_coordinator calls (else the
early start would make an actor nobody asks), and a config that joins a cluster starts nothing."""

from rayft.config import RayftConfig
from rayft.train.ray_start import EmbeddedRayStart


def test_ray_trains_controller_asks_the_coordinator_that_is_started_early():
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as data_side
    from ray.train.v2._internal.execution.scaling_policy import autoscaling_coordinator_client as train_side

    assert train_side.get_or_create_autoscaling_coordinator is data_side.get_or_create_autoscaling_coordinator
    assert "get_or_create_autoscaling_coordinator()" in open(train_side.__file__).read()


def test_a_run_that_joins_a_cluster_starts_no_ray_of_its_own(monkeypatch):
    cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"address": "10.0.0.1:6379"}})
    assert EmbeddedRayStart.begin(cfg) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert EmbeddedRayStart.begin(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"address": None})})) is None


BEGINS = r"""
import json, sys
from rich.console import Console
from rayft.config import RayftConfig
from rayft.train import driver

class Begun(Exception):
    pass

def begin(cfg):  # where run_training starts the embedded Ray: what has been imported by then
    raise Begun(json.dumps(sorted(m for m in ("torch", "transformers", "ray.train") if m in sys.modules)))

driver.EmbeddedRayStart.begin = begin
cfg = RayftConfig.model_validate({"model": {"name_or_path": "Qwen/Qwen2.5-0.5B", "tokenizer": "qwen2.5"},
                                  "data": {"train_files": ["unused.jsonl"]}, "checkpoint": {"storage_path": sys.argv[1]}})
try:
    driver.run_training(cfg, console=Console(quiet=True))
except Begun as e:
    print(e)
"""


def test_the_embedded_ray_starts_before_the_driver_imports_torch_or_transformers(tmp_path):
    """So that Ray's start (3-6 s) overlaps those imports (2-3.5 s): the Hub check before it reads
    the offline tokenizers' names from a module without them (bench/NOTES.md §38)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", BEGINS, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_the_offline_tokenizer_names_are_the_offline_tokenizers():
    from rayft.data.tokenizer import OFFLINE_TOKENIZERS
    from rayft.data.tokenizer_names import OFFLINE_TOKENIZER_NAMES

    assert set(OFFLINE_TOKENIZERS) == OFFLINE_TOKENIZER_NAMES == {"qwen2.5", "qwen3", "llama3", "mistral-v3"}


def test_a_missing_optional_package_is_skipped_and_a_moved_ray_module_stops_the_early_start(monkeypatch):
    import importlib

    from rayft.train import ray_start

    def fake_import(name):
        if name == "aiohttp_cors":
            raise ModuleNotFoundError("No module named 'aiohttp_cors'", name="aiohttp_cors")
        if name == "ray.dashboard.optional_deps":  # present, but its own import of an optional package fails
            raise ModuleNotFoundError("No module named 'opencensus'", name="opencensus")
        if name == "ray.autoscaler.v2.utils":  # Ray moved it
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name == "ray.broken":
            raise ImportError("cannot import name 'x' from 'ray.broken'")
        return object()

    monkeypatch.setattr(importlib, "import_module", fake_import)
    assert ray_start.preimport("aiohttp_cors") is True
    assert ray_start.preimport("ray.dashboard.optional_deps") is True
    assert ray_start.preimport("colorful") is True
    assert ray_start.preimport("ray.autoscaler.v2.utils") is False
    assert ray_start.preimport("ray.broken") is False

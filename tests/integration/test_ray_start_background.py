"""The embedded Ray started on a thread (rayft.train.ray_start): the thread imports nothing (every
module ray.init needs was imported before it began), Ray's processes outlive the thread's start,
a SIGTERM after it reaches the driver's handler, the autoscaling coordinator started early is the actor Ray
Train looks up, and a run that fails before its Ray is up waits for the start and leaves no Ray
process behind. Each test runs in its own Python process: its Ray is its own."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

START = r"""
import importlib, json, os, signal, sys, time
from rayft.config import RayftConfig
from rayft.train.ray_start import RAY_INIT_IMPORTS, EmbeddedRayStart, start_autoscaling_coordinator

cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"num_cpus": 1}})
os.environ["RAY_ADDRESS"] = "127.0.0.1:1"
joins_a_cluster = EmbeddedRayStart.begin(cfg)  # nothing started, nothing connected
del os.environ["RAY_ADDRESS"]

import ray
from rayft.train.stop import SignalStop, StopBeforeTraining

for name in RAY_INIT_IMPORTS:
    importlib.import_module(name)
signals = SignalStop(5.0)
with signals:  # as run_training orders them: the driver's handlers, then the start
    before = set(sys.modules)
    start = EmbeddedRayStart.begin(cfg)
    where = start.wait()
    on_thread = sorted(set(sys.modules) - before)  # this thread imported nothing meanwhile: the start's thread did
    time.sleep(2)  # the start's thread has long left ray.init: Ray's processes must still be there
    answer = ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60)
    try:  # as a pod's eviction during the data would: the driver's stop, no stack dump of Ray's
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        stopped = None
    except StopBeforeTraining as e:
        stopped = e.signum
asked = start_autoscaling_coordinator()
coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")  # the name Ray Train asks for
up = ray.get(coordinator.__ray_ready__.remote(), timeout=60)
print(json.dumps({"joins_a_cluster": joins_a_cluster is None, "where": where, "thread_imports": on_thread, "answer": answer,
                  "stopped_by": stopped, "again": EmbeddedRayStart.begin(cfg) is None,
                  "coordinator": [asked, up]}))
"""


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return e | {"PYTHONPATH": str(ROOT / "src")}


def test_the_start_imports_nothing_on_its_thread_and_its_ray_outlives_it():
    """Also: the autoscaling coordinator created early answers under the name Ray Train looks up."""
    p = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=180, env=env())
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {
        "joins_a_cluster": True,
        "where": "embedded local Ray",
        "thread_imports": [],  # else: add what Ray now imports on first use to RAY_INIT_IMPORTS
        "answer": 42,
        "stopped_by": 15,
        "again": True,
        "coordinator": [True, True],
    }
    assert "SIGTERM handler is not set" not in p.stderr
    assert "SIGTERM received" not in p.stderr  # Ray's C++ failure handler, which the start's thread took back


BESIDE_IMPORTS = r"""
import importlib.abc, json, sys, threading
from rayft.config import RayftConfig
from rayft.train.ray_start import RAY_INIT_IMPORTS, EmbeddedRayStart

class Recorder(importlib.abc.MetaPathFinder):  # who imports what: (thread, module) of every import not yet done
    seen = []
    hidden = set(sys.argv[1:])  # as if not installed: Ray's optional dependencies on a bare `pip install ray`
    def find_spec(self, fullname, path, target=None):
        self.seen.append((threading.current_thread().name, fullname))
        if fullname.split(".")[0] in self.hidden:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"num_cpus": 1}})
sys.meta_path.insert(0, Recorder())
start = EmbeddedRayStart.begin(cfg)
import transformers, torch  # what the driver's data phase imports while Ray starts (rayft.data.tokenizer)
where = start.wait()
# looked up there but absent (Ray's probes for other accelerators' packages: acl, rebel, ...) loads nothing
mine = sorted({m for t, m in Recorder.seen if t == start.thread.name and m in sys.modules})
print(json.dumps({"where": where, "start_thread_imports": mine, "main_imported_torch": any(m == "torch" for t, m in Recorder.seen if t == "MainThread")}))
"""


@pytest.mark.parametrize("hidden", [[], ["aiohttp_cors", "opencensus", "colorful"]], ids=["ray-default", "bare-ray"])
def test_the_start_imports_nothing_while_the_main_thread_imports_torch_and_transformers(hidden):
    """The driver's data phase imports transformers and torch while Ray starts (bench/NOTES.md §38):
    a module imported from both threads at once failed a run in §31, so the start's must import none.
    Also where Ray's optional dependencies are not installed (the GPU host's bare Ray): the start is
    still on its thread (§38: it was not, and the driver waited for all of it after the data)."""
    p = subprocess.run([sys.executable, "-c", BESIDE_IMPORTS, *hidden], capture_output=True, text=True, timeout=180, env=env())
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"where": "embedded local Ray", "start_thread_imports": [], "main_imported_torch": True}


def session_processes(pid: int) -> list[str]:
    """Command lines of the processes of the Ray session that process ``pid`` started."""
    mark = re.compile(rf"/session_[^/\s]*_{pid}(?:[/\s]|$)")
    return [line[:200] for proc in psutil.process_iter(["cmdline"]) if mark.search(line := " ".join(proc.info["cmdline"] or []))]


FAILS_EARLY = r"""
import json, sys
import ray
from rich.console import Console
from rayft.config import RayftConfig
from rayft.train import driver

seen = {}

def fail(*args, **kwargs):  # the run, failing at once: the Ray start is (most likely) still under way
    seen["ray_up_at_failure"] = ray.is_initialized()
    raise driver.TrainError("a bad record (the test's)")

driver.train_run = fail
driver.SETTLE_S = 120.0  # the wait under test, without its cap: on a loaded 2-core machine a start took > 10 s (2026-12-05)
cfg = RayftConfig.model_validate({"model": {"name_or_path": "qwen2-tiny"}, "data": {"train_files": ["unused.jsonl"]},
                                  "train": {"use_gpu": False, "num_workers": 1}, "checkpoint": {"storage_path": sys.argv[1]},
                                  "ray": {"num_cpus": 1}})
try:
    driver.run_training(cfg, console=Console(quiet=True))
except driver.TrainError as e:
    seen["error"] = str(e)
seen["ray_up_after"] = ray.is_initialized()  # run_training settled the start before it raised
print(json.dumps(seen), flush=True)
"""


def test_a_run_that_fails_before_its_ray_is_up_settles_the_start_and_leaves_no_ray_behind(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", FAILS_EARLY, str(tmp_path / "runs")], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    assert got["error"] == "a bad record (the test's)"
    assert got["ray_up_after"] is True, got
    deadline = time.time() + 5  # Ray's shutdown at exit stopped them; processes killed by their parent's end linger ~20 s
    while (left := session_processes(proc.pid)) and time.time() < deadline:
        time.sleep(0.5)
    assert left == []

"""The embedded Ray's start on a busy host: Ray waits a fixed 30 s for its raylet and leaves its
processes running when that runs out; connect_ray stops exactly those (stop_failed_ray_start) and
starts once more. Each test runs in its own Python process, so its Ray session directories carry
that process's pid and no other test's Ray is near."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

CLEANUP = r"""
import json, os, subprocess, sys, time
import psutil
from rayft.train.ray_cluster import child_pids, stop_failed_ray_start

session = f"--session_dir=/tmp/ray/session_2026-12-02_08-00-00_123456_{os.getpid()}"
earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", session])  # another Ray of this process, older
before = child_pids()
sleeper = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"
mine = subprocess.Popen([sys.executable, "-c", sleeper, session])
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"--session_dir=/tmp/ray/session_2026-12-02_08-00-00_123456_{os.getpid()}1"])
plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
deadline = time.time() + 60
while not psutil.Process(mine.pid).children() and time.time() < deadline:
    time.sleep(0.1)
grandchild = psutil.Process(mine.pid).children()[0].pid
n = stop_failed_ray_start(before, timeout_s=5)
time.sleep(0.5)
alive = lambda pid: psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
print(json.dumps({"stopped": n, "mine": alive(mine.pid), "grandchild": alive(grandchild), "other": alive(other.pid), "plain": alive(plain.pid),
                  "earlier": alive(earlier.pid)}))
for p in (other, plain, earlier):
    p.kill()
"""

RETRY = r"""
import json, os, sys
import ray
from rayft.config import RayftConfig
from rayft.train import ray_cluster

real, calls = ray.init, []

def busy_then_real(*args, **kwargs):
    calls.append(kwargs.get("address"))
    if len(calls) == 1:
        raise Exception("The current node timed out during startup. This could happen because some of the raylet failed to startup or the GCS has become overloaded.")
    return real(*args, **kwargs)

ray.init = busy_then_real
cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"num_cpus": 1}})
before = ray_cluster.child_pids()
where = ray_cluster.connect_ray(cfg)
up = ray.is_initialized()
# the real Ray's own processes (what a start that timed out leaves running) are all the ones it would stop
import psutil
started = sorted(p.pid for p in psutil.Process().children() if p.pid not in before)
names = sorted({psutil.Process(pid).name() for pid in started})
found = sorted(p.pid for p in ray_cluster.ray_start_processes(before))
ray.shutdown()
try:
    ray.init = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("another start error"))
    ray_cluster.connect_ray(cfg)
    other = None
except RuntimeError as e:
    other = str(e)
print(json.dumps({"where": where, "up": up, "calls": calls, "other_error": other, "names": names, "all_found": found == started}))
"""


def run_script(code: str, timeout: int = 180) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_a_failed_start_s_processes_are_stopped_and_nothing_else():
    got, _ = run_script(CLEANUP)
    # the new child naming this process's session and its own child are stopped; another pid's session, a
    # plain child and a child of this process's session started before the failed start are not
    assert got == {"stopped": 2, "mine": False, "grandchild": False, "other": True, "plain": True, "earlier": True}


def test_a_start_that_timed_out_is_tried_once_more_and_other_errors_are_not():
    got, err = run_script(RETRY)
    names = got.pop("names")
    assert got == {
        "where": "embedded local Ray",
        "up": True,
        "calls": ["local", "local"],
        "other_error": "another start error",
        "all_found": True,
    }
    # a real embedded Ray's own processes (its GCS, raylet, monitors) all carry its session directory
    assert {"gcs_server", "raylet"} <= set(names)
    assert "[rayft] the embedded Ray did not start within Ray's 30 s (a busy host?): stopped the 0 process(es)" in err

"""The workers start while the driver reads and checks the data (rayft.train.driver): they begin
before the data phase, wait for their arguments, and train with them; the thread running Ray
Train's ``fit`` imports nothing while the driver's thread imports and tokenizes; a data error
raised after the workers started is the run's error, the workers return without training, and no
Ray process outlives the driver. Each run is a real quickstart-sized ``rayft train`` on an embedded
Ray, in its own Python process, with the data phase slowed or failed by a wrapper around the real
one."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

RUN = r"""
import importlib.abc, json, sys, threading, time
from rich.console import Console
from rayft.config_load import load_config
from rayft.train import driver

mode, runs, delay, extra = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]

class Recorder(importlib.abc.MetaPathFinder):  # every import not yet done, by thread
    seen = []
    def find_spec(self, fullname, path, target=None):
        self.seen.append((threading.current_thread().name, fullname))
        return None

seen = {}
real = driver.load_run_data

def data_phase(*args, **kwargs):  # the real data phase, after `delay` s: the workers start meanwhile
    seen["data_start_unix"] = time.time()
    time.sleep(delay)
    if mode == "fail-once-waiting":  # until both workers wait for their arguments
        import ray
        from rayft.train.stop import STOP_NAMESPACE
        actor = next(ray.get_actor(a["name"], namespace=STOP_NAMESPACE) for a in ray.util.list_named_actors(all_namespaces=True)
                     if a.get("namespace") == STOP_NAMESPACE)
        deadline = time.time() + 240
        while ray.get(actor.waiting_ranks.remote()) != [0, 1] and time.time() < deadline:
            time.sleep(0.2)
        seen["waiting_ranks"] = ray.get(actor.waiting_ranks.remote())
    if mode == "stop":  # `rayft stop` while the data phase runs: the driver stops as on a SIGTERM
        from rayft.train.stop import request_stop, running_stop_flags
        seen["asked"] = running_stop_flags()
        request_stop("the test's rayft stop", say=lambda s: None)
        time.sleep(30)  # the data phase goes on: only the stop can end it sooner
        seen["not_stopped"] = True
    if mode.startswith("fail"):
        raise driver.TrainError("data/bad.jsonl:3: a bad record (the test's)")
    return real(*args, **kwargs)

driver.load_run_data = data_phase
cfg = load_config("examples/quickstart.yaml", overrides=[f"checkpoint.storage_path={runs}", "checkpoint.name=r", "train.max_steps=2",
                                                        "train.warmup_steps=0", "checkpoint.every_steps=null", "checkpoint.export_hf=false",
                                                        "ray.log_to_driver=true", *extra])
sys.meta_path.insert(0, Recorder())
try:
    summary = driver.run_training(cfg, console=Console(stderr=True))
    seen |= {"steps": summary["steps"], "wall_s": summary["wall_s"], "data_timings_s": summary["data_timings_s"],
             "start_unix": summary["timeline_unix"]["start"]}
except driver.TrainError as e:
    seen["error"] = str(e)
except driver.TrainStopped as e:
    seen["stopped"] = [e.signal, e.exit_code, e.before_training]
seen["fit_thread_imports"] = sorted({m for t, m in Recorder.seen if t == "rayft-fit" and m in sys.modules})
print(json.dumps(seen), flush=True)
"""


def run(mode: str, tmp_path: Path, delay: float, *extra: str) -> tuple[dict, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run(
        [sys.executable, "-c", RUN, mode, str(tmp_path / "runs"), str(delay), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return last_json(p.stdout), p


def last_json(out: str) -> dict:
    """The script's report: its last line that is a JSON object (the workers' lines reach stdout too)."""
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def test_the_workers_start_before_the_data_phase_and_train_once_it_is_done(tmp_path):
    got, p = run("train", tmp_path, delay=3.0)
    assert got["steps"] == 2, got
    wall = got["wall_s"]
    fit_called = got["start_unix"] + wall["ray"] + wall["checks"]
    assert fit_called <= got["data_start_unix"]  # Ray Train's fit was called before the data phase began
    assert got["data_timings_s"]["total"] >= 3.0
    # the workers waited for the data's end, not longer: the data phase is not added to their start
    assert (
        wall["data_wait"]
        <= max(0.0, got["data_timings_s"]["total"] + got["data_timings_s"]["plan_and_checks"] - wall["workers_start"]) + 0.5
    )
    assert sum(v for k, v in wall.items() if k != "total") == pytest.approx(wall["total"], abs=0.05)  # set-up is timed on another clock
    # a module imported from two threads at once failed a run (bench/NOTES.md §31): fit's thread must import none
    assert got["fit_thread_imports"] == [], "\n".join(got["fit_thread_imports"])
    assert wall["data"] == 0.0  # beside the workers' start, not before it


def test_a_data_phase_that_tokenizes_through_ray_data_comes_before_the_workers_start(tmp_path):
    """Ray Data's tasks need the CPUs the workers' placement group would hold (2 workers × 1 CPU of
    the quickstart's 2): with data.preprocess: ray the data phase runs first, and the run trains."""
    got, p = run("train", tmp_path, 0.0, "data.preprocess=ray", f"data.cache_dir={tmp_path / 'store'}")
    assert got["steps"] == 2, got
    assert "with Ray Data on 2 CPUs" in p.stderr
    wall = got["wall_s"]
    assert wall["data"] >= got["data_timings_s"]["total"] > 0  # on the run's path, before fit
    assert got["start_unix"] + wall["ray"] + wall["checks"] + wall["data"] > got["data_start_unix"]
    assert sum(v for k, v in wall.items() if k != "total") == pytest.approx(wall["total"], abs=0.05)


def test_rayft_stop_during_the_data_phase_stops_the_driver_as_a_sigterm_would(tmp_path):
    """The stop flag is read while the data phase runs, not only once the workers train."""
    t0 = time.time()
    got, p = run("stop", tmp_path, 0.0)
    assert len(got["asked"]) == 1 and "not_stopped" not in got
    assert got["stopped"] == ["SIGTERM", 143, True]
    assert time.time() - t0 < 60  # not after the data phase's 30 s and the workers' start
    assert not (tmp_path / "runs" / "r").exists()


def session_processes(pid: int) -> list[str]:
    import re

    import psutil

    mark = re.compile(rf"/session_[^/\s]*_{pid}(?:[/\s]|$)")
    return [line[:200] for proc in psutil.process_iter(["cmdline"]) if mark.search(line := " ".join(proc.info["cmdline"] or []))]


@pytest.mark.parametrize("mode", ["fail", "fail-once-waiting"], ids=["while-the-workers-start", "while-they-wait"])
def test_a_data_error_after_the_workers_started_is_the_runs_error_and_no_worker_trains(tmp_path, mode):
    """The error comes at once (the workers are still starting) or once both wait for their
    arguments; either way it is the data's error, no worker trains, the run directory holds no run,
    and no Ray process outlives the driver."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN, mode, str(tmp_path / "runs"), "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    got = last_json(out)
    assert got["error"] == "data/bad.jsonl:3: a bad record (the test's)"
    assert "step 1/" not in err and not list((tmp_path / "runs").rglob("checkpoint_*"))
    assert not (tmp_path / "runs" / "r" / "rayft.yaml").exists()  # the run directory was not prepared
    if mode == "fail-once-waiting":  # both workers had asked for their arguments when the data failed
        assert got["waiting_ranks"] == [0, 1]
    deadline = time.time() + 5  # Ray's shutdown at exit stopped them
    while (left := session_processes(proc.pid)) and time.time() < deadline:
        time.sleep(0.5)
    assert left == []

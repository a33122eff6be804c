"""Which actors reuse the worker processes an embedded Ray starts ahead (issue 23; bench/NOTES.md §40):
  python bench/ray_worker_reuse.py --reps 3 --out bench/results/DATE-ray-worker-reuse-2cpu.json
A local Ray started as rayft's embedded one starts (``ray.init(num_cpus=N)``, no job runtime env)
starts N idle Python workers at once. Each case creates one actor in a fresh Ray, after those are
up, and records the seconds to its first answer and whether its process was one of them (a
process titled ``ray::IDLE`` just before the call). Cases: no runtime env; ``{"env_vars": {}}``; ``{"env_vars": {"X": "1"}}`` (what Ray
Train's ``worker_runtime_env`` gives); an actor with ``{"env_vars": {}}`` created by an actor that
has an env var of its own (Ray Train's controller always has one: the workers inherit it); and no
runtime env under a job-level one (``ray.init(runtime_env=...)``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ray

from rayft.benchmarks.record import write_result

SETTLE_S = 5.0  # for the idle workers to be up


@ray.remote(num_cpus=0)
class Probe:
    def where(self) -> dict:
        return {"pid": os.getpid(), "X": os.environ.get("X")}


@ray.remote(num_cpus=0)
class Parent:
    """Creates the probe from inside an actor, as Ray Train's controller creates its workers."""

    def make(self, runtime_env: dict | None) -> dict:
        return ask_probe(runtime_env)


def idle_workers() -> set[int]:
    """The pids of this host's Ray worker processes that wait for work (``ray::IDLE``)."""
    import psutil

    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.info["cmdline"] and p.info["cmdline"][0].startswith("ray::IDLE"):
            found.add(p.info["pid"])
    return found


def ask_probe(runtime_env: dict | None) -> dict:
    """Create a :class:`Probe` (with ``runtime_env`` where given) and wait for its answer."""
    idle = idle_workers()
    t = time.perf_counter()
    opts = {"runtime_env": runtime_env} if runtime_env is not None else {}
    info = ray.get(Probe.options(**opts).remote().where.remote())
    return {**info, "answer_s": time.perf_counter() - t, "reused": info["pid"] in idle, "idle_before": len(idle)}


CASES = {
    "no runtime env": (None, None, False),
    "env_vars {}": (None, {"env_vars": {}}, False),
    "env_vars X=1": (None, {"env_vars": {"X": "1"}}, False),
    "env_vars {} under a parent with X=1": (None, {"env_vars": {}}, True),
    "no runtime env under a job env X=1": ({"env_vars": {"X": "1"}}, None, False),
}


def one_case(name: str, num_cpus: int) -> dict:
    job_env, actor_env, via_parent = CASES[name]
    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level="ERROR", runtime_env=job_env)
    try:
        if via_parent:
            parent = Parent.options(runtime_env={"env_vars": {"X": "1"}}).remote()
            ray.get(parent.make.remote(None))  # the parent itself up (a fresh process: it has an env)
            time.sleep(SETTLE_S)
            got = ray.get(parent.make.remote(actor_env))
        else:
            time.sleep(SETTLE_S)
            got = ask_probe(actor_env)
    finally:
        ray.shutdown()
    return {
        "case": name,
        "answer_s": round(got["answer_s"], 3),
        "reused_idle_worker": got["reused"],
        "idle_workers_before": got["idle_before"],
        "X_seen": got["X"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=4)
    a = ap.parse_args()
    rows = []
    for rep in range(a.reps):
        for name in CASES:
            rows.append({"rep": rep, **one_case(name, a.num_cpus)})
            print(json.dumps(rows[-1]), flush=True)
    summary = {
        name: {
            "median_answer_s": round(statistics.median(r["answer_s"] for r in rows if r["case"] == name), 3),
            "reused": [r["reused_idle_worker"] for r in rows if r["case"] == name],
        }
        for name in CASES
    }
    print(json.dumps(summary, indent=1))
    command = f"python bench/ray_worker_reuse.py --reps {a.reps} --num-cpus {a.num_cpus} --out OUT.json"
    print(write_result(a.out, command, {"num_cpus": a.num_cpus, "settle_s": SETTLE_S, "rows": rows, "summary": summary}))


if __name__ == "__main__":
    main()

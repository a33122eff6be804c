"""rayft doctor straight from a Ray job (--job, --run) and on real flight-recorder dumps (issue 20, parts 4-5).

The shared local cluster with token auth (`rayft cluster local`, a head and one 1-CPU worker node:
tests/conftest.py) runs one Jobs-API job:
a 2-worker Ray Train run (TorchTrainer, gloo on CPU, one real all_reduce) whose workers print the
NCCL lines of a 2-rank single-host job forced onto sockets, as NCCL would (with their real hostname
and pids). The job's driver records its Ray job in a run directory and runs the end-of-run check
(`ray.verify_transport`'s code) against its own workers; then `rayft doctor --job` and `--run`
fetch the workers' logs through Ray's state and log API with the token and judge them.

The flight recorder: 2 processes in a gloo group, rank 1 sleeping past the collective timeout; each
writes its flight-recorder buffer with torch's own `_dump_fr_trace()` (PyTorch's gloo backend
records collectives but writes dumps on timeout only for NCCL: checked on torch 2.13).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import env_without_ray_address

ROOT = Path(__file__).resolve().parents[2]
USES_LOCAL_CLUSTER = True  # the shared `rayft cluster local` (tests/conftest.py)
SRC = ROOT / "src" / "rayft"

JOB = textwrap.dedent(
    """
    import os, socket, sys, threading
    import ray, ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
    from rayft.train.transport_check import record_ray_job, verify_ray_job

    def train_func(config):
        import torch, torch.distributed as dist
        r, n = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
        ip = ray.util.get_node_ip_address()
        head = f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()} [{r}] NCCL INFO "
        for msg in (
            "NCCL_P2P_DISABLE set by environment to 1", "NCCL_SHM_DISABLE set by environment to 1",
            f"Bootstrap: Using eth0:{ip}<0>", "NET/Plugin: Could not find: libnccl-net.so",
            f"NET/Socket : Using [0]eth0:{ip}<0>", "Using network Socket",
            f"comm 0x7f000000{r}000 rank {r} nRanks {n} nNodes 1 localRanks {n} localRank {r} MNNVL 0",
            f"ncclCommInitRank comm 0x7f000000{r}000 rank {r} nranks {n} cudaDev {r} busId {r}0000 commId 0x5eed - Init COMPLETE",
            f"Channel 00/0 : {r}[{r}] -> {1 - r}[{1 - r}] [send] via NET/Socket/0",
            f"Channel 00/0 : {1 - r}[{1 - r}] -> {r}[{r}] [receive] via NET/Socket/0",
        ):
            print(head + msg, flush=True)
        t = torch.ones(4)
        dist.all_reduce(t)  # a real collective, gloo
        assert t[0].item() == n

    run_dir = sys.argv[1]
    ray.init()
    os.makedirs(run_dir, exist_ok=True)
    print("RECORDED", record_ray_job(run_dir), flush=True)
    TorchTrainer(
        train_func,
        scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
        torch_config=TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(name="doctor-job", storage_path=os.path.dirname(run_dir)),
    ).fit()
    print("VERIFIED", [r.exit_code for r in verify_ray_job("socket", run_dir, embedded=False)], flush=True)
    try:
        verify_ray_job("efa", run_dir, embedded=False)
    except Exception as e:
        print("REFUSED", type(e).__name__, e, flush=True)
    """
)


def rayft(env, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "rayft.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# `rayft train` on an embedded Ray with ray.verify_transport=any: the last test's run (a 2-step quickstart, short rows)
CHECKED_SETS = [
    "train.max_steps=2",
    "train.warmup_steps=1",
    "train.num_workers=1",  # what is checked reads any number of workers' logs: one costs ~10 CPU-s of CI less
    "train.cpus_per_worker=0.5",
    "data.seq_len=64",
    "model.name_or_path=mistral-tiny",  # a 32,768-token vocabulary: a quarter of qwen2-tiny's CPU per step
    "checkpoint.every_steps=null",
    "checkpoint.save_final=false",
    "checkpoint.export_hf=false",
    "checkpoint.name=checked",
    "ray.verify_transport=any",
]


@pytest.fixture(scope="module")
def checked_train(tmp_path_factory):
    """The last test's `rayft train` (its own process and embedded Ray), started before the cluster of
    ``job`` so that the two run at the same time (both mostly wait on process starts): (its folder,
    the process, its environment). Its stdout and stderr go to files there."""
    tmp = tmp_path_factory.mktemp("checked")
    env = env_without_ray_address() | {"PYTHONPATH": str(ROOT / "src")}
    sets = [*CHECKED_SETS, f"checkpoint.storage_path={tmp / 'runs'}"]
    cmd = [sys.executable, "-m", "rayft.cli", "train", "examples/quickstart.yaml", *(a for s in sets for a in ("--set", s))]
    with open(tmp / "stdout.txt", "w") as out, open(tmp / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
    try:
        yield tmp, proc, env
    finally:
        if proc.poll() is None:  # its test did not run or did not wait: stop it as a user would (it stops its Ray)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


@pytest.fixture(scope="module")
def job(checked_train, local_cluster, tmp_path_factory):
    """(cluster, env, submission id, run dir, logs) of the finished job, run on the shared local
    cluster (tests/conftest.py: a head and one 1-CPU worker node; ``checked_train`` runs meanwhile)."""
    cluster, env = local_cluster
    env = {**env, "PYTHONPATH": str(ROOT / "src")}  # the doctor CLI's own environment
    from ray.job_submission import JobSubmissionClient

    base = tmp_path_factory.mktemp("doctor-job")
    work = base / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    run_dir = base / "runs" / "doctor-job"
    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
    sid = client.submit_job(
        entrypoint=f"python job.py {run_dir}",
        runtime_env={"working_dir": str(work), "py_modules": [str(SRC)], "env_vars": {"RAY_TRAIN_V2_ENABLED": "1"}},
    )
    deadline = time.monotonic() + 300
    while str(client.get_job_status(sid).value) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.monotonic() < deadline:
        time.sleep(1)
    logs = client.get_job_logs(sid)
    assert str(client.get_job_status(sid).value) == "SUCCEEDED", logs[-3000:]
    return cluster, env, sid, run_dir, logs


@pytest.mark.integration
def test_the_runs_own_check_and_doctor_job_and_run(job):
    cluster, env, sid, run_dir, logs = job
    # the end-of-run check in the job's driver (Ray's own auth, the dashboard found from the GCS)
    assert "VERIFIED [0]" in logs, logs[-3000:]
    refused = next(ln for ln in logs.splitlines() if ln.startswith("REFUSED"))
    assert refused.startswith("REFUSED TrainError ray.verify_transport=efa: the run's NCCL transport failed the check: ranks 0-1 (on "), (
        refused
    )
    assert "had no peer on another host (single-node job), so EFA was never used" in refused
    verdicts = json.loads((run_dir / "rayft_transport.json").read_text())
    assert [(v["rank"], v["inter_node"], v["intra_node"]) for v in verdicts[0]["verdicts"]] == [
        (0, "none", "network"),
        (1, "none", "network"),
    ]
    [recorded] = json.loads((run_dir / "rayft_ray_jobs.json").read_text())["jobs"]

    # rayft doctor --job, from outside, with the token
    auth = ["--address", cluster.dashboard_url, "--token-file", cluster.token_file]
    r = rayft(env, "doctor", "--job", sid, *auth, "--expect", "socket", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(r.stdout)
    assert [(d["rank"], d["inter_node"], d["intra_detail"], d["world_size"], d["n_nodes"]) for d in rows] == [
        (0, "none", "NET/Socket", 2, 1),
        (1, "none", "NET/Socket", 2, 1),
    ]
    # the node's ip from Ray's node list (the line prefix) is the one each worker printed itself
    assert all(d["ip"] and d["interface"] == f"eth0 {d['ip']}" for d in rows), rows
    assert len({d["pid"] for d in rows}) == 2 and all(d["host"] for d in rows)
    assert f"read the logs of 2 Ray Train workers of Ray job {recorded['job_id']} ({sid})" in r.stderr

    # rayft doctor --run, from the run directory's record
    r = rayft(env, "doctor", "--run", str(run_dir), *auth, "--expect", "nvlink")
    err = " ".join(r.stderr.split())
    assert r.returncode == 1, r.stderr[-2000:]
    assert "ranks 0-1" in err and "used NET/Socket between local GPUs, not P2P/NVLink" in err
    assert "NCCL_P2P_DISABLE=1 set by the environment" in err

    # no token: refused, and the message says what to do
    r = rayft(
        {**env, "HOME": str(run_dir), "RAYFT_LOCAL_CLUSTER_DIR": str(run_dir / "none")},
        "doctor",
        "--job",
        sid,
        "--address",
        cluster.dashboard_url,
    )
    assert r.returncode == 2 and "the cluster needs a token: set RAY_AUTH_TOKEN or pass --token-file" in r.stderr, r.stderr[-2000:]


FR_RANK = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    import torch._C._distributed_c10d as c10d
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=3))
    t = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    if rank == 1:
        time.sleep(6)  # never enters the next all_reduce in time
    else:
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            print("timed out:", e, flush=True)
    with open(os.path.join(out, f"rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace())
    """
)


@pytest.mark.integration
def test_flight_recorder_on_real_gloo_dumps(tmp_path):
    script = tmp_path / "fr_rank.py"
    script.write_text(FR_RANK)
    dumps = tmp_path / "flight_recorder"
    dumps.mkdir()
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "200", "PYTHONPATH": str(ROOT / "src")}
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port, str(dumps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "timed out:" in outs[0]
    r = rayft(os.environ | {"PYTHONPATH": str(ROOT / "src")}, "doctor", "--flight-recorder", str(dumps), "--json")
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data["ranks"] == [0, 1]
    [f] = data["findings"]
    assert (f["group"], f["seq"], f["op"], f["hung"]) == ("0 (default_pg)", 5, "gloo:all_reduce", [1])
    assert f["text"].startswith("process group 0 (default_pg): collective #5 gloo:all_reduce (input [[8]] Float)")
    assert "was entered by rank 0 and never by rank 1 (last entered: rank 1: #4 gloo:broadcast" in f["text"]


@pytest.mark.integration
def test_rayft_train_records_its_job_and_its_check_reads_the_embedded_rays_files(checked_train):
    # `rayft train` on an embedded Ray (no dashboard): the run records its job, and ray.verify_transport reads the
    # workers' session log files; a gloo run logs no NCCL line, so the check fails the run and says why
    tmp, proc, env = checked_train  # rayft train examples/quickstart.yaml --set ... (CHECKED_SETS, storage_path in tmp)
    returncode = proc.wait(timeout=400)
    stdout, stderr = (tmp / "stdout.txt").read_text(), (tmp / "stderr.txt").read_text()
    run_dir = tmp / "runs" / "checked"
    err = " ".join(stderr.split())
    assert returncode == 1, stdout[-2000:] + stderr[-3000:]
    assert "rayft run summary" in stdout + stderr  # the run finished first
    assert "error: ray.verify_transport=any: the workers' logs hold no NCCL line (a gloo run on CPU workers" in err, err[-2000:]
    [recorded] = json.loads((run_dir / "rayft_ray_jobs.json").read_text())["jobs"]
    assert Path(recorded["logs_dir"]).is_dir()
    r = rayft(env, "doctor", "--run", str(run_dir))
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, err
    assert f"read the logs of 1 Ray Train worker of Ray job {recorded['job_id']}" in err
    assert "no NCCL lines found (run with NCCL_DEBUG=INFO and pass the workers' output)" in err

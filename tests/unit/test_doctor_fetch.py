"""rayft doctor --run: the run directory's record of its Ray job, and an embedded Ray's session log
files read from disk (issue 20, part 4). The log API path is tested against a real local Ray job in
tests/integration/test_doctor_job.py.

The session folder here is laid out as Ray lays it out (``logs/worker-<worker id>-<job id>-<pid>.out``
and ``.err``, each starting with Ray's ``:job_id:`` and ``:actor_name:`` marker lines).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.nccl.errors import DoctorError
from rayft.nccl.fetch import RUN_RECORD, fetch_run, read_records, record_job

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
SOCKET_LOG = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "nccl-logs" / "nccl-h200x2-socketforced-fsdp2.log"
runner = CliRunner()
JOB = "03000000"


def session_logs(tmp_path: Path) -> Path:
    """A Ray session's logs folder holding one 2-worker Ray Train job (the workers' NCCL lines of
    the shipped real socket-forced log, as each worker's own files hold them), another job's worker,
    and a non-Train actor of the same job."""
    logs = tmp_path / "session_2026-11-30_10-36-57_123456_1" / "logs"
    logs.mkdir(parents=True)
    real = SOCKET_LOG.read_text().splitlines()
    for pid in (10912, 10911):
        own = [ln.split(") ", 1)[1] for ln in real if ln.startswith(f"(RayTrainWorker pid={pid})")]
        out = [ln for ln in own if " NCCL " in ln]
        err = [ln for ln in own if " NCCL " not in ln]
        wid = f"{pid:x}".rjust(56, "a")
        (logs / f"worker-{wid}-{JOB}-{pid}.out").write_text(f":job_id:{JOB}\n:actor_name:RayTrainWorker\n" + "\n".join(out) + "\n")
        (logs / f"worker-{wid}-{JOB}-{pid}.err").write_text(f":job_id:{JOB}\n:actor_name:RayTrainWorker\n" + "\n".join(err) + "\n")
    controller = [ln.split(") ", 1)[1] for ln in real if ln.startswith("(TrainController pid=")]
    (logs / f"worker-{'c' * 56}-{JOB}-10700.err").write_text(f":job_id:{JOB}\n:actor_name:TrainController\n" + "\n".join(controller) + "\n")
    (logs / f"worker-{'d' * 56}-{JOB}-10800.out").write_text(f":job_id:{JOB}\n:actor_name:SynchronizationActor\nvm:1:1 [0] NCCL INFO x\n")
    (logs / f"worker-{'e' * 56}-04000000-10900.out").write_text(
        ":job_id:04000000\n:actor_name:RayTrainWorker\nvm:10900:1 [0] NCCL INFO x\n"
    )
    return logs


def test_record_holds_every_ray_job_of_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record_job(run, "01000000", None, "/tmp/ray/session_a/logs", "10.0.0.1")
    record_job(run, "02000000", "raysubmit_X", None, "10.0.0.2")  # a resumed run: a second job
    record_job(run, "02000000", "raysubmit_X", None, "10.0.0.2")  # the same job again: once
    jobs = read_records(run)
    assert [(j["job_id"], j["submission_id"], j["logs_dir"], j["node_ip"]) for j in jobs] == [
        ("01000000", None, "/tmp/ray/session_a/logs", "10.0.0.1"),
        ("02000000", "raysubmit_X", None, "10.0.0.2"),
    ]
    with pytest.raises(DoctorError, match=r"rayft_ray_jobs.json not found: .* is not a run directory of `rayft train`"):
        read_records(tmp_path)
    (tmp_path / RUN_RECORD).write_text("{}")
    with pytest.raises(DoctorError, match="cannot read .*rayft_ray_jobs.json"):
        read_records(tmp_path)


@pytest.mark.skipif(not SOCKET_LOG.exists(), reason=f"{SOCKET_LOG} not found")
def test_an_embedded_rays_run_is_read_from_its_session_files(tmp_path):
    logs = session_logs(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    record_job(run, JOB, None, str(logs), "192.0.2.2")
    got = fetch_run(run)
    [attempt] = got.attempts
    assert (got.job_id, [w.pid for w in attempt.workers], attempt.controller.pid) == (JOB, [10911, 10912], 10700)
    assert got.notes == [f"read from the Ray session's log files in {logs} (the workers of this node)"]
    lines = attempt.text.splitlines()
    assert lines[0] == "(TrainController pid=10700, ip=192.0.2.2) Requesting resources: {'GPU': 1} * 2"
    assert not any(":actor_name:" in ln or ":job_id:" in ln for ln in lines)

    res = runner.invoke(app, ["doctor", "--run", str(run), "--expect", "socket", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["log"], r["rank"], r["pid"], r["ip"], r["inter_node"], r["intra_detail"]) for r in rows] == [
        (f"job {JOB}", 0, 10912, "192.0.2.2", "none", "NET/Socket"),
        (f"job {JOB}", 1, 10911, "192.0.2.2", "none", "NET/Socket"),
    ]
    assert f"read the logs of 2 Ray Train workers of Ray job {JOB}" in res.stderr
    res = runner.invoke(app, ["doctor", "--run", str(run), "--expect", "nvlink"])
    assert res.exit_code == 1 and "used NET/Socket between local GPUs, not P2P/NVLink" in " ".join(res.stderr.split())


def test_a_cluster_run_without_an_address_says_to_give_one(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    record_job(run, "05000000", None, str(tmp_path / "elsewhere"), "10.0.0.9")
    res = runner.invoke(app, ["doctor", "--run", str(run)])
    assert res.exit_code == 2
    assert " ".join(res.stderr.split()) == (
        f"error: cannot read Ray job 05000000's worker logs (its log directory {tmp_path / 'elsewhere'} is not on this machine): "
        "pass the cluster's dashboard, --address http://HOST:8265 (or set RAY_ADDRESS)"
    )
    res = runner.invoke(app, ["doctor", "--run", str(tmp_path)])
    assert res.exit_code == 2 and "is not a run directory of `rayft train`" in res.stderr
    res = runner.invoke(app, ["doctor", str(FIXTURES / "efa_2x8.log"), "--run", str(run)])
    assert res.exit_code == 2 and "give log files, --job or --run: one of them" in res.stderr

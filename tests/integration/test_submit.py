"""`rayft submit` against a real local multi-node Ray cluster with token auth (`rayft cluster local up`).

The cluster: a head with 0 CPUs / 0 GPUs and a worker node of 1 CPU, each node its own
`ray start`, all on 127.0.0.1, started and stopped through the CLI (the same code path as a user's
`rayft cluster local up|down`). The quickstart runs 2 steps with 1 worker of 0.5 CPU, so the Ray
Train worker lands on the worker node (the head offers no CPU). One worker: what is checked is the
submission, not the training (a second worker costs ~13 CPU-s of CI on 2 cores).
"""

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import env_without_ray_address

from rayft.cluster import local
from rayft.cluster import submit as sub

ROOT = Path(__file__).resolve().parents[2]
USES_LOCAL_CLUSTER = True  # the shared `rayft cluster local` (tests/conftest.py)
QUICK = [
    "--set",
    "train.max_steps=2",
    "--set",
    "train.warmup_steps=1",
    "--set",
    "checkpoint.every_steps=null",
    "--set",
    "checkpoint.export_hf=false",
    "--set",
    "train.num_workers=1",
    "--set",
    "train.cpus_per_worker=0.5",
    "--set",
    "data.seq_len=64",  # short rows: these jobs only need to run
    "--set",
    "model.name_or_path=mistral-tiny",  # a 32,768-token vocabulary: a quarter of qwen2-tiny's CPU per step
]


def rayft(env, *args, timeout=240, input=None):
    return subprocess.run(
        [sys.executable, "-m", "rayft.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )


def http_status(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# --------------------------------------------------------------------------- fast, no cluster


def test_address_resolution(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(sub.SubmitError, match="no cluster address"):
        sub.resolve_address(None, None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:8265")
    assert sub.resolve_address(None, None) == ("http://10.0.0.1:8265", "RAY_ADDRESS")
    assert sub.resolve_address(None, "https://ray.example/") == ("https://ray.example", "ray.address")
    assert sub.resolve_address("127.0.0.1:1", "x:2")[0] == "http://127.0.0.1:1"
    for bad in ("auto", "ray://head:10001"):
        with pytest.raises(sub.SubmitError, match="dashboard URL"):
            sub.resolve_address(bad, None)


def test_token_precedence(monkeypatch, tmp_path):
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("RAYFT_LOCAL_CLUSTER_DIR", str(tmp_path / "none"))
    monkeypatch.setattr(sub, "DEFAULT_TOKEN_FILE", tmp_path / "absent")
    assert sub.resolve_token("http://h:1") == (None, None)
    f = tmp_path / "tok"
    f.write_text("from-path\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(f))
    assert sub.resolve_token("http://h:1")[0] == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert sub.resolve_token("http://h:1")[0] == "from-env"
    g = tmp_path / "cli"
    g.write_text("from-cli")
    assert sub.resolve_token("http://h:1", g)[0] == "from-cli"
    g.write_text("")
    with pytest.raises(sub.SubmitError, match="empty"):
        sub.resolve_token("http://h:1", g)


def test_entrypoint_and_runtime_env():
    e = sub.build_entrypoint("examples/q.yaml", ["a.b=1", "c=x y"], clear_address=True)
    assert e == "python -m rayft.cli train examples/q.yaml --set a.b=1 --set 'c=x y' --set ray.address=null"
    env = sub.runtime_env(ROOT)
    assert env["working_dir"] == str(ROOT)
    assert {"runs/", ".venv/", ".gpu/", ".git/"} <= set(env["excludes"])
    assert env["py_modules"][0].endswith("rayft")
    assert sub.project_root(ROOT / "examples" / "quickstart.yaml") == ROOT
    assert "RAY_JOB_STOP_WAIT_TIME_S" not in env["env_vars"]
    assert (
        sub.runtime_env(ROOT, stop_wait_s=30)["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"] == "30"
    )  # Ray's default 3 s would cut rayft's stop short


def test_the_repository_submission_packs_the_repository_without_its_outputs():
    """`rayft submit examples/quickstart.yaml` from this repository (pyproject.toml: the repository is
    the working_dir; the module's real job submits another folder): --dry-run lists the config and the
    data it reads, no run output, venv or git data, and nothing over Ray's upload limit."""
    env = env_without_ray_address()
    dry = rayft(env, "submit", "examples/quickstart.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = dry.stdout.splitlines()
    assert {"examples/quickstart.yaml", "examples/data/quickstart_chat.jsonl", "pyproject.toml", "src/rayft/cli.py"} <= set(listed)
    assert not [f for f in listed if f.startswith(("runs/", ".venv/", ".gpu/", ".git/"))]
    assert f"working_dir {ROOT}: {len(listed)} files" in dry.stderr and "submitting would fail" not in dry.stderr


class FakeClient:
    def __init__(self, interrupt):
        self.interrupt, self.stopped, self.status = interrupt, False, "RUNNING"

    async def tail_job_logs(self, job_id):
        yield "hello\n"
        if self.interrupt:
            raise KeyboardInterrupt
        self.status = "FAILED"

    def stop_job(self, job_id):
        self.stopped, self.status = True, "STOPPED"

    def get_job_status(self, job_id):
        class S:
            value = self.status

        return S()

    def get_job_info(self, job_id):
        class I:
            message = "boom"

        return I()


@pytest.mark.parametrize(
    ("interrupt", "answer", "code", "stopped"), [(False, None, 1, False), (True, True, 1, True), (True, False, 130, False)]
)
def test_follow_ctrl_c_and_exit_status(interrupt, answer, code, stopped, capsys):
    import io

    c, out, said = FakeClient(interrupt), io.StringIO(), []
    s = sub.Submission("http://h:1", "j1", "e", "/w", None)
    assert sub.run(c, s, confirm=lambda q: answer, say=said.append, out=out) == code
    assert out.getvalue() == "hello\n" and c.stopped == stopped
    assert sub.exit_code("SUCCEEDED") == 0 and sub.exit_code("STOPPED") == 1


def test_cli_has_one_cluster_group_with_local():
    from typer.testing import CliRunner

    from rayft.cli import app

    assert [g.name for g in app.registered_groups].count("cluster") == 1
    r = CliRunner().invoke(app, ["cluster", "--help"])
    assert r.exit_code == 0 and "local" in r.output and "plan" in r.output
    r = CliRunner().invoke(app, ["cluster", "local", "down", "--state-dir", "/nonexistent-rayft"])
    assert r.exit_code == 0


# --------------------------------------------------------------------------- real local cluster


@pytest.fixture(scope="module")
def cluster(local_cluster):
    """The shared `rayft cluster local up --workers 1 --cpus-per-worker 1` (tests/conftest.py), with the
    environment that names its state directory (RAYFT_LOCAL_CLUSTER_DIR)."""
    return local_cluster


@pytest.mark.integration
def test_up_is_idempotent_and_secured(cluster):
    c, env = cluster
    assert c.dashboard_url.startswith("http://127.0.0.1:")
    assert oct(os.stat(c.token_file).st_mode & 0o777) == "0o600"
    assert [n["name"] for n in c.nodes] == ["head", "worker-1"]
    assert local.alive_nodes(c) == 2
    r = rayft(env, "cluster", "local", "up", "--workers", "1", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "already running" in r.stderr
    assert f"export RAY_ADDRESS={c.dashboard_url}" in r.stdout


@pytest.mark.integration
def test_request_without_token_is_refused(cluster):
    c, env = cluster
    jobs = f"{c.dashboard_url}/api/jobs/"
    status, body = http_status(jobs)
    assert status == 401, body
    assert "Missing authentication token" in body
    status, body = http_status(jobs, token="not-the-token")
    assert status == 403, body
    status, _ = http_status(jobs, token=c.token)
    assert status == 200
    # a submission without a token (address given, no token source at all) is refused too
    bare = {**env, "RAYFT_LOCAL_CLUSTER_DIR": str(Path(c.state_dir) / "elsewhere"), "HOME": c.state_dir}
    r = rayft(bare, "submit", "examples/quickstart.yaml", "--address", c.dashboard_url, *QUICK, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Missing authentication token" in r.stderr
    r = rayft(
        {**bare, "RAY_AUTH_TOKEN": "not-the-token"}, "submit", "examples/quickstart.yaml", "--address", c.dashboard_url, *QUICK, timeout=60
    )
    assert r.returncode == 1 and "Invalid authentication token" in r.stderr, r.stderr


def project(tmp: Path) -> tuple[Path, str, dict[str, str]]:
    """A config in a folder without a pyproject.toml (that folder is the working_dir), with secrets and
    ignored files next to it: (the folder, its marker file's name, the files written)."""
    import secrets

    proj = tmp / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "data" / "quickstart_chat.jsonl", proj / "data" / "chat.jsonl")
    quick = (ROOT / "examples" / "quickstart.yaml").read_text().replace("data/quickstart_chat.jsonl", "data/chat.jsonl")
    (proj / "job.yaml").write_text(quick)
    marker = f"marker-{secrets.token_hex(4)}.txt"  # tells this job's package from the other tests' on the same nodes
    files = {
        marker: "this job's package\n",
        ".env": "AWS_ACCESS_KEY_ID=AKIAEXAMPLE\nAWS_SECRET_ACCESS_KEY=not-a-real-secret\n",
        "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
        ".gitignore": "gitignored.txt\n!.env\n",
        ".rayftignore": "rayftignored/\n",
        "gitignored.txt": "x\n",
        "rayftignored/big.bin": "x\n",
    }
    for rel, text in files.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(text)
    return proj, marker, files


@pytest.fixture(scope="module")
def submitted(cluster, tmp_path_factory):
    """The module's one real submission (a Ray job costs ~50 CPU-s of CI on 2 cores): ``project()``'s
    folder, a 2-step quickstart job on 1 Ray Train worker, with the cluster's token file. The
    repository's own submission (`rayft submit examples/quickstart.yaml`, the repository as the
    working_dir) differs only in what is packed: its listing is checked with --dry-run below.
    Returns (folder, marker, its `rayft submit`)."""
    c, env = cluster
    proj, marker, _ = project(tmp_path_factory.mktemp("submit"))
    auth = ["--address", c.dashboard_url, "--token-file", c.token_file, *QUICK]
    return proj, marker, rayft(env, "submit", str(proj / "job.yaml"), *auth, timeout=480)


@pytest.mark.integration
def test_submit_with_token_streams_the_job_to_its_end(cluster, submitted):
    from ray.job_submission import JobSubmissionClient

    c, env = cluster
    _, _, r = submitted  # rayft submit PROJECT/job.yaml --address URL --token-file FILE *QUICK
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rayft run summary" in r.stdout  # the job's logs, streamed
    assert "2/2" in r.stdout
    # no terminal in a job's logs: plain progress lines, and the summary's paths whole, with where they live
    assert "step 2/2 (100%)  loss " in r.stdout
    run_dir = next(ln for ln in r.stdout.splitlines() if ln.startswith("run directory: ")).removeprefix("run directory: ").strip()
    assert "/runtime_resources/working_dir_files/" in run_dir and run_dir.rsplit("/", 2)[-2] == "runs" and "…" not in run_dir
    assert "which Ray deletes with its session" in r.stdout
    # Ray's packaging and upload narration is not shown
    assert not any(s in r.stderr + r.stdout for s in ("Creating a file package", "Pushing file package", "Uploading package"))
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("job ") and ln.rstrip().endswith("SUCCEEDED"))
    job_id = line.split()[1].rstrip(":")
    client = JobSubmissionClient(c.dashboard_url, headers={"Authorization": f"Bearer {c.token}"})
    info = client.get_job_info(job_id)
    assert str(info.status.value) == "SUCCEEDED"
    assert info.entrypoint.startswith("python -m rayft.cli train job.yaml --set train.max_steps=2"), info.entrypoint
    logs = client.get_job_logs(job_id)
    assert "rayft run summary" in logs and "1 × cpu" in logs
    # the Ray Train worker ran on the worker node: the head offers no CPU
    status, body = http_status(f"{c.dashboard_url}/api/v0/nodes?limit=100", token=c.token)
    nodes = json.loads(body)["data"]["result"]["result"]
    head = [n for n in nodes if n.get("is_head_node")]
    assert len(nodes) == 2 and len(head) == 1
    assert head[0]["resources_total"].get("CPU", 0) == 0


@pytest.mark.integration
def test_submit_uploads_exactly_the_listed_files_and_no_secret(cluster, submitted):
    """A config in a folder without a pyproject.toml: that folder is the working_dir. Its .env and
    id_rsa, and what .gitignore / .rayftignore ignore, are absent from what Ray unpacked on every node
    the job ran on; what Ray unpacked is exactly what `rayft submit --dry-run` lists."""
    from rayft.cluster.packaging import scan

    c, env = cluster
    proj, marker, r = submitted  # project()'s folder, submitted with --address, --token-file and QUICK
    listed = scan(proj).files
    assert set(listed) == {".gitignore", ".rayftignore", "data/chat.jsonl", "job.yaml", marker}

    dry = rayft(env, "submit", str(proj / "job.yaml"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert tuple(dry.stdout.splitlines()) == listed
    assert "never uploaded (secret patterns): .env, id_rsa" in dry.stderr

    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"working_dir {proj.resolve()}: 5 files" in r.stderr
    assert "rayft run summary" in r.stdout
    # what Ray unpacked for this job, node by node (the head runs the driver, the worker node the Ray Train workers)
    unpacked = {}
    for node in c.nodes:
        for d in Path(node["temp_dir"]).glob("session_*/runtime_resources/working_dir_files/*"):
            if (d / marker).is_file():
                got = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file() or p.is_symlink()}
                unpacked[node["name"]] = {f for f in got if not f.startswith("runs/")}  # the job's own output (./runs)
    assert "head" in unpacked and any(n.startswith("worker-") for n in unpacked), unpacked
    for name, got in unpacked.items():
        assert got == set(listed), name
        assert not {".env", "id_rsa", "gitignored.txt", "rayftignored/big.bin"} & got, name

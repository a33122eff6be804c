"""rayft bench fabric: bus-bandwidth arithmetic, transport verdicts on real NCCL logs, tokens/s
extraction, the two-run orchestration (with a fake subprocess runner) and the CLI wiring."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rayft.benchmarks import collectives as coll
from rayft.benchmarks.fabric import (
    FabricError,
    Mode,
    check_log,
    gpu_label,
    markdown_table,
    median_tokens_per_s,
    run_fabric,
    variant_env,
    variants,
)
from rayft.cli import app
from rayft.nccl.doctor import Expect

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
REAL = SHARED / "reference" / "nccl-logs"
NVLINK_LOG = REAL / "nccl-h200x2-nvlink-fsdp2.log"
SOCKET_LOG = REAL / "nccl-h200x2-socketforced-fsdp2.log"

real_logs = pytest.mark.skipif(
    not (NVLINK_LOG.exists() and SOCKET_LOG.exists()),
    reason=f"real NCCL logs not found under {REAL} (the shared reference folder is not checked out here)",
)


# ------------------------------------------------------------------------------ busbw arithmetic


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_reduce", 1, 0.0),
        ("all_gather", 2, 0.5),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("reduce_scatter", 16, 0.9375),
    ],
)
def test_bus_factor_follows_nccl_tests(op, n, factor):
    assert coll.bus_factor(op, n) == factor


def test_algbw_and_busbw_in_gb_per_s():
    # 1 GiB in 0.5 s: 2.147483648 GB/s (GB = 1e9 bytes).
    assert coll.algbw_gb_s(2**30, 0.5) == pytest.approx(2.147483648)
    # all-reduce of 256 MB on 8 ranks in 10 ms: algbw 25.6 GB/s, busbw 25.6 * 14/8 = 44.8 GB/s.
    assert coll.busbw_gb_s("all_reduce", 256_000_000, 0.010, 8) == pytest.approx(44.8)
    # all-gather of 1 GB (output) on 4 ranks in 40 ms: algbw 25 GB/s, busbw 25 * 3/4.
    assert coll.busbw_gb_s("all_gather", 10**9, 0.040, 4) == pytest.approx(18.75)


def test_bandwidth_arguments_are_checked():
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        coll.bus_factor("broadcast", 2)
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        coll.bus_factor("all_reduce", 0)
    with pytest.raises(ValueError, match="time must be positive"):
        coll.algbw_gb_s(100, 0.0)


def test_buffers_move_the_whole_size_in_a_multiple_of_n_elements():
    # 1000 bytes of float32 on 3 ranks: 250 elements rounded down to 249 (83 per rank).
    out, inp = coll._buffers("all_gather", 1000, 3, "cpu", torch.float32)
    assert (out.numel(), inp.numel()) == (249, 83)
    out, inp = coll._buffers("reduce_scatter", 1000, 3, "cpu", torch.float32)
    assert (out.numel(), inp.numel()) == (83, 249)
    out, inp = coll._buffers("all_reduce", 1000, 3, "cpu", torch.float32)
    assert out is inp and out.numel() == 249


def test_correctness_check_catches_a_collective_that_did_not_communicate():
    """On 2 ranks, rank 0's all-reduce result must be 1 + 2 = 3; a no-op leaves 1 and is caught."""
    out, inp = coll._buffers("all_reduce", 64, 2, "cpu", torch.float32)
    with pytest.raises(coll.SweepError, match=r"all_reduce on 2 ranks returned wrong values on rank 0: min 1.0, max 1.0, expected 3.0"):
        coll._check("all_reduce", lambda o, i: None, out, inp, rank=0, n=2)
    out, inp = coll._buffers("all_reduce", 64, 2, "cpu", torch.float32)
    assert coll._check("all_reduce", lambda o, i: o.add_(2), out, inp, rank=0, n=2) == {
        "expected_sum": 3.0,
        "min": 3.0,
        "max": 3.0,
    }


def test_sweep_arguments_are_checked_before_ray_is_touched():
    with pytest.raises(coll.SweepError, match="at least 2 workers, got 1"):
        coll.run_sweep(1, use_gpu=False)
    with pytest.raises(coll.SweepError, match="dtype must be float32 or bfloat16"):
        coll.run_sweep(2, use_gpu=False, dtype="float16")


# ------------------------------------------------------------------------------ verdicts


@real_logs
def test_fast_check_accepts_the_nvlink_log_and_rejects_the_socket_log():
    fast, _ = variants(Mode.ONEHOST)
    assert fast.expect == Expect.NVLINK
    assert check_log(NVLINK_LOG.read_text(), fast.expect, "fast") == "intra-node P2P/CUMEM over NVLink"
    with pytest.raises(FabricError) as e:
        check_log(SOCKET_LOG.read_text(), fast.expect, "fast training (x.log)")
    msg = str(e.value)
    assert msg.startswith("fast training (x.log) rejected: expected nvlink, but ranks 0-1 (on vm) used NET/Socket")
    assert "NCCL_P2P_DISABLE=1 set by the environment" in msg


@real_logs
def test_sockets_check_accepts_the_socket_log_and_rejects_the_nvlink_log():
    _, sockets = variants(Mode.ONEHOST)
    assert sockets.expect == Expect.SOCKET
    assert check_log(SOCKET_LOG.read_text(), sockets.expect, "sockets") == "intra-node NET/Socket"
    with pytest.raises(
        FabricError, match=r"sockets rejected: expected socket, but ranks 0-1 \(on vm\) used intra-node P2P/CUMEM over NVLink"
    ):
        check_log(NVLINK_LOG.read_text(), sockets.expect, "sockets")


def test_a_log_without_nccl_lines_is_rejected():
    with pytest.raises(FabricError, match="no NCCL lines in the output"):
        check_log("(RayTrainWorker pid=1) Setting up process group for: env:// [rank=0, world_size=2]\n", "nvlink", "fast")


def test_variants_and_their_environments():
    fast, sockets = variants("onehost")
    base = {"PATH": "/bin", "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "0", "NCCL_DEBUG": "WARN"}
    env = variant_env(base, fast)
    # the forcing switch left over in the caller's shell is dropped; other values are kept
    assert "NCCL_P2P_DISABLE" not in env and env["NCCL_SHM_DISABLE"] == "0" and env["PATH"] == "/bin"
    assert env["NCCL_DEBUG"] == "INFO" and env["RAY_DEDUP_LOGS"] == "0"
    env = variant_env(base, sockets)
    assert (env["NCCL_P2P_DISABLE"], env["NCCL_SHM_DISABLE"], env["NCCL_DEBUG"]) == ("1", "1", "INFO")
    fast, sockets = variants("efa")
    assert (fast.expect, sockets.expect) == (Expect.EFA, Expect.SOCKET)
    assert sockets.env["NCCL_NET"] == "Socket" and "NCCL_NET" not in variant_env({"NCCL_NET": "Socket"}, fast)
    assert variant_env({"NCCL_NET": "AWS Libfabric"}, fast)["NCCL_NET"] == "AWS Libfabric"
    with pytest.raises(ValueError):
        variants("nvlink")


# ------------------------------------------------------------------------------ tokens/s


def write_metrics(path: Path, tps: list[float], world: int = 2, gpu: str = "NVIDIA H200") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"step": i + 1, "loss": 2.0, "tokens_per_s_per_gpu": t, "world_size": world, "gpu": gpu} for i, t in enumerate(tps)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_median_tokens_per_s_skips_the_start_up_steps(tmp_path):
    m = tmp_path / "rayft_metrics.jsonl"
    write_metrics(m, [1e9, 1e9, 1e9, 5, 1, 4, 2, 3, 7, 6])
    assert median_tokens_per_s(m, skip_steps=3) == {
        "median_tokens_per_s_per_gpu": 4,
        "steps_measured": 7,
        "world_size": 2,
        "gpu": "NVIDIA H200",
    }
    write_metrics(m, [100, 10, 20, 30, 40])  # even count: mean of the middle two of 10, 20, 30, 40
    assert median_tokens_per_s(m, skip_steps=1)["median_tokens_per_s_per_gpu"] == 25
    assert median_tokens_per_s(m, skip_steps=0)["median_tokens_per_s_per_gpu"] == 30


def test_median_tokens_per_s_errors(tmp_path):
    m = tmp_path / "rayft_metrics.jsonl"
    with pytest.raises(FabricError, match="cannot read the run's metrics"):
        median_tokens_per_s(m)
    write_metrics(m, [1.0, 2.0, 3.0])
    with pytest.raises(FabricError, match="3 steps logged, none after the first 3"):
        median_tokens_per_s(m, skip_steps=3)


def test_gpu_label():
    assert gpu_label("NVIDIA H200", 2) == "2xh200"
    assert gpu_label("NVIDIA A100-SXM4-80GB", 8) == "8xa100-sxm4-80gb"
    assert gpu_label("cpu", 2) == "2xcpu"


# ------------------------------------------------------------------------------ orchestration


def sweep_figures(peak: float) -> dict:
    return {
        "backend": "nccl",
        "world_size": 2,
        "results": [],
        "peak_busbw_GB_s": {"all_reduce": peak, "all_gather": peak / 2, "reduce_scatter": peak / 4},
    }


class FakeRunner:
    """Stands in for the subprocesses: writes the given NCCL log as the run's output, and the
    metrics file (train) or figures file (sweep) the real command would write."""

    def __init__(self, logs: dict[str, str], tps: dict[str, list[float]], storage: Path):
        self.logs, self.tps, self.storage, self.calls = logs, tps, storage, []

    def __call__(self, cmd, env, log, timeout_s, done_file=None):
        self.calls.append((cmd, env, log))
        variant = "sockets" if env.get("NCCL_P2P_DISABLE") == "1" else "fast"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(self.logs[variant])
        if cmd[2] == "rayft.cli":
            name = next(s.split("=", 1)[1] for s in cmd if s.startswith("checkpoint.name="))
            write_metrics(self.storage / name / "rayft_metrics.jsonl", self.tps[variant])
        else:
            out = Path(cmd[cmd.index("--out") + 1])
            out.write_text(json.dumps(sweep_figures(100.0 if variant == "fast" else 4.0)))
        return 0


@pytest.fixture
def job(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"data: {{train_files: [d.jsonl]}}\ncheckpoint: {{storage_path: {tmp_path / 'runs'}}}\n")
    return cfg


@real_logs
def test_two_runs_with_their_own_environments_names_and_figures(job, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # left over in the shell: must not reach the fast run
    runner = FakeRunner(
        {"fast": NVLINK_LOG.read_text(), "sockets": SOCKET_LOG.read_text()},
        {"fast": [1.0] * 3 + [36000.0, 37000.0, 38000.0], "sockets": [1.0] * 3 + [7000.0, 7500.0, 8000.0]},
        tmp_path / "runs",
    )
    out = tmp_path / "res.json"
    path, figures = run_fabric(job, ["train.lr=1e-4"], steps=6, out=out, logs_dir=tmp_path / "logs", runner=runner)

    assert path == out
    (fast_train, fast_env, _), (fast_sweep, _, _), (slow_train, slow_env, _), (slow_sweep, _, _) = runner.calls
    assert fast_train[1:4] == ["-m", "rayft.cli", "train"] and fast_sweep[1:3] == ["-m", "rayft.benchmarks.collectives"]
    for cmd in (fast_train, fast_sweep, slow_train, slow_sweep):
        i = cmd.index("--set")
        assert cmd[i - 1] == str(job)
        assert cmd[i : i + 6] == ["--set", "train.lr=1e-4", "--set", "train.max_steps=6", "--set", "ray.log_to_driver=true"]
    fast_name = fast_train[fast_train.index("--set", 11) + 1]
    slow_name = slow_train[slow_train.index("--set", 11) + 1]
    assert re.fullmatch(r"checkpoint.name=fabric-\d{8}-\d{6}-fast", fast_name)
    assert slow_name == fast_name.replace("-fast", "-sockets")
    assert "NCCL_P2P_DISABLE" not in fast_env and fast_env["NCCL_DEBUG"] == "INFO"
    assert (slow_env["NCCL_P2P_DISABLE"], slow_env["NCCL_SHM_DISABLE"], slow_env["NCCL_DEBUG"]) == ("1", "1", "INFO")

    assert figures["tokens_per_s_per_gpu_fast"] == 37000.0 and figures["tokens_per_s_per_gpu_sockets"] == 7500.0
    assert figures["tokens_per_s_ratio_fast_over_sockets"] == pytest.approx(37000 / 7500)
    assert figures["runs"]["fast"]["transport"] == "intra-node P2P/CUMEM over NVLink"
    assert figures["runs"]["sockets"]["transport"] == "intra-node NET/Socket"
    assert figures["peak_busbw_GB_s"]["sockets"]["all_reduce"] == 4.0
    doc = json.loads(out.read_text())
    assert doc["figures"] == figures
    assert doc["command"].startswith("rayft bench fabric ") and doc["command"].endswith("--mode onehost --steps 6 --set train.lr=1e-4")
    table = markdown_table(figures)
    assert "| fast | intra-node P2P/CUMEM over NVLink | 37,000 | 100.0 | 50.0 | 25.0 |" in table
    assert "| sockets | intra-node NET/Socket | 7,500 | 4.0 | 2.0 | 1.0 |" in table
    assert "fast / sockets tokens/s/GPU: 4.93x (median of steps 4..6" in table


@real_logs
def test_a_fast_run_that_fell_back_to_sockets_is_rejected_through_the_cli(job, tmp_path, monkeypatch):
    from rayft.benchmarks import fabric

    runner = FakeRunner(
        {"fast": SOCKET_LOG.read_text(), "sockets": SOCKET_LOG.read_text()}, {"fast": [1.0] * 6, "sockets": [1.0] * 6}, tmp_path / "runs"
    )
    out = tmp_path / "res.json"
    real = fabric.run_fabric
    monkeypatch.setattr(fabric, "run_fabric", lambda *a, **k: real(*a, **{**k, "runner": runner}))
    res = CliRunner().invoke(app, ["bench", "fabric", str(job), "--steps", "6", "--out", str(out), "--logs-dir", str(tmp_path / "logs")])
    assert res.exit_code == 1
    said = " ".join(res.output.split())
    assert "fast training (" in said and "rejected: expected nvlink, but ranks 0-1 (on vm) used NET/Socket" in said
    assert len(runner.calls) == 1  # stopped before spending time on the other runs
    assert not out.exists()


@real_logs
def test_a_run_that_finished_but_outlived_the_limit_is_used_and_flagged(job, tmp_path):
    inner = FakeRunner(
        {"fast": NVLINK_LOG.read_text(), "sockets": SOCKET_LOG.read_text()},
        {"fast": [1.0] * 3 + [36000.0] * 3, "sockets": [1.0] * 3 + [7200.0] * 3},
        tmp_path / "runs",
    )

    done_files = []

    def lingering(cmd, env, log, timeout_s, done_file=None):
        inner(cmd, env, log, timeout_s)
        done_files.append(done_file)
        if cmd[2] == "rayft.cli" and env.get("NCCL_P2P_DISABLE") == "1":
            name = next(s.split("=", 1)[1] for s in cmd if s.startswith("checkpoint.name="))
            (tmp_path / "runs" / name / "rayft_summary.json").write_text("{}")  # finished, then hung on exit
            return 124
        return 0

    _, figures = run_fabric(job, steps=6, out=tmp_path / "r.json", logs_dir=tmp_path / "logs", runner=lingering)
    assert figures["runs"]["sockets"]["train_process_outlived_limit"] is True
    assert figures["runs"]["fast"]["train_process_outlived_limit"] is False
    assert figures["tokens_per_s_per_gpu_sockets"] == 7200.0
    # training runs are watched through their summary file; the sweeps are not
    assert [d.name if d else None for d in done_files] == ["rayft_summary.json", None, "rayft_summary.json", None]
    assert done_files[2].parent.name.endswith("-sockets")

    def timed_out_unfinished(cmd, env, log, timeout_s, done_file=None):
        inner(cmd, env, log, timeout_s)
        return 124  # no summary: the run did not finish

    time.sleep(1.1)  # run names carry the second they started
    with pytest.raises(FabricError, match=r"fast training failed \(exit 124\)"):
        run_fabric(job, steps=6, out=tmp_path / "r2.json", logs_dir=tmp_path / "logs2", runner=timed_out_unfinished)


def test_a_failed_training_run_reports_the_end_of_its_log(job, tmp_path):
    def failing(cmd, env, log, timeout_s, done_file=None):
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("starting\nerror: training failed: CUDA out of memory\n")
        return 1

    with pytest.raises(FabricError, match=r"(?s)fast training failed \(exit 1\); end of .*fast-train.log:\n.*CUDA out of memory"):
        run_fabric(job, steps=6, logs_dir=tmp_path / "logs", runner=failing)


def test_bad_inputs_fail_before_any_run(job, tmp_path):
    def never(*a, **k):
        raise AssertionError("no run should start")

    with pytest.raises(FabricError, match=r"3 steps leave no step after the 3 start-up steps"):
        run_fabric(job, steps=3, runner=never)
    with pytest.raises(FabricError, match=r"2 steps leave no step after the 3 start-up steps"):
        run_fabric(job, ["train.max_steps=2"], runner=never)  # --steps defaults to train.max_steps
    with pytest.raises(FabricError, match=r"(?s)config error: .*train.lr \(from --set\): Input should be greater than 0"):
        run_fabric(job, ["train.lr=-1"], runner=never)
    with pytest.raises(FabricError, match="needs a local or mounted path"):
        run_fabric(job, ["checkpoint.storage_path=s3://b/p"], runner=never)


# ------------------------------------------------------------------------------ CLI


def test_bench_fabric_help():
    res = CliRunner().invoke(app, ["bench", "fabric", "--help"])
    assert res.exit_code == 0, res.output
    for opt in ("--mode", "--steps", "--out", "--set", "--logs-dir"):
        assert opt in res.output
    res = CliRunner().invoke(app, ["bench", "--help"])
    assert res.exit_code == 0 and "fabric" in res.output and "bench/results/" in res.output


def test_driver_forwards_only_nccl_variables_to_the_workers(monkeypatch):
    from rayft.train.ray_cluster import worker_env_vars

    monkeypatch.setenv("NCCL_NET", "Socket")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("FI_PROVIDER", "efa")  # a pod's own libfabric setting: not the driver's to impose
    env = worker_env_vars()
    assert (env["NCCL_NET"], env["NCCL_DEBUG"], env["TOKENIZERS_PARALLELISM"]) == ("Socket", "INFO", "false")
    assert "FI_PROVIDER" not in env and all(k.startswith("NCCL_") or k == "TOKENIZERS_PARALLELISM" for k in env)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not reaped yet (its parent, the shell, is gone: init reaps it) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("ignore_term", [False, True])
def test_run_logged_timeout_stops_a_grandchild_in_the_childs_process_group(tmp_path, ignore_term):
    import os

    from rayft.benchmarks.logged_run import run_logged

    pidfile = tmp_path / "grandchild.pid"
    trap = "trap '' TERM; " if ignore_term else ""  # the grandchild inherits the ignored SIGTERM: only SIGKILL stops it
    cmd = ["sh", "-c", f"{trap}sleep 100 & echo $! > {pidfile}; wait"]
    log = tmp_path / "run.log"
    t = time.monotonic()
    rc = run_logged(cmd, dict(os.environ), log, 1.0, kill_grace_s=2.0 if ignore_term else 10.0)
    took = time.monotonic() - t
    assert rc == 124 and "killed after 1.0 s" in log.read_text()
    gpid = int(pidfile.read_text())
    assert os.getpgid(os.getpid()) != gpid  # (sanity) the grandchild was not in our group
    deadline = time.monotonic() + 5
    while _alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(gpid), f"grandchild {gpid} still running after the timeout"
    # SIGTERM is enough for a plain sleep (well within the 10 s grace; the dead grandchild only has to be
    # reaped by init); with SIGTERM ignored the 2 s grace runs out before SIGKILL
    assert (took >= 3.0) if ignore_term else (took < 8.0)


def test_run_logged_stops_a_process_that_lingers_after_its_done_file(tmp_path):
    import os

    from rayft.benchmarks.logged_run import run_logged

    done = tmp_path / "rayft_summary.json"
    cmd = ["sh", "-c", f"echo working; sleep 0.5; echo '{{}}' > {done}; sleep 100"]  # finished, then hangs on exit
    log = tmp_path / "run.log"
    t = time.monotonic()
    rc = run_logged(cmd, dict(os.environ), log, 60.0, kill_grace_s=5.0, done_file=done, linger_s=1.0)
    took = time.monotonic() - t
    assert rc == 124 and 1.5 <= took < 10.0  # stopped ~1 s after the file, not at the 60 s limit
    assert "rayft_summary.json written, but the process was still running 1 s later: stopped" in log.read_text()
    # a done file left from before the start is not this run's: the process runs to its limit
    rc = run_logged(["sh", "-c", "sleep 3"], dict(os.environ), log, 60.0, done_file=done, linger_s=1.0)
    assert rc == 0 and "stopped" not in log.read_text()
    # a process that exits by itself after writing the file keeps its own status
    rc = run_logged(["sh", "-c", f"echo '{{}}' > {done}; exit 3"], dict(os.environ), log, 60.0, done_file=done, linger_s=1.0)
    assert rc == 3

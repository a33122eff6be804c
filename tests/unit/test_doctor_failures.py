"""rayft doctor: failures after the transport was chosen and environment faults fail a run (issue 20, parts 2-3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.nccl.doctor import InterNode, IntraNode, judge
from rayft.nccl.environment import environment_faults
from rayft.nccl.health import EFA_ERRORS, failures
from rayft.nccl.verdicts import verdicts_from_text

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
REAL = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "nccl-logs"
runner = CliRunner()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def doctor(name: str, *args: str):
    res = runner.invoke(app, ["doctor", str(FIXTURES / name), *args])
    return res, " ".join(res.stderr.split())


# ------------------------------------------------------------------------------------------ failures


def test_efa_chosen_then_a_completion_error_and_the_watchdog_fail_the_run():
    # Before issue 20: exit 0, "all 16 ranks used efa".
    r = judge(fixture("efa_failure_2x8.log"), "efa")
    assert {(v.inter_node, v.intra_node) for v in r.verdicts} == {(InterNode.EFA, IntraNode.P2P)}
    assert r.problems == []  # the transport is right ...
    assert r.exit_code == 1  # ... and the run failed anyway
    first = r.failures[0]
    assert (first.kind, first.rank, first.host, first.pid) == ("efa-completion", 11, "rayft-gpu-worker-s3t4u", 8803)
    assert first.line.startswith("NET/OFI Request 0x7f3a2c01e200 completed with error. RC: 103. Error: 13")
    assert first.cause == (
        "EFA completion error 13: unresponsive peer (it answered before) (libfabric error 103 (Software caused connection abort)); "
        "the peer stopped answering (its process hung or died, or its node lost the network): look at the peer ranks' first errors"
    )
    assert [(f.rank, f.kind) for f in r.failures[1:]] == [(k, "timeout") for k in [*range(11), *range(12, 16)]]
    assert r.failures[1].line.startswith("[PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout")
    [t] = r.timeouts
    assert (t.op, t.seq, t.timeout_ms, t.ranks, t.failed, t.silent) == ("ALLREDUCE", 4519, 600000, [*range(11), *range(12, 16)], [11], [])
    res, err = doctor("efa_failure_2x8.log", "--expect", "efa")
    assert res.exit_code == 1
    assert "failed: rank 11 (on rayft-gpu-worker-s3t4u): NET/OFI Request 0x7f3a2c01e200 completed with error" in err
    assert "timed out: collective ALLREDUCE #4519 timed out after 600000 ms on ranks 0-10, 12-15; rank 11 failed otherwise first" in err
    assert "all 16 ranks used efa" not in err


def test_watchdog_timeout_names_the_rank_that_never_entered():
    r = judge(fixture("watchdog_timeout_1x4.log"), "nvlink")
    assert r.problems == [] and r.exit_code == 1
    [t] = r.timeouts
    assert str(t) == (
        "collective _ALLGATHER_BASE #8812 timed out after 1800000 ms on ranks 0-2; rank 3 reported no timeout: "
        "it probably never entered it (the hung or slow rank)"
    )
    assert [(f.rank, f.host, f.kind) for f in r.failures] == [(k, "trainer-7", "timeout") for k in range(3)]
    assert "train.nccl_flight_recorder: true" in r.failures[0].cause


def test_duplicate_gpu_and_barrier_before_the_device_fail_the_run():
    dup = judge(fixture("duplicate_gpu_1x2.log"))
    assert [(f.kind, f.rank) for f in dup.failures] == [("duplicate-gpu", 1)]
    assert dup.failures[0].cause.startswith("ranks 0 and 1 are on one GPU (1a000): each worker needs its own")
    assert dup.exit_code == 1
    bar = judge(fixture("barrier_device_1x2.log"))
    assert [(f.kind, f.rank, f.host) for f in bar.failures] == [("barrier-device", 0, "box-4"), ("barrier-device", 1, "box-4")]
    assert bar.failures[0].cause.startswith("barrier() ran before this rank's GPU was set, on GPU 0: it hangs when the guess is wrong")
    assert bar.exit_code == 1  # even with --expect any


def test_two_jobs_in_one_file_still_report_the_failed_attempt():
    r = judge(fixture("two_jobs_restart.log"), "efa")
    assert r.mixed and r.exit_code == 2
    assert [v.job for v in r.verdicts] == ["0x2222aaaa3333bbbb"] * 4 + ["0x4444cccc5555dddd"] * 4
    assert [(f.kind, f.rank, f.host, f.pid) for f in r.failures] == [("remote-error", 2, "rayft-gpu-worker-g3h4i", 3000)]


@pytest.mark.parametrize(
    ("line", "kind", "starts"),
    [
        (
            "h:1:2 [0] NCCL WARN socketProgressOpt: Call to recv from 10.0.0.2<43210> failed : Connection reset by peer",
            "socket-error",
            "a TCP connection",
        ),
        ("h:1:2 [0] misc/cudawrap.cc:45 NCCL WARN Cuda failure 'out of memory'", "cuda-error", "a CUDA call failed"),
        ("h:1:2 [0] NCCL WARN Unexpected state in the proxy", "nccl-warn", "NCCL warned of a failure"),
        (
            "[rank0]: torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "system-error",
            "ncclSystemError",
        ),
        (
            "[rank0]: ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "remote-error",
            "ncclRemoteError",
        ),
        (
            "[rank0]: RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete",
            "timeout",
            "a gloo recv timed out after 1800000 ms",
        ),
    ],
)
def test_failure_kinds(line, kind, starts):
    [f] = failures(line, [])
    assert f.kind == kind and f.cause.startswith(starts)


def test_selection_warnings_are_not_failures():
    # the plugin's probing is how a fallback shows, not a failure of the run (verdicts.py reads it)
    assert failures(fixture("mixed_efa_socket_2x4.log"), verdicts_from_text(fixture("mixed_efa_socket_2x4.log"))) == []
    for name in ("efa_2x8.log", "socket_fallback_2x8.log", "tcp_provider_2x2.log", "missing_plugin_2x2.log", "dedup_1x8_nvlink.log"):
        assert failures(fixture(name), []) == [], name


@pytest.mark.skipif(not REAL.exists(), reason=f"real NCCL logs not found under {REAL}")
def test_real_logs_have_no_failure_and_no_fault():
    for name in ("nccl-h200x2-nvlink-fsdp2.log", "nccl-h200x2-socketforced-fsdp2.log"):
        r = judge((REAL / name).read_text())
        assert (r.failures, r.timeouts, r.faults, r.exit_code) == ([], [], [], 0), name


def test_efa_error_table_covers_the_common_codes():
    assert EFA_ERRORS[13][0] == "unresponsive peer (it answered before)"
    assert EFA_ERRORS[15][0] == "unreachable peer (never answered)"
    assert "security group" in EFA_ERRORS[4126][1]
    [f] = failures(
        "h:1:2 [0] NCCL WARN NET/OFI Request 0x1 completed with error. RC: 113. Error: 15 (Unreachable remote (never received a response)). Completed length: 0",
        [],
    )
    assert f.cause.startswith(
        "EFA completion error 15: unreachable peer (never answered) (libfabric error 113 (No route to host)); the peer was never"
    )


# ------------------------------------------------------------------------------------------ environment


def test_shm_too_small_fails_by_default_and_is_printed():
    # Before issue 20: exit 0, the cause only in --json.
    r = judge(fixture("shm_small_1x4.log"), "nvlink")
    assert r.problems == [] and {v.intra_detail for v in r.verdicts} == {"P2P/CUMEM over NVLink"}
    [fault] = r.faults
    assert (fault.kind, fault.ranks, fault.hosts) == ("shm", [0], ["trainer-pod-0"])
    assert "cluster.kube.shm_size" in fault.text
    res, err = doctor("shm_small_1x4.log", "--expect", "nvlink")
    assert res.exit_code == 1
    assert "environment: rank 0 (on trainer-pod-0): /dev/shm is too small for NCCL's shared-memory segments" in err
    warn, err = doctor("shm_small_1x4.log", "--expect", "nvlink", "--env-faults", "warn")
    assert warn.exit_code == 0 and "environment (warning): rank 0" in err


def test_link_local_interface_flagged_from_the_socket_plugins_init_line_alone():
    # Before issue 20: verdict unknown, exit 0 with --expect any.
    r = judge(fixture("socket_init_link_local.log"))
    assert [(v.host, v.inter_node, v.socket_ifs) for v in r.verdicts] == [
        ("gpu-node-a", InterNode.UNKNOWN, ["eth1 169.254.3.7"]),
        ("gpu-node-b", InterNode.UNKNOWN, ["eth1 169.254.3.8"]),
    ]
    assert [(f.kind, f.hosts) for f in r.faults] == [("link-local", ["gpu-node-a"]), ("link-local", ["gpu-node-b"])]
    assert r.faults[0].text.startswith("NCCL's sockets use the link-local interface eth1 169.254.3.7, which does not route between hosts")
    assert r.exit_code == 1
    res, err = doctor("socket_init_link_local.log")
    assert res.exit_code == 1 and "set NCCL_SOCKET_IFNAME to the pod's primary interface" in err


def test_p5_with_one_efa_device_and_no_gpudirect():
    r = judge(fixture("efa_p5_degraded_2x2.log"), "efa")
    assert r.problems == [] and {v.inter_node for v in r.verdicts} == {InterNode.EFA}
    assert [(f.kind, f.ranks) for f in r.faults] == [("gdr", [0, 1, 2, 3]), ("efa-count", [0, 1, 2, 3])]
    assert r.faults[1].text.startswith(
        "aws-ofi-nccl found 1 EFA device where p5.48xlarge has 32: request vpc.amazonaws.com/efa: 32 in the worker pods"
    )
    assert r.exit_code == 1
    # the healthy 2 x 8 fixture on the same instance type has no fault (32 of 32, GPUDirect on)
    assert environment_faults(verdicts_from_text(fixture("efa_2x8.log"))) == []


def test_instance_type_given_overrides_and_unknown_types_are_said():
    vs = verdicts_from_text(fixture("efa_p5_degraded_2x2.log"))
    faults = environment_faults(vs, "p4d.24xlarge")  # 4 EFA interfaces, GPUDirect RDMA
    assert [(f.kind, f.text.split(":")[0]) for f in faults] == [
        ("gdr", "EFA without GPUDirect RDMA on p4d.24xlarge, which has it (no /GDRDMA on the network channels)"),
        ("efa-count", "aws-ofi-nccl found 1 EFA device where p4d.24xlarge has 4"),
    ]
    r = judge(fixture("efa_p5_degraded_2x2.log"), instance_type="x9.metal")
    assert r.faults == [] and r.instance_note.startswith("instance type x9.metal is not in rayft's instance catalog")


def test_json_carries_each_ranks_failure_and_faults():
    res = runner.invoke(app, ["doctor", str(FIXTURES / "efa_p5_degraded_2x2.log"), "--json"])
    assert res.exit_code == 1
    rows = json.loads(res.stdout)
    assert [len(r["faults"]) for r in rows] == [2, 2, 2, 2] and all(r["failure"] is None for r in rows)
    res = runner.invoke(app, ["doctor", str(FIXTURES / "watchdog_timeout_1x4.log"), "--json"])
    rows = json.loads(res.stdout)
    assert [r["failure"]["kind"] if r["failure"] else None for r in rows] == ["timeout", "timeout", "timeout", None]


def test_failures_without_any_nccl_line_are_still_reported(tmp_path):
    log = tmp_path / "driver.log"
    log.write_text(
        "[rank1]:[E1130 10:00:00.1 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=60000) ran for 60010 milliseconds before timing out.\n"
    )
    res = runner.invoke(app, ["doctor", str(log)])
    err = " ".join(res.stderr.split())
    assert res.exit_code == 1
    assert "no NCCL lines (run with NCCL_DEBUG=INFO for the transport), but failures:" in err
    assert "failed: rank 1: [Rank 1] Watchdog caught collective operation timeout" in err

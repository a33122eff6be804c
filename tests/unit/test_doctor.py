"""rayft doctor: per-rank NCCL transport verdicts from real and hand-written NCCL_DEBUG=INFO logs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.nccl.doctor import (
    Expect,
    InterNode,
    IntraNode,
    RankVerdict,
    check,
    mixed_jobs,
    parse_lines,
    rank_problem,
    verdicts_from_text,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
REAL = SHARED / "reference" / "nccl-logs"
NVLINK_LOG = REAL / "nccl-h200x2-nvlink-fsdp2.log"
SOCKET_LOG = REAL / "nccl-h200x2-socketforced-fsdp2.log"

real_logs = pytest.mark.skipif(
    not (NVLINK_LOG.exists() and SOCKET_LOG.exists()),
    reason=f"real NCCL logs not found under {REAL} (the shared reference folder is not checked out here)",
)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def summary(v: RankVerdict) -> tuple:
    """The per-rank verdict the tests pin down exactly."""
    return (v.rank, v.host, v.pid, v.inter_node, v.intra_node, v.gdr, v.interface)


def causes(v: RankVerdict) -> list[str]:
    return [c.text.split(":")[0] for c in v.causes]


# ------------------------------------------------------------------------------------------ real logs


@real_logs
def test_real_nvlink_log_is_p2p_cumem_over_nvlink_on_one_host():
    vs = verdicts_from_text(NVLINK_LOG.read_text())
    assert [summary(v) for v in vs] == [
        (0, "vm", 8198, InterNode.NONE, IntraNode.P2P, None, None),
        (1, "vm", 8197, InterNode.NONE, IntraNode.P2P, None, None),
    ]
    for v, (dev, bus) in zip(vs, [(0, "60"), (1, "70")]):
        assert (v.world_size, v.n_nodes, v.local_rank, v.cuda_dev, v.bus_id) == (2, 1, v.rank, dev, bus)
        assert v.intra_detail == "P2P/CUMEM over NVLink"
        assert v.p2p_link == "NVLink"
        assert v.bootstrap == "eth0 192.0.2.2"
        assert v.nccl_version == "2.28.9+cuda13.0"
        assert v.causes == []
    # "Using network Socket" is printed, but nothing went over the network.
    assert check(vs, "nvlink") == []
    assert check(vs, Expect.ANY) == []
    assert check(vs, "socket") == ["ranks 0-1 (on vm) used intra-node P2P/CUMEM over NVLink, not NET/Socket"]
    assert check(vs, "efa") == ["ranks 0-1 (on vm) had no peer on another host (single-node job), so EFA was never used"]


@real_logs
def test_real_forced_socket_log_is_net_socket_between_local_gpus():
    vs = verdicts_from_text(SOCKET_LOG.read_text())
    assert [summary(v) for v in vs] == [
        (0, "vm", 10912, InterNode.NONE, IntraNode.NET, False, "eth0 192.0.2.2"),
        (1, "vm", 10911, InterNode.NONE, IntraNode.NET, False, "eth0 192.0.2.2"),
    ]
    for v in vs:
        assert v.intra_detail == "NET/Socket"
        assert v.n_nodes == 1  # NCCL says nNodes 2, but both ranks are on host "vm"
        assert any("NCCL counted 2 nodes" in n for n in v.notes)
        assert causes(v) == [
            "NCCL_P2P_DISABLE=1 set by the environment (no GPU peer-to-peer)",
            "NCCL_SHM_DISABLE=1 set by the environment (no shared-memory transport)",
        ]
    assert check(vs, "socket") == []
    assert check(vs, "nvlink") == [
        "ranks 0-1 (on vm) used NET/Socket between local GPUs, not P2P/NVLink. Likely cause: "
        "NCCL_P2P_DISABLE=1 set by the environment (no GPU peer-to-peer); "
        "NCCL_SHM_DISABLE=1 set by the environment (no shared-memory transport)"
    ]
    # P2P/SHM causes do not explain a missing EFA.
    assert check(vs, "efa") == ["ranks 0-1 (on vm) had no peer on another host (single-node job), so EFA was never used"]


@real_logs
def test_real_log_survives_interleaving_truncation_and_ansi_colour():
    lines = NVLINK_LOG.read_text().splitlines()
    # drop every rank-1 channel line but one, glue that one onto a rank-0 line, cut another short,
    # and colour the prefixes the way Ray does on a terminal
    r1 = [i for i, s in enumerate(lines) if "pid=8197" in s and "via P2P/CUMEM" in s]
    keep = r1[0]
    glued_into = next(i for i, s in enumerate(lines) if "pid=8198" in s and "via P2P/CUMEM" in s)
    lines[glued_into] += lines[keep].split(") ", 1)[1]
    dropped = set(r1)
    out = []
    for i, s in enumerate(lines):
        if i in dropped:
            continue
        if s.startswith("(RayTrainWorker"):
            s = "\x1b[36m" + s.replace(") ", ")\x1b[0m ", 1)
        out.append(s)
    out.append("(RayTrainWorker pid=8198) vm:8198:8509 [0] NCCL INFO Channel 05/0 : 0[0] -> 1[")
    vs = verdicts_from_text("\n".join(out))
    assert [summary(v) for v in vs] == [
        (0, "vm", 8198, InterNode.NONE, IntraNode.P2P, None, None),
        (1, "vm", 8197, InterNode.NONE, IntraNode.P2P, None, None),
    ]
    assert [v.intra_detail for v in vs] == ["P2P/CUMEM over NVLink"] * 2
    assert check(vs, "nvlink") == []
    assert mixed_jobs(vs) is None  # a hostname glued to a fragment is the same process, not another job


# ------------------------------------------------------------------------------------------ fixtures

EFA_HOSTS = ("rayft-gpu-worker-7kq2m", "rayft-gpu-worker-x9p4d")


def test_efa_success_two_nodes_of_eight():
    vs = verdicts_from_text(fixture("efa_2x8.log"))
    expected = []
    for r in range(16):
        host, pid = EFA_HOSTS[r // 8], 2101 + r % 8  # same pids in both pods
        gdr = None if r % 8 == 5 else True  # local rank 5 logged no network channel of its own
        expected.append((r, host, pid, InterNode.EFA, IntraNode.P2P, gdr, "efa x32"))
    assert [summary(v) for v in vs] == expected
    for v in vs:
        assert v.provider == "efa"
        assert v.inter_detail == "aws-ofi-nccl 1.13.2-aws, provider efa, 32 NICs, libfabric 1.22"
        assert v.intra_detail == "P2P/CUMEM over NVLink"
        assert (v.world_size, v.n_nodes, v.local_rank, v.cuda_dev) == (16, 2, v.rank % 8, v.rank % 8)
        assert v.ip == ("10.0.64.11" if v.rank < 8 else "10.0.80.27")
        assert v.causes == []
    assert vs[5].notes == ["this rank logged no inter-node channel; inter-node transport taken from 'Using network Libfabric'"]
    assert check(vs, "efa") == []
    assert check(vs, "nvlink") == []
    assert check(vs, "socket")[0].startswith("ranks 0-15 (on rayft-gpu-worker-7kq2m, rayft-gpu-worker-x9p4d) used inter-node EFA")


def test_socket_fallback_on_efa_cluster_names_the_missing_plugin():
    vs = verdicts_from_text(fixture("socket_fallback_2x8.log"))
    hosts = {0: ("rayft-gpu-worker-b4n8s", "eth0 10.0.64.12", 3300), 1: ("rayft-gpu-worker-h2v6c", "eth0 10.0.80.31", 3340)}
    expected = []
    for r in range(16):
        host, iface, pid0 = hosts[r // 8]
        # ranks that logged a NET/Socket channel show GDR off; odd local ranks 1-5 logged none
        gdr = None if (r % 8) in (1, 3, 5) else False
        expected.append((r, host, pid0 + r % 8, InterNode.SOCKET, IntraNode.P2P, gdr, iface))
    assert [summary(v) for v in vs] == expected
    for v in vs:
        assert causes(v) == ["OFI plugin not found"]
    # Ray folded rank 0's and rank 8's plugin lines for the others
    assert any(n.startswith("Ray folded 12 similar lines of other workers") for n in vs[0].notes)
    assert any("used those of pid 3300" in n for n in vs[3].notes)
    assert any("used those of pid 3340" in n for n in vs[12].notes)
    assert check(vs, "efa") == [
        "ranks 0-15 (on rayft-gpu-worker-b4n8s, rayft-gpu-worker-h2v6c) used Socket between hosts, not EFA. "
        "Likely cause: OFI plugin not found: NCCL could not load libnccl-net.so (aws-ofi-nccl not installed "
        "or not on LD_LIBRARY_PATH)"
    ]
    assert check(vs, "nvlink") == []  # intra-node was fine


def test_mixed_ranks_some_efa_some_socket():
    vs = verdicts_from_text(fixture("mixed_efa_socket_2x4.log"))
    a, b = "rayft-gpu-worker-q1w2e", "rayft-gpu-worker-r5t6y"
    assert [summary(v) for v in vs] == [
        (0, a, 512, InterNode.EFA, IntraNode.P2P, True, "efa x4"),
        (1, a, 513, InterNode.EFA, IntraNode.P2P, True, "efa x4"),
        (2, a, 514, InterNode.EFA, IntraNode.P2P, True, "efa x4"),
        (3, a, 515, InterNode.EFA, IntraNode.P2P, True, "efa x4"),
        (4, b, 512, InterNode.SOCKET, IntraNode.P2P, False, "eth0 10.0.80.41"),
        (5, b, 513, InterNode.SOCKET, IntraNode.P2P, False, "eth0 10.0.80.41"),
        (6, b, 514, InterNode.SOCKET, IntraNode.P2P, False, "eth0 10.0.80.41"),
        (7, b, 515, InterNode.SOCKET, IntraNode.P2P, False, "eth0 10.0.80.41"),
    ]
    assert [v.intra_detail for v in vs] == ["P2P/IPC"] * 8  # rank 6's glued line repaired
    assert [v.provider for v in vs] == ["efa"] * 4 + [None] * 4
    assert vs[0].nccl_version == "2.21.5+cuda12.4"
    # the cause names the initialisation failure these ranks logged (issue 20), not a guess
    assert [causes(v) for v in vs] == [[]] * 4 + [["aws-ofi-nccl failed to initialise on this rank"]] * 4
    problems = check(vs, "efa")
    assert problems == [
        f"ranks 4-7 (on {b}) used Socket between hosts, not EFA. Likely cause: aws-ofi-nccl failed to initialise on this rank: "
        "the log says 'NET/OFI OFI fi_getinfo() call failed: No data available'; libfabric offered this process no EFA "
        "endpoint: its pod must request vpc.amazonaws.com/efa and see /dev/infiniband/uverbs* (`fi_info -p efa` in the pod "
        "shows what libfabric finds)"
    ]


def test_tcp_libfabric_provider_is_not_efa():
    vs = verdicts_from_text(fixture("tcp_provider_2x2.log"))
    assert [summary(v) for v in vs] == [
        (0, "node-a", 40100, InterNode.LIBFABRIC, IntraNode.P2P, False, "tcp x1"),
        (1, "node-a", 40101, InterNode.LIBFABRIC, IntraNode.P2P, False, "tcp x1"),
        (2, "node-b", 40110, InterNode.LIBFABRIC, IntraNode.P2P, False, "tcp x1"),
        (3, "node-b", 40111, InterNode.LIBFABRIC, IntraNode.P2P, False, "tcp x1"),
    ]
    for v in vs:
        assert v.provider == "tcp"
        assert v.p2p_link is None  # 2 channels: no NVLink evidence
        assert v.intra_detail == "P2P/IPC"
        assert v.inter_detail == "aws-ofi-nccl 1.7.4-aws, provider tcp, 1 NICs"
        assert causes(v) == ["libfabric provider is tcp, not efa (FI_PROVIDER set, or no EFA device so libfabric chose a TCP provider)"]
    assert check(vs, "efa") == [
        "ranks 0-3 (on node-a, node-b) used aws-ofi-nccl with libfabric provider tcp, not efa. Likely cause: "
        "libfabric provider is tcp, not efa (FI_PROVIDER set, or no EFA device so libfabric chose a TCP provider)"
    ]


def test_missing_plugin_with_old_wording_and_log_cut_before_connect():
    vs = verdicts_from_text(fixture("missing_plugin_2x2.log"))
    assert [summary(v) for v in vs] == [
        (0, "trainer-0", 901, InterNode.SOCKET, IntraNode.P2P, None, "eth0 10.3.0.7"),
        (1, "trainer-0", 902, InterNode.SOCKET, IntraNode.P2P, None, "eth0 10.3.0.7"),
        (2, "trainer-1", 901, InterNode.SOCKET, IntraNode.UNKNOWN, None, "eth0 10.3.0.8"),
        (3, "trainer-1", 902, InterNode.SOCKET, IntraNode.UNKNOWN, None, "eth0 10.3.0.8"),
    ]
    assert [v.evidence for v in vs] == ["channels", "channels", "init", "init"]
    assert [causes(v) for v in vs] == [["OFI plugin not found"]] * 4
    assert check(vs, "efa") == [
        "ranks 0-3 (on trainer-0, trainer-1) used Socket between hosts, not EFA. Likely cause: OFI plugin not "
        "found: NCCL could not load libnccl-net.so (aws-ofi-nccl not installed or not on LD_LIBRARY_PATH)"
    ]
    assert check(vs, "nvlink") == ["ranks 2-3 (on trainer-1) logged no intra-node channel, so NVLink cannot be verified"]


def test_link_local_interface():
    vs = verdicts_from_text(fixture("link_local_2x1.log"))
    assert [summary(v) for v in vs] == [
        (0, "gpu-pod-a", 77, InterNode.SOCKET, IntraNode.NONE, False, "eth1 169.254.10.2"),
        (1, "gpu-pod-b", 77, InterNode.SOCKET, IntraNode.NONE, False, "eth1 169.254.10.3"),
    ]
    assert causes(vs[0]) == ["OFI plugin not found", "link-local interface", "link-local bootstrap interface"]
    problems = check(vs, "efa")
    assert len(problems) == 2  # different interfaces, so one line per rank
    assert problems[0].startswith("rank 0 (on gpu-pod-a) used Socket between hosts, not EFA. Likely cause:")
    assert "link-local interface: eth1 169.254.10.2 cannot route between hosts" in problems[0]
    assert check(vs, "socket") == []
    assert check(vs, "nvlink") == ["ranks 0-1 (on gpu-pod-a, gpu-pod-b) had no other GPU on its host, so NVLink was never used"]


# ------------------------------------------------------------------------------------------ wordings


def _w(host: str, pid: int, dev: int, msg: str, level: str = "INFO") -> str:
    return f"{host}:{pid}:{pid + 1} [{dev}] NCCL {level} {msg}"


def test_infiniband_and_old_ring_wording():
    text = "\n".join(
        [
            _w("ib-a", 10, 0, "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.9.0.1<0>"),
            _w("ib-a", 10, 0, "Using network IB"),
            _w("ib-a", 10, 0, "comm 0x7f0000001000 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
            _w("ib-a", 10, 0, "Ring 00 : 1 -> 0 [receive] via NET/IB/0/GDRDMA"),
            _w("ib-b", 10, 0, "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.9.0.2<0>"),
            _w("ib-b", 10, 0, "comm 0x7f0000002000 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
            _w("ib-b", 10, 0, "Ring 00 : 1 -> 0 [send] via NET/IB/0"),
        ]
    )
    vs = verdicts_from_text(text)
    assert [summary(v) for v in vs] == [
        (0, "ib-a", 10, InterNode.IB, IntraNode.NONE, True, "mlx5_0:1/IB, mlx5_1:1/IB"),
        (1, "ib-b", 10, InterNode.IB, IntraNode.NONE, False, "mlx5_0:1/IB"),
    ]
    assert check(vs, "efa") == ["ranks 0-1 (on ib-a, ib-b) used InfiniBand between hosts, not EFA"]


def test_shm_between_local_gpus_and_shared_memory_too_small():
    text = "\n".join(
        [
            _w("box", 1, 0, "comm 0x7f0000001000 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
            _w("box", 1, 0, "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct"),
            _w("box", 2, 1, "comm 0x7f0000002000 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0"),
            _w("box", 2, 1, "Channel 00 : 1[1b000] -> 0[1a000] via direct shared memory"),
            "box:2:3 [1] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-AbCdEf to 9637892 bytes",
        ]
    )
    vs = verdicts_from_text(text)
    assert [(v.rank, v.intra_node, v.intra_detail, v.inter_node) for v in vs] == [
        # each rank logged its own send and is credited with its peer's (old and new wording)
        (0, IntraNode.SHM, "SHM, SHM/direct/direct", InterNode.NONE),
        (1, IntraNode.SHM, "SHM, SHM/direct/direct", InterNode.NONE),
    ]
    assert causes(vs[1]) == ["shared memory too small"]
    assert check(vs, "nvlink") == [
        "rank 0 (on box) used SHM, SHM/direct/direct between local GPUs, not P2P/NVLink",
        "rank 1 (on box) used SHM, SHM/direct/direct between local GPUs, not P2P/NVLink. Likely cause: shared memory too small: "
        "NCCL could not create its /dev/shm segment (mount a larger /dev/shm, e.g. an emptyDir with medium: Memory)",
    ]


def test_pcie_topology_fails_nvlink_expectation():
    text = "\n".join(
        [
            _w("pc", 1, 0, "comm 0x7f0000001000 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
            _w("pc", 1, 0, "Pattern 4, crossNic 0, nChannels 2, bw 12.000000/12.000000, type PHB/PIX, sameChannels 1"),
            _w("pc", 1, 0, "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"),
        ]
    )
    vs = verdicts_from_text(text)
    assert [(v.rank, v.intra_node, v.p2p_link) for v in vs] == [(0, IntraNode.P2P, "PCIe"), (1, IntraNode.UNKNOWN, None)]
    assert vs[1].evidence == "none"  # rank 1 is known from nRanks only
    assert check(vs, "nvlink") == [
        "rank 0 (on pc) used P2P over PCIe between local GPUs, not NVLink",
        "rank 1 left no NCCL line in the log, so the transport cannot be verified",
    ]


def test_nccl_net_socket_forced_and_ray_ip_prefix_and_repeated_suffix():
    p = "(RayTrainWorker pid=44, ip=10.0.0.9)"
    text = "\n".join(
        [
            f"{p} h9:44:45 [0] NCCL INFO NCCL_NET set by environment to Socket",
            f"{p} h9:44:45 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.9<0> [repeated 3x across cluster]",
            f"{p} h9:44:45 [0] NCCL INFO comm 0x7f0000001000 rank 1 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0",
            f"{p} NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0",  # NCCL's own prefix cut off
        ]
    )
    lines = parse_lines(text)
    assert [(ln.host, ln.pid, ln.ray_ip, ln.repeated) for ln in lines] == [
        ("h9", 44, "10.0.0.9", 1),
        ("h9", 44, "10.0.0.9", 3),
        ("h9", 44, "10.0.0.9", 1),
        (None, 44, "10.0.0.9", 1),
    ]
    vs = verdicts_from_text(text)
    assert [v.rank for v in vs] == [0, 1, 2, 3]
    v = vs[1]
    assert summary(v) == (1, "h9", 44, InterNode.SOCKET, IntraNode.UNKNOWN, False, "eth0 10.0.0.9")
    assert v.ip == "10.0.0.9"
    assert causes(v) == ["NCCL_NET=Socket set by the environment (forces TCP sockets)"]
    assert check(vs, "socket") == [
        "ranks 0, 2-3 left no NCCL line in the log, so the transport cannot be verified",
        "rank 1 (on h9) used intra-node unknown, not NET/Socket",
    ]


def test_loopback_interface_between_hosts_is_a_wrong_interface():
    text = "\n".join(
        [
            _w("n1", 5, 0, "NET/Socket : Using [0]lo:127.0.0.1<0>"),
            _w("n1", 5, 0, "Using network Socket"),
            _w("n1", 5, 0, "comm 0x7f0000001000 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
            _w("n2", 5, 0, "NET/Socket : Using [0]eth0:10.4.0.2<0>"),
            _w("n2", 5, 0, "Using network Socket"),
            _w("n2", 5, 0, "comm 0x7f0000002000 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"),
        ]
    )
    vs = verdicts_from_text(text)
    assert [summary(v) for v in vs] == [
        (0, "n1", 5, InterNode.SOCKET, IntraNode.NONE, None, "lo 127.0.0.1"),
        (1, "n2", 5, InterNode.SOCKET, IntraNode.NONE, None, "eth0 10.4.0.2"),
    ]
    assert [v.evidence for v in vs] == ["init", "init"]
    assert causes(vs[0]) == ["aws-ofi-nccl never initialized (no NET/OFI line from this rank)", "wrong interface"]
    assert causes(vs[1]) == ["aws-ofi-nccl never initialized (no NET/OFI line from this rank)"]


def test_no_nccl_lines():
    assert verdicts_from_text("hello\n(RayTrainWorker pid=3) step 1 loss 2.0\n") == []
    assert check([], "any") == ["no NCCL lines found (was NCCL_DEBUG=INFO set, and is this the workers' output?)"]


def test_rank_problem_none_when_expectation_met():
    v = RankVerdict(rank=0, world_size=1, host="h", pid=1, inter_node=InterNode.EFA, intra_node=IntraNode.P2P)
    assert rank_problem(v, "efa") is None
    assert rank_problem(v, "nvlink") is None
    assert rank_problem(v, "socket") == "used inter-node EFA and intra-node P2P, not NET/Socket"


# ------------------------------------------------------------------------------------------ CLI

runner = CliRunner()


def test_cli_exit_codes(tmp_path):
    efa = str(FIXTURES / "efa_2x8.log")
    mixed = str(FIXTURES / "mixed_efa_socket_2x4.log")
    ok = runner.invoke(app, ["doctor", efa, "--expect", "efa"])
    assert ok.exit_code == 0, ok.output
    assert "rayft-gpu-worker-7kq2m" in ok.stdout and "efa x32" in ok.stdout

    bad = runner.invoke(app, ["doctor", mixed, "--expect", "efa"])
    assert bad.exit_code == 1
    err = " ".join(bad.stderr.split())
    assert (
        "ranks 4-7" in err and "aws-ofi-nccl failed to initialise on this rank: the log says 'NET/OFI OFI fi_getinfo() call failed" in err
    )

    assert runner.invoke(app, ["doctor", mixed]).exit_code == 0  # --expect any: report only

    missing = runner.invoke(app, ["doctor", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2 and "cannot read" in missing.stderr

    empty = tmp_path / "empty.log"
    empty.write_text("no nccl here\n")
    none = runner.invoke(app, ["doctor", str(empty)])
    assert none.exit_code == 2 and "no NCCL lines found" in none.stderr


def test_cli_reads_stdin_and_writes_json():
    res = runner.invoke(app, ["doctor", "-", "--expect", "efa", "--json"], input=fixture("tcp_provider_2x2.log"))
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert [(d["rank"], d["inter_node"], d["provider"], d["gdr"]) for d in data] == [
        (0, "Libfabric", "tcp", False),
        (1, "Libfabric", "tcp", False),
        (2, "Libfabric", "tcp", False),
        (3, "Libfabric", "tcp", False),
    ]
    assert "provider tcp, not efa" in res.stderr


REAL_DETAIL = {
    # (log, rank, pid, inter_node, intra_node, intra_detail, p2p_link, gdr, interface, world, n_nodes)
    "nvlink": [
        ("nccl-h200x2-nvlink-fsdp2.log", 0, 8198, "none", "P2P", "P2P/CUMEM over NVLink", "NVLink", None, None, 2, 1),
        ("nccl-h200x2-nvlink-fsdp2.log", 1, 8197, "none", "P2P", "P2P/CUMEM over NVLink", "NVLink", None, None, 2, 1),
    ],
    "socket": [
        ("nccl-h200x2-socketforced-fsdp2.log", 0, 10912, "none", "network", "NET/Socket", None, False, "eth0 192.0.2.2", 2, 1),
        ("nccl-h200x2-socketforced-fsdp2.log", 1, 10911, "none", "network", "NET/Socket", None, False, "eth0 192.0.2.2", 2, 1),
    ],
}


def detail(d: dict) -> tuple:
    return (
        d["log"],
        d["rank"],
        d["pid"],
        d["inter_node"],
        d["intra_node"],
        d["intra_detail"],
        d["p2p_link"],
        d["gdr"],
        d["interface"],
        d["world_size"],
        d["n_nodes"],
    )


@real_logs
@pytest.mark.parametrize("order", [("nvlink", "socket"), ("socket", "nvlink")])
def test_cli_reads_each_real_log_as_its_own_run(order):
    # Two runs whose ranks 0 and 1 are different processes. Joined into one text, the socket run's
    # ranks were credited the NVLink run's P2P links by rank number ("NET/Socket, P2P/CUMEM").
    paths = {"nvlink": NVLINK_LOG, "socket": SOCKET_LOG}
    args = [str(paths[k]) for k in order]
    res = runner.invoke(app, ["doctor", *args, "--expect", "nvlink", "--json"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [detail(d) for d in data] == REAL_DETAIL[order[0]] + REAL_DETAIL[order[1]]
    assert all(d["mixed"] is None and d["job"] for d in data)
    assert {d["job"] for d in data if d["pid"] in (8197, 8198)} == {"0xb7028a62e4204034"}
    assert {d["job"] for d in data if d["pid"] in (10911, 10912)} == {"0xa2f5c74c2c3afe86"}
    # only the socket run fails --expect nvlink, and the message names its file
    expected = " ".join(res.stderr.split()).split("expected nvlink: ")[1:]
    assert len(expected) == 1
    assert expected[0].startswith(
        "nccl-h200x2-socketforced-fsdp2.log: ranks 0-1 (on vm) used NET/Socket between local GPUs, not P2P/NVLink"
    )
    assert "more than one NCCL job" not in res.stderr

    # the other way round: only the NVLink run fails --expect socket
    res = runner.invoke(app, ["doctor", *args, "--expect", "socket"])
    assert res.exit_code == 1
    err = " ".join(res.stderr.split())
    assert "nccl-h200x2-nvlink-fsdp2.log: ranks 0-1 (on vm) used intra-node P2P/CUMEM over NVLink, not NET/Socket" in err
    assert "socketforced-fsdp2.log: ranks" not in err

    assert runner.invoke(app, ["doctor", *args]).exit_code == 0  # --expect any


@real_logs
def test_cli_table_names_the_file_of_each_rank():
    res = runner.invoke(app, ["doctor", str(NVLINK_LOG), str(SOCKET_LOG), "--expect", "nvlink"])
    assert res.exit_code == 1
    rows = [[c.strip() for c in ln.split("│")[1:-1]] for ln in res.stdout.splitlines() if ln.startswith("│")]
    assert [r[:6] + r[6:9] + [r[-1]] for r in rows] == [
        ["nccl-h200x2-nvlink-fsdp2.log", "0", "vm", "8198", "0 (60)", "— (one host)", "P2P/CUMEM over NVLink", "—", "—", "ok"],
        ["nccl-h200x2-nvlink-fsdp2.log", "1", "vm", "8197", "1 (70)", "— (one host)", "P2P/CUMEM over NVLink", "—", "—", "ok"],
        ["nccl-h200x2-socketforced-fsdp2.log", "0", "vm", "10912", "0 (60)", "— (one host)", "NET/Socket", "off", "eth0 192.0.2.2", "FAIL"],
        ["nccl-h200x2-socketforced-fsdp2.log", "1", "vm", "10911", "1 (70)", "— (one host)", "NET/Socket", "off", "eth0 192.0.2.2", "FAIL"],
    ]


def test_cli_exit_code_is_the_worst_over_all_files(tmp_path):
    efa = str(FIXTURES / "efa_2x8.log")
    mixed = str(FIXTURES / "mixed_efa_socket_2x4.log")
    assert runner.invoke(app, ["doctor", efa, efa, "--expect", "efa"]).exit_code == 0
    both = runner.invoke(app, ["doctor", efa, mixed, "--expect", "efa", "--json"])
    assert both.exit_code == 1
    data = json.loads(both.stdout)
    assert [(d["log"], d["rank"], d["world_size"], d["inter_node"]) for d in data] == [("efa_2x8.log", r, 16, "EFA") for r in range(16)] + [
        ("mixed_efa_socket_2x4.log", r, 8, "EFA" if r < 4 else "Socket") for r in range(8)
    ]
    assert "mixed_efa_socket_2x4.log: ranks 4-7" in " ".join(both.stderr.split())
    assert "efa_2x8.log: " not in both.stderr
    empty = tmp_path / "empty.log"
    empty.write_text("no nccl here\n")
    bad = runner.invoke(app, ["doctor", efa, str(empty), "--expect", "efa"])
    assert bad.exit_code == 2
    assert "empty.log: no NCCL lines found" in " ".join(bad.stderr.split())
    assert "rayft-gpu-worker-7kq2m" in bad.stdout  # the good file is still reported


# ------------------------------------------------------------------------------------------ two jobs in one text


def test_single_job_logs_are_never_flagged_as_mixed():
    for log in sorted(FIXTURES.glob("*.log")):
        if log.name == "two_jobs_restart.log":  # the one that holds two jobs (tests/unit/test_doctor_faults.py)
            continue
        vs = verdicts_from_text(log.read_text())
        assert vs and mixed_jobs(vs) is None, log.name
        assert all(v.mixed is None for v in vs)


@real_logs
def test_one_text_holding_two_real_runs_is_flagged_and_split_by_comm_id():
    text = NVLINK_LOG.read_text() + "\n" + SOCKET_LOG.read_text()
    vs = verdicts_from_text(text)
    assert [(v.rank, v.pid, v.job, v.intra_node, v.intra_detail, v.gdr, v.interface) for v in vs] == [
        (0, 8198, "0xb7028a62e4204034", IntraNode.P2P, "P2P/CUMEM over NVLink", None, None),
        (1, 8197, "0xb7028a62e4204034", IntraNode.P2P, "P2P/CUMEM over NVLink", None, None),
        (0, 10912, "0xa2f5c74c2c3afe86", IntraNode.NET, "NET/Socket", False, "eth0 192.0.2.2"),
        (1, 10911, "0xa2f5c74c2c3afe86", IntraNode.NET, "NET/Socket", False, "eth0 192.0.2.2"),
    ]
    mixed = mixed_jobs(vs)
    assert mixed is not None and all(v.mixed == mixed for v in vs)
    assert mixed.startswith(
        "this log holds more than one NCCL job (rank 0 is vm pid 8198 and vm pid 10912; rank 1 is vm pid 8197 and vm pid 10911)"
    )
    assert "2 jobs, told apart by NCCL's commId" in mixed
    # a mixed text is a problem whatever was expected, listed first
    assert check(vs, "any") == [mixed]
    assert check(vs, "nvlink")[0] == mixed and len(check(vs, "nvlink")) == 2
    assert check(vs, "socket")[0] == mixed and len(check(vs, "socket")) == 2


@real_logs
def test_two_runs_without_comm_id_are_flagged_and_links_not_credited_by_rank():
    # older NCCL prints no commId: the jobs cannot be told apart, so no link is credited to a
    # rank number that names two processes
    text = re.sub(r" commId 0x[0-9a-f]+", "", NVLINK_LOG.read_text() + "\n" + SOCKET_LOG.read_text())
    vs = verdicts_from_text(text)
    assert [(v.rank, v.pid, v.job, v.intra_node, v.intra_detail) for v in vs] == [
        (0, 8198, None, IntraNode.P2P, "P2P/CUMEM over NVLink"),
        (0, 10912, None, IntraNode.NET, "NET/Socket"),
        (1, 8197, None, IntraNode.P2P, "P2P/CUMEM over NVLink"),
        (1, 10911, None, IntraNode.NET, "NET/Socket"),
    ]
    assert "were not credited to ranks 0-1" in mixed_jobs(vs)
    assert check(vs, "any") == [mixed_jobs(vs)]


def test_concatenated_fixture_jobs_of_different_sizes(tmp_path):
    text = fixture("efa_2x8.log") + "\n" + fixture("mixed_efa_socket_2x4.log")
    vs = verdicts_from_text(text)
    assert [(v.rank, v.world_size, v.host, v.inter_node) for v in vs] == [(r, 16, EFA_HOSTS[r // 8], InterNode.EFA) for r in range(16)] + [
        (r, 8, "rayft-gpu-worker-q1w2e" if r < 4 else "rayft-gpu-worker-r5t6y", InterNode.EFA if r < 4 else InterNode.SOCKET)
        for r in range(8)
    ]
    mixed = mixed_jobs(vs)
    assert mixed and "rank 0 is rayft-gpu-worker-7kq2m pid 2101 and rayft-gpu-worker-q1w2e pid 512" in mixed
    assert "and so on for ranks 2-7" in mixed

    stripped = re.sub(r" commId 0x[0-9a-f]+", "", text)
    assert "were not credited to ranks 0-7" in (mixed_jobs(verdicts_from_text(stripped)) or "")

    log = tmp_path / "two-runs.log"
    log.write_text(text)
    res = runner.invoke(app, ["doctor", str(log), "--expect", "efa"])
    assert res.exit_code == 2
    err = " ".join(res.stderr.split())
    assert "error: this log holds more than one NCCL job" in err
    assert "Pass each run's log as its own file." in err
    assert "0x5ab1e2d3c4f60718" in res.stdout and "0x77aa66bb55cc44dd" in res.stdout  # a job column

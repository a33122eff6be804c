"""rayft doctor on logs that went through Ray's log deduplication and log shippers (issue 20, part 1).

The fixtures come from tests/unit/fixtures/nccl/generate.py, whose RayDriver re-enacts Ray's
deduplication (RAY_DEDUP_LOGS=1): lines keyed by their words without digits, the first printed, the
rest folded into the last with "[repeated Nx across cluster]".
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rayft.cli import app
from rayft.nccl.doctor import InterNode, IntraNode, check, verdicts_from_text
from rayft.nccl.lines import LogLine, NcclLine, iter_log, parse_lines, ray_key, ray_ranks

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
runner = CliRunner()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ------------------------------------------------------------------------------------------ lines


def test_ray_key_is_the_words_without_digits():
    # P2P and NET/Socket channel lines share a key: the key does not tell the transport ...
    assert ray_key("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read") == "NCCL INFO Channel : -> via"
    assert ray_key("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0") == "NCCL INFO Channel : -> via"
    # ... but network connections are tagged, and SHM and the chosen network keep their words
    assert ray_key("NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0") == "NCCL INFO Channel : -> [send] via"
    assert ray_key("NCCL INFO Channel 00 : 1[1] -> 0[0] via SHM/direct/direct") == "NCCL INFO Channel : -> via SHM/direct/direct"
    assert ray_key("NCCL INFO Using network AWS Libfabric") == "NCCL INFO Using network AWS Libfabric"
    assert ray_key("NCCL INFO comm 0x7f0a rank 3 nRanks 8 nNodes 1 localRanks 8 localRank 3 MNNVL 0") == (
        "NCCL INFO comm rank nRanks nNodes localRanks localRank MNNVL"
    )


HINT = (
    "(Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see "
    "https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication for more options.)"
)


def test_fold_tag_in_colour_with_rays_hint_or_right_after_the_prefix():
    text = "\n".join(
        [
            f"\x1b[36m(RayTrainWorker pid=5, ip=10.0.0.1)\x1b[0m h:5:6 [0] NCCL INFO Using network Socket\x1b[32m [repeated 7x across cluster] {HINT}\x1b[0m",
            "(RayTrainWorker pid=6, ip=10.0.0.2) [repeated 3x across cluster] h2:6:7 [1] NCCL INFO NET/IB : No device found.",
            "(RayTrainWorker pid=7) h3:7:8 [2] NCCL INFO Using network Libfabric",
        ]
    )
    assert [(ln.host, ln.pid, ln.ray_ip, ln.msg, ln.repeated, ln.index) for ln in parse_lines(text)] == [
        ("h", 5, "10.0.0.1", "Using network Socket", 7, 0),
        ("h2", 6, "10.0.0.2", "NET/IB : No device found.", 3, 1),
        ("h3", 7, None, "Using network Libfabric", 1, 2),
    ]


def test_shipping_prefixes_are_removed():
    ray_line = "(RayTrainWorker pid=2101, ip=10.0.64.11) w-7kq2m:2101:2411 [0] NCCL INFO Using network Libfabric"
    record = json.dumps({"log": "\x1b[36m" + ray_line.replace(") ", ")\x1b[0m ", 1) + "\n", "stream": "stdout"})
    shipped = [
        ray_line,
        f"2026-11-30T12:10:00.123456789Z stdout F {ray_line}",  # the container runtime's log file (CRI)
        f"2026-11-30T12:10:00.123456789Z {ray_line}",  # kubectl logs --timestamps
        f"2026-11-30T12:10:00.037000+00:00 rayft-head-6d9f8/ray-head {record}",  # aws logs tail of a Fluent Bit record
        record,  # the Fluent Bit record alone
        json.dumps({"message": ray_line, "logStream": "ray-head"}),  # a CloudWatch Logs Insights export
        f"2026-11-30 09:12:01,118\t{ray_line}",
    ]
    for line in shipped:
        assert [(ln.host, ln.pid, ln.ray_ip, ln.msg) for ln in parse_lines(line)] == [
            ("w-7kq2m", 2101, "10.0.64.11", "Using network Libfabric")
        ], line


def test_other_lines_keep_pytorchs_rank_and_rays_pid():
    text = "\n".join(
        [
            "(RayTrainWorker pid=44, ip=10.0.0.9) [rank3]:[E1130 16:40:12.1 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught ...",
            "(RayTrainWorker pid=44, ip=10.0.0.9) h9:44:45 [0] NCCL WARN Net : Connection closed by remote peer",
            "",
            "plain line",
        ]
    )
    got = list(iter_log(text))
    assert got == [
        LogLine("[E1130 16:40:12.1 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught ...", 44, "10.0.0.9", 3, 1, 0),
        NcclLine("h9", 44, 45, "WARN", "Net : Connection closed by remote peer", "10.0.0.9", 1, False, 1),
        LogLine("plain line", None, None, None, 1, 3),
    ]


def test_ray_train_rank_table():
    ranks = ray_ranks(fixture("dedup_2x4_mixed.log"))
    assert ranks.world == 8
    assert ranks.ip == {r: "10.0.64.50" if r < 4 else "10.0.80.51" for r in range(8)}
    assert ranks.by_ip_pid[("10.0.80.51", 701)] == 5 and ranks.by_ip_pid[("10.0.64.50", 701)] == 1


# ------------------------------------------------------------------------------------------ crediting folded ranks


def test_healthy_single_host_job_passes_although_ray_folded_three_ranks_away():
    # Before issue 20: "ranks 1-3 left no NCCL line in the log", exit 1 with --expect nvlink.
    vs = verdicts_from_text(fixture("dedup_1x8_nvlink.log"))
    assert [(v.rank, v.pid, v.inter_node, v.intra_node, v.intra_detail, v.evidence) for v in vs] == [
        (0, 5100, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "channels"),
        (1, 5101, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "folded"),
        (2, 5102, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "folded"),
        (3, 5103, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "folded"),
        (4, 5104, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "channels"),
        (5, 5105, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "init"),  # credited by rank 4's send
        (6, 5106, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "folded"),
        (7, 5107, InterNode.NONE, IntraNode.P2P, "P2P/CUMEM over NVLink", "folded"),
    ]
    assert vs[1].host is None and vs[1].ip == "10.0.64.20"  # from Ray Train's rank table
    assert vs[1].notes == [
        "no NCCL line of its own: Ray's log deduplication folded its lines into other workers' ('[repeated Nx across cluster]'); "
        "credited from 'NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.' (5 copies), "
        "'Using network Socket' (6 copies), 58 folded channel lines 'via P2P/CUMEM'; set RAY_DEDUP_LOGS=0 for per-rank certainty"
    ]
    assert vs[7].notes[0].startswith("lines missing for this rank taken from Ray's folded lines, where every copy agrees")
    assert check(vs, "nvlink") == []
    res = runner.invoke(app, ["doctor", str(FIXTURES / "dedup_1x8_nvlink.log"), "--expect", "nvlink"])
    assert res.exit_code == 0, res.output
    assert "all 8 ranks used nvlink" in res.stderr
    assert res.stdout.count("ok (folded)") == 5


def test_socket_fallback_shipped_to_cloudwatch_is_socket_on_every_rank():
    vs = verdicts_from_text(fixture("dedup_2x8_socket_cloudwatch.log"))
    ranked = [v for v in vs if v.rank is not None]
    assert [v.rank for v in ranked] == list(range(16))
    assert {(v.inter_node, v.intra_node) for v in vs} == {(InterNode.SOCKET, IntraNode.P2P)}
    assert [v.rank for v in ranked if v.evidence == "folded"] == [0, 1, 2, 5, 6, 7, 9, 10, 11, 12, 14, 15]
    assert all(v.causes and v.causes[0].text.startswith("OFI plugin not found") for v in vs)
    # six processes whose rank line Ray folded away: listed on their own, said to be among the unseen ranks
    unranked = [(v.host, v.pid) for v in vs if v.rank is None]
    assert unranked == [("rayft-gpu-worker-c7m2p", p) for p in (6200, 6201, 6202, 6206, 6207)] + [("rayft-gpu-worker-k8d4s", 6223)]
    assert (
        vs[16].notes[0] == "its rank is not in the log (Ray folded its 'comm ... rank R' lines): it is one of ranks 0-2, 5-7, 9-11, 14-15"
    )
    assert check(vs, "efa") == [
        "ranks 0-15 and rayft-gpu-worker-c7m2p:6200, rayft-gpu-worker-c7m2p:6201, rayft-gpu-worker-c7m2p:6202, "
        "rayft-gpu-worker-c7m2p:6206, rayft-gpu-worker-c7m2p:6207, rayft-gpu-worker-k8d4s:6223 (on rayft-gpu-worker-c7m2p, "
        "rayft-gpu-worker-k8d4s) used Socket between hosts, not EFA. Likely cause: OFI plugin not found: NCCL could not load "
        "libnccl-net.so (aws-ofi-nccl not installed or not on LD_LIBRARY_PATH)"
    ]


def test_mixed_job_folded_says_unknown_and_why_only_where_it_is():
    vs = verdicts_from_text(fixture("dedup_2x4_mixed.log"))
    assert [(v.rank, v.host, v.pid, v.inter_node, v.intra_node, v.evidence) for v in vs] == [
        (0, "rayft-gpu-worker-m3n4b", 700, InterNode.EFA, IntraNode.P2P, "channels"),
        (1, "rayft-gpu-worker-m3n4b", 701, InterNode.EFA, IntraNode.P2P, "init"),
        (2, "rayft-gpu-worker-m3n4b", 702, InterNode.UNKNOWN, IntraNode.P2P, "folded"),
        (3, "rayft-gpu-worker-m3n4b", 703, InterNode.EFA, IntraNode.P2P, "channels"),
        (4, "rayft-gpu-worker-v6c7x", 700, InterNode.SOCKET, IntraNode.P2P, "channels"),
        (5, "rayft-gpu-worker-v6c7x", 701, InterNode.UNKNOWN, IntraNode.P2P, "folded"),
        (6, "rayft-gpu-worker-v6c7x", 702, InterNode.SOCKET, IntraNode.P2P, "folded"),
        (7, "rayft-gpu-worker-v6c7x", 703, InterNode.SOCKET, IntraNode.P2P, "channels"),
    ]
    why = (
        "Ray folded 'Using network Libfabric' (2 copies) and 'Using network Socket' (2 copies) of several workers, so which "
        "rank used which network cannot be told; set RAY_DEDUP_LOGS=0 to keep every worker's lines"
    )
    assert [v.unknown_why for v in vs] == [None, None, why, None, None, why, None, None]
    assert check(vs, "efa")[0] == (
        f"ranks 2, 5 (on rayft-gpu-worker-m3n4b, rayft-gpu-worker-v6c7x) had an unknown inter-node transport, so EFA cannot be verified ({why})"
    )


def test_too_few_folded_copies_credit_no_rank():
    # 4 ranks, ranks 2 and 3 left no line; Ray folded one copy of "Using network Socket": not
    # enough for two ranks, so neither is credited (and each says why there is no verdict)
    def w(pid, rank, msg, tag=""):
        return f"(RayTrainWorker pid={pid}) n{rank // 2}:{pid}:{pid} [{rank % 2}] NCCL INFO {msg}{tag}"

    text = "\n".join(
        [
            w(10, 0, "comm 0x7f01 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0"),
            w(10, 0, "Using network Socket"),
            w(11, 1, "comm 0x7f02 rank 1 nRanks 4 nNodes 2 localRanks 2 localRank 1 MNNVL 0"),
            w(11, 1, "Using network Socket", " [repeated 2x across cluster]"),
        ]
    )
    vs = verdicts_from_text(text)
    assert [(v.rank, v.inter_node, v.evidence) for v in vs] == [
        (0, InterNode.SOCKET, "init"),
        (1, InterNode.SOCKET, "init"),
        (2, InterNode.UNKNOWN, "none"),
        (3, InterNode.UNKNOWN, "none"),
    ]
    assert vs[2].notes == [
        "no NCCL line from this rank in the log: Ray's log deduplication folded 1 line of several workers, none of which "
        "tells this rank's transport (set RAY_DEDUP_LOGS=0)"
    ]
    assert "ranks 2-3 left no NCCL line in the log, so the transport cannot be verified" in check(vs, "socket")

"""What the doctor says about one rank's transport (:class:`RankVerdict`): its inter-node and
intra-node transports, and the causes of a fallback; what :mod:`rayft.nccl.verdicts` produces and
the doctor's checks read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class InterNode(str, Enum):
    """How a rank reached GPUs on other hosts."""

    EFA = "EFA"  # aws-ofi-nccl (libfabric) with the efa provider
    LIBFABRIC = "Libfabric"  # aws-ofi-nccl with another provider (tcp, sockets, ...)
    IB = "InfiniBand"  # NCCL's internal IB verbs transport (IB or RoCE)
    SOCKET = "Socket"  # NCCL's internal TCP socket transport: the slow fallback
    NONE = "none"  # no peers on other hosts (single-node job)
    UNKNOWN = "unknown"  # multi-node, but the log shows neither channels nor the chosen network


class IntraNode(str, Enum):
    """How a rank reached GPUs on its own host (the worst transport seen wins)."""

    P2P = "P2P"  # CUDA peer-to-peer (NVLink or PCIe): P2P/CUMEM, P2P/IPC, P2P/direct pointer
    NVLS = "NVLS"  # NVLink SHARP
    SHM = "SHM"  # through host shared memory
    NET = "network"  # through the network transport (e.g. NET/Socket with P2P and SHM disabled)
    NONE = "none"  # no other GPU on this host
    UNKNOWN = "unknown"  # local peers exist but no channel lines were logged


@dataclass(frozen=True)
class Cause:
    """A likely reason for a fallback; ``scope`` says which expectation it explains."""

    scope: str  # "inter" (EFA / network), "intra" (P2P / SHM), "both"
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class RankVerdict:
    """What one rank (one process) used, and why it may not be what was wanted."""

    rank: int | None
    world_size: int | None
    host: str | None
    pid: int | None
    ip: str | None = None
    local_rank: int | None = None
    cuda_dev: int | None = None
    bus_id: str | None = None
    n_nodes: int | None = None  # hosts in the job (from the ranks' hosts, else NCCL's nNodes)
    inter_node: InterNode = InterNode.UNKNOWN
    inter_detail: str = ""  # e.g. "aws-ofi-nccl 1.13.2, provider efa, 32 NICs"
    provider: str | None = None  # libfabric provider when aws-ofi-nccl was loaded
    intra_node: IntraNode = IntraNode.UNKNOWN
    intra_detail: str = ""  # e.g. "P2P/CUMEM over NVLink", "SHM/direct/direct"
    p2p_link: str | None = None  # "NVLink", "PCIe" or None (unknown / not P2P)
    gdr: bool | None = None  # GPUDirect RDMA on the network links (None: no network links)
    interface: str | None = None  # data-plane interface(s) of the network transport
    bootstrap: str | None = None  # bootstrap interface, e.g. "eth0 192.0.2.2"
    # "channels" (connections logged), "init" (only init lines), "folded" (no line of its own: credited
    # from lines Ray's deduplication folded), "none"
    evidence: str = "channels"
    nccl_version: str | None = None
    causes: list[Cause] = field(default_factory=list)  # likely reasons for a fallback
    notes: list[str] = field(default_factory=list)
    job: str | None = None  # NCCL commId of the rank's world communicator, when logged
    mixed: str | None = None  # set when the text held more than one job: what clashed, and what was done
    nics: int | None = None  # devices aws-ofi-nccl found ("found 32 nics")
    platform: str | None = None  # the EC2 instance type aws-ofi-nccl detected ("Running on p5.48xlarge platform")
    socket_ifs: list[str] = field(default_factory=list)  # NCCL's socket interfaces ("eth0 10.0.0.1"), whatever it used
    shm_failure: str | None = None  # NCCL's first failure to create a /dev/shm segment
    unknown_why: str | None = None  # why a transport stayed "unknown", where the log tells why

    @property
    def seen(self) -> bool:
        """False for a rank of the job that left no NCCL line in the log."""
        return self.evidence != "none"

    @property
    def where(self) -> str:
        """Human label: ``rank 3 (host-a pid 412)``."""
        who = f"rank {self.rank}" if self.rank is not None else "rank ?"
        if self.host or self.pid:
            who += f" ({self.host or '?'} pid {self.pid})"
        return who


def label_ranks(ranks: list[int]) -> str:
    """``[0,1,2,5,8,9]`` -> ``"0-2, 5, 8-9"``."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(parts)

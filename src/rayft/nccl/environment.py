"""Environment faults NCCL logs and survives: they fail a run by default (``rayft doctor --env-faults``).

A job can train with every rank on the expected transport and still run on a broken node set-up
that costs speed or fails later. From the per-rank verdicts (:mod:`rayft.nccl.verdicts`) and the
instance catalog (:mod:`rayft.cluster.instances`) this module finds:

* ``shm``: NCCL could not create its /dev/shm segment (a container's 64 MB default);
* ``link-local``: NCCL's sockets or bootstrap on a link-local address (169.254.x.x, fe80::), which
  does not route between hosts (also when the log holds nothing but the socket plugin's init line);
* ``interface``: the loopback or a bridge (lo, docker0, ...) used between hosts;
* ``gdr``: EFA without GPUDirect RDMA on an instance type that has it (p4d, p5, ...);
* ``efa-count``: fewer EFA devices than the instance type has (1 of p5.48xlarge's 32).

The instance type is the one given, else the one aws-ofi-nccl names (``NET/OFI Running on
p5.48xlarge platform``). Each :class:`Fault` says which ranks, what, and what to do next.

Pure functions: no file or process I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rayft.cluster.instances import EFA_RESOURCE, InstanceType, UnknownInstanceTypeError, get_instance
from rayft.nccl.verdict_types import InterNode, RankVerdict

__all__ = ["Fault", "environment_faults", "instance_of"]


@dataclass
class Fault:
    """One environment fault, on the ranks that show it."""

    kind: str  # "shm", "link-local", "interface", "gdr", "efa-count"
    text: str  # what is wrong and what to do next, in one line
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


_LINK_LOCAL = re.compile(r"^(?:169\.254\.|fe80:)", re.I)
_LOOPBACK = re.compile(r"^(?:127\.|::1$)")
_SUSPECT_IFACE = re.compile(r"^(?:lo|docker\d*|virbr\d*|cni\d*|flannel.*|kube-ipvs\d*)$")


def instance_of(verdicts: list[RankVerdict], instance_type: str | None = None) -> tuple[InstanceType | None, str | None]:
    """(the catalog's entry, a note) for ``instance_type``, else for the type aws-ofi-nccl named.

    The note says why there is no entry (the type is not in the shipped catalog, or the logs name
    none), or is None.
    """
    name = instance_type or next((v.platform for v in verdicts if v.platform), None)
    if name is None:
        return None, None
    try:
        return get_instance(name), None
    except UnknownInstanceTypeError:
        return None, f"instance type {name} is not in rayft's instance catalog: its EFA and GPUDirect RDMA checks were skipped"


def environment_faults(verdicts: list[RankVerdict], instance_type: str | None = None) -> list[Fault]:
    """The environment faults the ranks' logs show (see the module's list), merged over ranks."""
    inst, _ = instance_of(verdicts, instance_type)
    found: dict[tuple[str, str], Fault] = {}

    def add(v: RankVerdict, kind: str, text: str) -> None:
        f = found.setdefault((kind, text), Fault(kind, text))
        if v.rank is not None and v.rank not in f.ranks:
            f.ranks.append(v.rank)
        host = v.host or v.ip
        if host and host not in f.hosts:
            f.hosts.append(host)

    for v in verdicts:
        if v.shm_failure:
            add(
                v,
                "shm",
                "/dev/shm is too small for NCCL's shared-memory segments (a container's default is 64 MB): mount a larger "
                "memory-backed /dev/shm in the worker pods (cluster.kube.shm_size in the manifest; docker run --shm-size)",
            )
        multi = v.n_nodes != 1  # unknown counts: a log of init lines only does not say
        addrs = [tuple(i.split(" ", 1)) for i in v.socket_ifs]
        if v.bootstrap:
            addrs.append(tuple(v.bootstrap.split(" ", 1)))
        for name, addr in addrs:
            if _LINK_LOCAL.match(addr) and multi:
                add(
                    v,
                    "link-local",
                    f"NCCL's sockets use the link-local interface {name} {addr}, which does not route between hosts: "
                    "set NCCL_SOCKET_IFNAME to the pod's primary interface (eth0; rayft manifest sets it)",
                )
            elif (_LOOPBACK.match(addr) or _SUSPECT_IFACE.match(name)) and multi:
                add(
                    v,
                    "interface",
                    f"NCCL's sockets use {name} {addr}, which other hosts cannot reach: set NCCL_SOCKET_IFNAME to the pod's "
                    "primary interface (eth0), or exclude the bad ones (NCCL_SOCKET_IFNAME=^lo,docker)",
                )
        if inst is None or v.inter_node != InterNode.EFA:
            continue
        if inst.gpudirect_rdma and v.gdr is False:
            add(
                v,
                "gdr",
                f"EFA without GPUDirect RDMA on {inst.name}, which has it (no /GDRDMA on the network channels): set "
                "FI_EFA_USE_DEVICE_RDMA=1 (rayft manifest does), leave NCCL_NET_GDR_LEVEL unset, and use an image whose "
                "EFA installer registers GPU memory (dmabuf or nvidia-peermem)",
            )
        if v.nics is not None and 0 < v.nics < inst.max_efa_interfaces:
            add(
                v,
                "efa-count",
                f"aws-ofi-nccl found {v.nics} EFA device{'s' if v.nics != 1 else ''} where {inst.name} has "
                f"{inst.max_efa_interfaces}: request {EFA_RESOURCE}: {inst.max_efa_interfaces} in the worker pods "
                "(rayft manifest does with cluster.efa: true) and check the EFA device plugin runs on the node",
            )
    for f in found.values():
        f.ranks.sort()
    return list(found.values())

"""The likely causes of a rank's fallback (:func:`causes_of`), from what its process logged: the
network plugin that did not load, the provider aws-ofi-nccl chose, a link-local or loopback
interface, peer-to-peer access refused.
"""

from __future__ import annotations

import re

from rayft.nccl.processes import Proc
from rayft.nccl.verdict_types import Cause, InterNode, RankVerdict

_LINK_LOCAL = re.compile(r"^(?:169\.254\.|fe80:)", re.I)
_LOOPBACK = re.compile(r"^(?:127\.|::1$)")
_SUSPECT_IFACE = re.compile(r"^(?:lo|docker\d*|virbr\d*|cni\d*|flannel.*|kube-ipvs\d*)$")


_OFI_HINTS = [
    (
        re.compile(r"No data available|fi_getinfo|No eligible providers|optimal provider|output empty", re.I),
        "libfabric offered this process no EFA endpoint: its pod must request vpc.amazonaws.com/efa and see "
        "/dev/infiniband/uverbs* (`fi_info -p efa` in the pod shows what libfabric finds)",
    ),
    (
        re.compile(r"Cannot allocate memory|ENOMEM|memlock|locked memory", re.I),
        "the locked-memory limit is too low for EFA: run the worker pods with `ulimit -l unlimited`",
    ),
    (
        re.compile(r"Permission denied|EACCES|Operation not permitted", re.I),
        "the process may not open /dev/infiniband: request the devices as vpc.amazonaws.com/efa, not through a hostPath mount",
    ),
    (
        re.compile(r"Function not implemented|not supported|Only EFA provider", re.I),
        "the image's libfabric lacks what aws-ofi-nccl needs: take both from one EFA installer",
    ),
]


def _ofi_hint(said: str) -> str:
    return next(
        (hint for rx, hint in _OFI_HINTS if rx.search(said)),
        "the NET/OFI WARN lines before it say why (`fi_info -p efa` in the pod shows what libfabric finds)",
    )


def causes_of(p: Proc, v: RankVerdict) -> list[Cause]:
    """Likely reasons this rank did not get EFA / P2P, from the evidence in its own lines."""
    out: list[Cause] = []
    env = p.env
    if env.get("NCCL_NET", "").lower() == "socket":
        out.append(Cause("both", "NCCL_NET=Socket set by the environment (forces TCP sockets)"))
    if env.get("NCCL_P2P_DISABLE") == "1":
        out.append(Cause("intra", "NCCL_P2P_DISABLE=1 set by the environment (no GPU peer-to-peer)"))
    if env.get("NCCL_SHM_DISABLE") == "1":
        out.append(Cause("intra", "NCCL_SHM_DISABLE=1 set by the environment (no shared-memory transport)"))
    if p.shm_failed:
        out.append(
            Cause(
                "intra",
                "shared memory too small: NCCL could not create its /dev/shm segment "
                "(mount a larger /dev/shm, e.g. an emptyDir with medium: Memory)",
            )
        )
    net_like = v.inter_node in (InterNode.SOCKET, InterNode.IB, InterNode.UNKNOWN)
    if net_like and "NCCL_NET" not in env:
        if p.plugin_missing and not p.ofi_seen and not p.plugin_loaded:
            out.append(
                Cause(
                    "inter",
                    "OFI plugin not found: NCCL could not load libnccl-net.so (aws-ofi-nccl not installed or not on LD_LIBRARY_PATH)",
                )
            )
        elif p.ofi_failed or any("ibfabric" in n or "OFI" in n for n in p.net_init_failed):
            said = p.ofi_failed[0] if p.ofi_failed else f"Failed to initialize NET plugin {p.net_init_failed[0]}"
            out.append(Cause("inter", f"aws-ofi-nccl failed to initialise on this rank: the log says '{said}'; {_ofi_hint(said)}"))
        elif not p.ofi_seen and v.inter_node == InterNode.SOCKET:
            out.append(Cause("inter", "aws-ofi-nccl never initialized (no NET/OFI line from this rank)"))
    if v.inter_node == InterNode.LIBFABRIC and p.provider and p.provider != "efa":
        out.append(
            Cause(
                "inter",
                f"libfabric provider is {p.provider}, not efa (FI_PROVIDER set, or no EFA device so libfabric chose a TCP provider)",
            )
        )
    if v.interface and p.socket_ifs:
        for name, addr in p.socket_ifs:
            if _LINK_LOCAL.match(addr):
                out.append(
                    Cause(
                        "inter",
                        f"link-local interface: {name} {addr} cannot route between hosts "
                        "(set NCCL_SOCKET_IFNAME to the pod's primary interface, e.g. eth0)",
                    )
                )
            elif (_LOOPBACK.match(addr) or _SUSPECT_IFACE.match(name)) and v.n_nodes != 1:
                out.append(Cause("inter", f"wrong interface: {name} {addr} is not reachable from other hosts (set NCCL_SOCKET_IFNAME)"))
    if p.bootstrap and _LINK_LOCAL.match(p.bootstrap[1]):
        out.append(Cause("inter", f"link-local bootstrap interface: {p.bootstrap[0]} {p.bootstrap[1]} (set NCCL_SOCKET_IFNAME)"))
    return out

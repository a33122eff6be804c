"""NCCL's debug messages gathered into processes: what each process logged of its communicators,
connections, network plugin, interfaces and topology.

A process is keyed by NCCL's hostname and pid (``host:pid:tid [dev]``), or by Ray's pid where
NCCL's prefix was cut off (:mod:`rayft.nccl.lines` reads the lines). :func:`collect` returns the
processes of a text with Ray Train's rank table and the lines Ray's deduplication folded;
:mod:`rayft.nccl.verdicts` turns them into per-rank verdicts. The patterns follow the wordings of
NCCL 2.4 .. 2.28 and aws-ofi-nccl 1.x.

Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace

from rayft.nccl.lines import NcclLine, RayRanks, parse_lines, ray_ranks

__all__ = [
    "ASSIGNED_NET",
    "CHANNEL",
    "ENV_SET",
    "NET_INIT_FAILED",
    "OFI_FAILED",
    "OFI_PROVIDER",
    "PLUGIN_LOADED",
    "PLUGIN_MISSING",
    "USING_NETWORK",
    "Comm",
    "Key",
    "Link",
    "Pool",
    "Proc",
    "classify_via",
    "collect",
    "feed",
    "host_key",
    "plugin_evidence",
    "share_plugin_evidence",
    "share_topology",
]


@dataclass(frozen=True)
class Link:
    """One connection a rank logged: ``Channel 03/0 : 3[3] -> 4[4] via P2P/CUMEM``."""

    peer: int  # the other end, in the communicator's rank numbering
    via: str  # the text after "via", e.g. "NET/AWS Libfabric/0/GDRDMA"
    kind: str  # "P2P", "SHM", "NET", "NVLS", "other"
    net: str | None = None  # NET only: "Socket", "IB", "AWS Libfabric", "Libfabric", ...
    gdr: bool = False
    same_host: bool | None = None


# --------------------------------------------------------------------------------------------
# Per-message patterns (wordings of NCCL 2.4 .. 2.28 and aws-ofi-nccl 1.x).

_COMM_INFO = re.compile(
    r"\bcomm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)"
    r" localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)"
)
_COMM_INIT = re.compile(
    r"\bcomm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+)"
    r"(?: nvmlDev \d+)? busId (?P<bus>[0-9a-fA-F]+)(?:.*?\bcommId (?P<cid>0x[0-9a-fA-F]+))?"
)
CHANNEL = re.compile(
    r"\b(?:Channel|Ring|Tree) \d+(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fA-F]+\])? -> (?P<dst>\d+)"
    r"(?:\[[0-9a-fA-F]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$"
)
USING_NETWORK = re.compile(r"\bUsing (?:internal )?[Nn]etwork (?!plugin)(?P<net>[A-Za-z][\w ]*?)\s*\.?$")
ASSIGNED_NET = re.compile(r"\bAssigned NET plugin (?P<net>.+?) to comm")
_SOCKET_IFS = re.compile(r"NET/Socket ?: Using (?P<ifs>.+)$")
_IFACE = re.compile(r"\[\d+\](?P<name>[^:\s\[]+):(?P<addr>\S+?)<\d+>")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?:\[\d+\])?(?P<name>[^:\s]+):(?P<addr>\S+?)<\d+>")
_IB_DEVS = re.compile(r"NET/IB ?: Using (?P<devs>[^;]*)")
_IB_DEV = re.compile(r"\[\d+\](?P<dev>\S+)")
OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<prov>[\w;+-]+)")
_OFI_FABRIC = re.compile(r"fabric is (?P<fabric>[^\s(,]+)")
_OFI_NICS = re.compile(r"\(found (?P<n>\d+) nics?\)")
_OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<v>\S+)")
_LIBFABRIC_VERSION = re.compile(r"NET/OFI Using Libfabric version (?P<v>\S+)")
PLUGIN_LOADED = re.compile(r"NET/Plugin ?: Loaded (?:net|NET) plugin (?P<name>.+?)(?: \(v\d+\))?\.?$")
PLUGIN_MISSING = re.compile(
    r"NET/Plugin ?:.*(?:Could not find:? libnccl-net|No plugin found|Plugin load.*returned|"
    r"libnccl-net[\w.-]*: cannot open shared object)",
    re.I,
)
NET_INIT_FAILED = re.compile(r"Failed to initialize NET plugin (?P<name>.+?)\.?$")
OFI_FAILED = re.compile(
    r"fi_getinfo.*(?:failed|empty)|No eligible providers|Unable to find a protocol|"
    r"Couldn't find any optimal provider|aws-ofi-nccl initialization failed|No NIC info|"
    r"OFI plugin initNet\(\) failed",
    re.I,
)
ENV_SET = re.compile(r"\b(?P<var>(?:NCCL|FI)_[A-Z0-9_]+) set by environment to (?P<val>\S+?)\.?$")
_SHM_FAILED = re.compile(r"/dev/shm|posix_fallocate|shared memory segment|ncclShmOpen", re.I)
_GRAPH_TYPE = re.compile(r"\bPattern \d+, crossNic \d+, nChannels \d+, .*\btype (?P<intra>[A-Z]+)/(?P<inter>[A-Z]+)")
_COLL_CHANNELS = re.compile(r"^(?P<coll>\d+) coll channels,.*?(?:(?P<nvls>\d+) nvls channels)?")
_GDR_HCA = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:HCA|GPU)")
_VERSION = re.compile(r"^NCCL version (?P<v>\S+)")
_OFI_PLATFORM = re.compile(r"NET/OFI Running on (?P<type>[a-z0-9][\w.-]*\.\w+) platform")


@dataclass
class Comm:
    ptr: str
    rank: int
    nranks: int
    nnodes: int | None = None
    local_ranks: int | None = None
    local_rank: int | None = None
    comm_id: str | None = None  # NCCL's commId: the same in every rank of one communicator


@dataclass
class Proc:
    host: str | None
    pid: int
    ips: set[str] = field(default_factory=set)
    nlines: int = 0
    comms: dict[str, Comm] = field(default_factory=dict)
    tid_comm: dict[int, str] = field(default_factory=dict)
    links: list[tuple[str | None, Link]] = field(default_factory=list)  # (comm ptr, link)
    cuda_dev: int | None = None
    bus_id: str | None = None
    using_network: list[str] = field(default_factory=list)
    socket_ifs: list[tuple[str, str]] = field(default_factory=list)
    ib_devs: list[str] = field(default_factory=list)
    bootstrap: tuple[str, str] | None = None
    ofi_seen: bool = False
    ofi_version: str | None = None
    libfabric_version: str | None = None
    provider: str | None = None
    fabric: str | None = None
    nics: int | None = None
    platform: str | None = None
    plugin_loaded: str | None = None
    plugin_missing: bool = False
    ofi_failed: list[str] = field(default_factory=list)
    net_init_failed: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    shm_failed: list[str] = field(default_factory=list)
    graph_intra: set[str] = field(default_factory=set)
    coll_channels: int | None = None
    nvls_channels: int | None = None
    gdr_hca: set[str] = field(default_factory=set)
    version: str | None = None
    repeated: int = 0
    borrowed: int | None = None  # pid whose plugin lines stand in for this process's folded ones
    credited: list[str] = field(default_factory=list)  # messages taken from Ray's folded lines
    unknown_why: str | None = None  # why its inter-node transport cannot be told, where the log says

    def primary(self) -> Comm | None:
        """The communicator that names this process's rank: the largest one seen (the world)."""
        if not self.comms:
            return None
        return max(self.comms.values(), key=lambda c: c.nranks)


def classify_via(via: str) -> tuple[str, str | None, bool]:
    """``"NET/AWS Libfabric/0/GDRDMA"`` -> ``("NET", "AWS Libfabric", True)``."""
    v = via.strip()
    if v.startswith("P2P"):
        return "P2P", None, False
    if v.startswith("SHM") or "shared memory" in v:
        return "SHM", None, False
    if v.startswith("NVLS"):
        return "NVLS", None, False
    if v.startswith("NET/"):
        return "NET", v.split("/")[1].strip() or "?", "GDRDMA" in v
    return "other", None, False  # CollNet and the like


def feed(proc: Proc, ln: NcclLine) -> None:
    msg = ln.msg
    proc.nlines += 1
    if ln.repeated > 1:
        proc.repeated += ln.repeated - 1
    if ln.ray_ip:
        proc.ips.add(ln.ray_ip)

    if m := CHANNEL.search(msg):
        kind, net, gdr = classify_via(m["via"])
        src, dst = int(m["src"]), int(m["dst"])
        ptr = proc.tid_comm.get(ln.tid) if ln.tid is not None else None
        comm = proc.comms.get(ptr) if ptr else proc.primary()
        me = comm.rank if comm else None
        if m["dir"] == "receive":
            peer = src
        elif m["dir"] == "send":
            peer = dst
        else:
            peer = dst if src == me or me is None else src
        proc.links.append((comm.ptr if comm else None, Link(peer, m["via"].strip(), kind, net, gdr)))
        return
    if m := _COMM_INFO.search(msg):
        c = proc.comms.setdefault(m["ptr"], Comm(m["ptr"], int(m["rank"]), int(m["nranks"])))
        c.nnodes, c.local_ranks, c.local_rank = int(m["nnodes"]), int(m["lranks"]), int(m["lrank"])
        if ln.tid is not None:
            proc.tid_comm[ln.tid] = m["ptr"]
        return
    if m := _COMM_INIT.search(msg):
        c = proc.comms.setdefault(m["ptr"], Comm(m["ptr"], int(m["rank"]), int(m["nranks"])))
        proc.cuda_dev, proc.bus_id = int(m["dev"]), m["bus"]
        if m["cid"] and "Destroy" not in msg:
            c.comm_id = c.comm_id or m["cid"]
        if ln.tid is not None and "Destroy" not in msg:
            proc.tid_comm[ln.tid] = m["ptr"]
        return
    if m := ENV_SET.search(msg):
        proc.env[m["var"]] = m["val"]
    if (m := USING_NETWORK.search(msg)) or (m := ASSIGNED_NET.search(msg)):
        if m["net"] not in proc.using_network:
            proc.using_network.append(m["net"])
        return
    if m := _SOCKET_IFS.search(msg):
        proc.socket_ifs = [(i["name"], i["addr"]) for i in _IFACE.finditer(m["ifs"])]
        return
    if m := _BOOTSTRAP.search(msg):
        proc.bootstrap = (m["name"], m["addr"])
        return
    if "NET/IB" in msg and (m := _IB_DEVS.search(msg)):
        proc.ib_devs = [d["dev"] for d in _IB_DEV.finditer(m["devs"])]
        return
    if "NET/OFI" in msg:
        proc.ofi_seen = True
        if m := OFI_PROVIDER.search(msg):
            proc.provider = m["prov"].split(";")[0]
            if f := _OFI_FABRIC.search(msg):
                proc.fabric = f["fabric"]
            if n := _OFI_NICS.search(msg):
                proc.nics = int(n["n"])
        elif m := _OFI_VERSION.search(msg):
            proc.ofi_version = m["v"]
        elif m := _OFI_PLATFORM.search(msg):
            proc.platform = m["type"]
        elif m := _LIBFABRIC_VERSION.search(msg):
            proc.libfabric_version = m["v"]
    if OFI_FAILED.search(msg):
        proc.ofi_failed.append(msg)
        return
    if m := PLUGIN_LOADED.search(msg):
        proc.plugin_loaded = m["name"]
        return
    if PLUGIN_MISSING.search(msg):
        proc.plugin_missing = True
        return
    if m := NET_INIT_FAILED.search(msg):
        proc.net_init_failed.append(m["name"])
        return
    if ln.level == "WARN" and _SHM_FAILED.search(msg):
        proc.shm_failed.append(msg)
        return
    if m := _GRAPH_TYPE.search(msg):
        proc.graph_intra.add(m["intra"])
        return
    if m := _COLL_CHANNELS.search(msg):
        proc.coll_channels = max(proc.coll_channels or 0, int(m["coll"]))
        if m["nvls"]:
            proc.nvls_channels = max(proc.nvls_channels or 0, int(m["nvls"]))
        return
    if m := _GDR_HCA.search(msg):
        proc.gdr_hca.add(m["state"])
        return
    if m := _VERSION.search(msg):
        proc.version = m["v"]


# --------------------------------------------------------------------------------------------
# From lines to processes to verdicts.


Key = tuple[str | None, int]
Pool = list[tuple[NcclLine, int]]  # Ray's folded lines: (the printed one, copies by workers the log does not name)


def collect(text: str) -> tuple[dict[Key, Proc], RayRanks, Pool]:
    lines = parse_lines(text)
    # NCCL hostnames glued to a previous fragment ("P2P/CUMEMvm" for "vm"): fold them into the
    # process whose host is a suffix and shares the pid, seen more often.
    counts: dict[Key, int] = defaultdict(int)
    for ln in lines:
        counts[(ln.host, ln.pid)] += 1
    alias: dict[Key, Key] = {}
    for host, pid in counts:
        if host is None:
            continue
        best = None
        for h2, p2 in counts:
            if p2 == pid and h2 and h2 != host and host.endswith(h2) and counts[(h2, p2)] > counts[(host, pid)]:
                if best is None or len(h2) > len(best):
                    best = h2
        if best:
            alias[(host, pid)] = (best, pid)
    # Lines with only Ray's prefix: attach to the one NCCL process with that pid (and ip).
    by_pid: dict[int, list[Key]] = defaultdict(list)
    for key in counts:
        if key[0] is not None and key not in alias:
            by_pid[key[1]].append(key)

    # A glued head's hostname swallowed the tail of the message before it: give it back.
    for i, ln in enumerate(lines):
        if ln.glued and (ln.host, ln.pid) in alias:
            true_host = alias[(ln.host, ln.pid)][0]
            tail = ln.host[: len(ln.host) - len(true_host)]
            lines[i - 1] = replace(lines[i - 1], msg=lines[i - 1].msg + tail)

    procs: dict[Key, Proc] = {}
    pool: Pool = []
    for ln in lines:
        key = alias.get((ln.host, ln.pid), (ln.host, ln.pid))
        if key[0] is None and len(by_pid.get(ln.pid, [])) == 1:
            key = by_pid[ln.pid][0]
        proc = procs.get(key)
        if proc is None:
            proc = procs[key] = Proc(key[0], key[1])
        feed(proc, ln)
        if ln.repeated > 1 and not ln.glued:
            pool.append((ln, ln.repeated - 1))
    return procs, ray_ranks(text), pool


def host_key(p: Proc) -> str:
    if p.host:
        return p.host
    if p.ips:
        return sorted(p.ips)[0]
    return f"pid{p.pid}"


def plugin_evidence(p: Proc) -> bool:
    return p.plugin_missing or p.ofi_seen or bool(p.plugin_loaded) or bool(p.ofi_failed) or bool(p.net_init_failed)


def share_plugin_evidence(procs: dict[Key, Proc]) -> None:
    """Give a process whose plugin lines are missing (Ray folded them into another worker's
    ``[repeated Nx across cluster]`` line) the plugin evidence of a process on the same host."""
    donors = [p for p in procs.values() if plugin_evidence(p)]
    for p in procs.values():
        if plugin_evidence(p) or not p.nlines:
            continue
        same = [d for d in donors if host_key(d) == host_key(p)]
        if not same:
            continue
        d = max(same, key=lambda d: d.repeated)
        p.plugin_missing, p.ofi_seen, p.plugin_loaded = d.plugin_missing, d.ofi_seen, d.plugin_loaded
        p.ofi_failed, p.net_init_failed = list(d.ofi_failed), list(d.net_init_failed)
        p.provider = p.provider or d.provider
        p.fabric, p.nics = p.fabric or d.fabric, p.nics or d.nics
        p.ofi_version = p.ofi_version or d.ofi_version
        p.libfabric_version = p.libfabric_version or d.libfabric_version
        p.borrowed = d.pid


def share_topology(procs: dict[Key, Proc]) -> None:
    """A process whose topology lines (graph type, channel counts) are missing, Ray having folded
    them into another worker's, takes those of a process on the same host: one host, one topology."""
    donors = [p for p in procs.values() if p.graph_intra or p.coll_channels]
    for p in procs.values():
        if p.graph_intra or p.coll_channels:
            continue
        d = next((d for d in donors if host_key(d) == host_key(p)), None)
        if d is not None:
            p.graph_intra, p.coll_channels, p.nvls_channels = set(d.graph_intra), d.coll_channels, d.nvls_channels


def short_via(ln: Link) -> str:
    """How a verdict names a link's transport: ``NET/<net>[/GDRDMA]``, ``P2P/<kind>``, ``SHM``."""
    parts = ln.via.split("/")
    if ln.kind == "NET":
        return f"NET/{ln.net}" + ("/GDRDMA" if ln.gdr else "")
    if ln.kind == "P2P":
        return "/".join(parts[:2])
    if ln.kind == "SHM":
        return "SHM" if "shared memory" in ln.via else ln.via
    return ln.via


def p2p_link(p: Proc) -> str | None:
    """What carries a process's peer-to-peer links: ``NVLink``, ``PCIe``, or None when its log does not tell."""
    if "NVL" in p.graph_intra or (p.nvls_channels or 0) > 0:
        return "NVLink"
    if p.graph_intra and p.graph_intra <= {"PIX", "PXB", "PHB", "SYS", "PCI", "NODE"}:
        return "PCIe"
    # NCCL opens many channels only when the GPU-GPU bandwidth is NVLink-class
    # (24 on H100/H200 NV18); PCIe topologies get 2-4.
    if (p.coll_channels or 0) >= 8:
        return "NVLink"
    return None

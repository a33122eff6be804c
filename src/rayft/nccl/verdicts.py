"""Which transport NCCL really used, per rank, read from NCCL_DEBUG=INFO output.

NCCL prints what it *could* use at init ("Using network Socket" even on one host, where the
network is never touched) and what it *did* connect when channels are set up:

    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
    Channel 00/0 : 7[7] -> 8[0] [send] via NET/Libfabric/0/GDRDMA

:mod:`rayft.nccl.processes` gathers both by process (hostname and pid from NCCL's
``host:pid:tid [dev]`` prefix, or Ray's ``(RayTrainWorker pid=N, ip=...)`` prefix); this module
turns them into one :class:`RankVerdict` per rank: the inter-node transport (EFA through aws-ofi-nccl, another
libfabric provider, InfiniBand, Socket), the intra-node transport (P2P, SHM, or the network),
GPUDirect RDMA, the interface, and the likely causes of a fallback
(:func:`rayft.nccl.doctor.check` compares them with what a run expected).

One text is one job: ranks are told apart by their number, and a P2P/SHM link logged by the
sender is credited to the receiving rank by number. When a text holds more than one job (two
runs' logs concatenated, a restarted run), the same rank shows up in several processes; the
doctor then splits the processes by NCCL's ``commId`` where the log has it, never credits a
link to an ambiguous rank, and says so in every verdict's ``mixed``. Ranks whose lines Ray's log
deduplication folded into other workers' are credited with what the folded copies say, where they
agree (see the section "Ray's folded lines" below).

The verdict's types are :mod:`rayft.nccl.verdict_types`, its causes :mod:`rayft.nccl.causes`.
Pure functions over text: no file or process I/O.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace

from rayft.nccl.causes import causes_of
from rayft.nccl.lines import NcclLine, RayRanks
from rayft.nccl.processes import (
    ASSIGNED_NET,
    CHANNEL,
    ENV_SET,
    NET_INIT_FAILED,
    OFI_FAILED,
    OFI_PROVIDER,
    PLUGIN_LOADED,
    PLUGIN_MISSING,
    USING_NETWORK,
    Comm,
    Key,
    Link,
    Pool,
    Proc,
    classify_via,
    collect,
    feed,
    host_key,
    p2p_link,
    plugin_evidence,
    share_plugin_evidence,
    share_topology,
    short_via,
)
from rayft.nccl.verdict_types import (
    Cause,
    InterNode,
    IntraNode,
    RankVerdict,
    label_ranks,
)

__all__ = [
    "Cause",
    "InterNode",
    "IntraNode",
    "Link",
    "RankVerdict",
    "label_ranks",
    "mixed_jobs",
    "verdicts_from_text",
]


def _net_class(name: str, provider: str | None) -> InterNode:
    n = name.lower()
    if n.startswith("socket"):
        return InterNode.SOCKET
    if n.startswith("ib"):
        return InterNode.IB
    if "libfabric" in n or "ofi" in n:
        return InterNode.EFA if provider == "efa" else InterNode.LIBFABRIC
    return InterNode.UNKNOWN


_INTER_WORST = [InterNode.SOCKET, InterNode.LIBFABRIC, InterNode.IB, InterNode.EFA]
_INTRA_WORST = [IntraNode.NET, IntraNode.SHM, IntraNode.P2P, IntraNode.NVLS]


def verdicts_from_text(text: str) -> list[RankVerdict]:
    """One :class:`RankVerdict` per rank found in NCCL_DEBUG=INFO ``text`` (sorted by rank).

    ``text`` is one job's output. Ranks of the job (known from ``nRanks``) that left no NCCL line
    get a verdict with ``evidence == "none"``, or ``"folded"`` where Ray's log deduplication folded
    their lines into other workers' and the folded lines tell their transport (see
    :func:`_unseen_verdicts`). Returns ``[]`` when the text holds no NCCL line at all.

    When the same rank number belongs to several processes (the text holds more than one job), the
    processes are split into jobs by NCCL's ``commId`` where it was logged (verdicts then come job
    by job, each with ``job`` set), links are never credited to a rank that stays ambiguous, and
    every verdict's ``mixed`` says what clashed; :func:`check` reports it as a problem.
    """
    procs, ray, pool = collect(text)
    if not procs:
        return []
    clashes = _rank_clashes(procs)
    if not clashes:
        return _job_verdicts(procs, ray, pool)

    groups = _split_by_comm_id(procs)
    verdicts: list[RankVerdict] = []
    unresolved: dict[int, list[Proc]] = {}
    for g in groups:
        left = _rank_clashes(g)
        unresolved.update(left)
        verdicts.extend(_job_verdicts(g, ray, [], ambiguous=set(left)))  # folded lines: of which job?
    said = "; ".join(f"rank {r} is " + " and ".join(f"{p.host or '?'} pid {p.pid}" for p in ps) for r, ps in sorted(clashes.items())[:2])
    if len(clashes) > 2:
        said += f"; and so on for ranks {label_ranks(sorted(clashes)[2:])}"
    msg = f"this log holds more than one NCCL job ({said}): a concatenated log or a restarted run? "
    if unresolved:
        one = len(unresolved) == 1
        msg += (
            f"Links logged by other ranks were not credited to {'rank' if one else 'ranks'} "
            f"{label_ranks(list(unresolved))}, whose number names more than one process. "
        )
    else:
        msg += f"Verdicts are given job by job ({len(groups)} jobs, told apart by NCCL's commId). "
    msg += "Pass each run's log as its own file."
    for v in verdicts:
        v.mixed = msg
    return verdicts


def mixed_jobs(verdicts: list[RankVerdict]) -> str | None:
    """The warning set by :func:`verdicts_from_text` when its text held more than one job, else None."""
    return next((v.mixed for v in verdicts if v.mixed), None)


def _world_and_ranks(procs: dict[Key, Proc], ray: RayRanks) -> tuple[int | None, dict[Key, int | None]]:
    """The job's world size and each process's rank in it (from the world communicator, else
    from Ray Train's rank lines)."""
    world = max((c.nranks for p in procs.values() for c in p.comms.values()), default=None) or ray.world
    rank_of: dict[Key, int | None] = {}
    for key, p in procs.items():
        c = p.primary()
        if c and (world is None or c.nranks == world):
            rank_of[key] = c.rank
        else:
            by_ip = {ray.by_ip_pid[(ip, p.pid)] for ip in p.ips if (ip, p.pid) in ray.by_ip_pid}
            rank_of[key] = by_ip.pop() if len(by_ip) == 1 else ray.by_pid.get(p.pid)
    return world, rank_of


def _rank_clashes(procs: dict[Key, Proc]) -> dict[int, list[Proc]]:
    """Rank numbers claimed by more than one process: the text holds more than one job.

    A process claims the rank of its largest communicator. Two processes with the same rank in
    equal-sized communicators smaller than the largest one may be sibling sub-groups of one job,
    so they do not count; any other repeat does (two jobs of one size, or of different sizes).
    Ray Train's rank lines are not used (they key by pid alone, which repeats across pods), and
    two keys that may be one process (same pid, one hostname a fragment of the other) are one.
    """
    world = max((c.nranks for p in procs.values() for c in p.comms.values()), default=None)
    claims: dict[int, list[tuple[Proc, int]]] = defaultdict(list)
    for p in procs.values():
        c = p.primary()
        if c is None:
            continue
        same = next((q for q, _ in claims[c.rank] if _maybe_same_process(p, q)), None)
        if same is None:
            claims[c.rank].append((p, c.nranks))
    out: dict[int, list[Proc]] = {}
    for r, ps in claims.items():
        sizes = {n for _, n in ps}
        if len(ps) > 1 and not (len(sizes) == 1 and world is not None and next(iter(sizes)) < world):
            out[r] = [p for p, _ in ps]
    return out


def _maybe_same_process(p: Proc, q: Proc) -> bool:
    if p.pid != q.pid:
        return False
    if not p.host or not q.host:
        return True
    return p.host.endswith(q.host) or q.host.endswith(p.host)


def _split_by_comm_id(procs: dict[Key, Proc]) -> list[dict[Key, Proc]]:
    """Processes grouped into jobs: two processes are in one job when they share a communicator
    (the same NCCL ``commId``). Processes whose log has no commId form one more group."""
    parent: dict[Key, Key] = {k: k for k in procs}

    def find(k: Key) -> Key:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    owner: dict[str, Key] = {}
    for key, p in procs.items():
        for c in p.comms.values():
            if not c.comm_id:
                continue
            if c.comm_id in owner:
                parent[find(key)] = find(owner[c.comm_id])
            else:
                owner[c.comm_id] = key
    groups: dict[Key | None, dict[Key, Proc]] = {}
    for key, p in procs.items():
        has_id = any(c.comm_id for c in p.comms.values())
        groups.setdefault(find(key) if has_id else None, {})[key] = p
    return list(groups.values())


def _job_verdicts(
    procs: dict[Key, Proc],
    ray: RayRanks,
    pool: Pool,
    ambiguous: frozenset[int] | set[int] = frozenset(),
) -> list[RankVerdict]:
    """Verdicts for the processes of one job; ``ambiguous`` ranks get no link credited by number;
    ``pool``: Ray's folded lines, credited to ranks that lack lines of their own."""
    world, rank_of = _world_and_ranks(procs, ray)

    # rank -> host, from the world communicator (or Ray Train's rank lines); a rank that left no
    # line gets the host of a process on its node ip.
    rank_host: dict[int, str] = {}
    for key, p in procs.items():
        r = rank_of[key]
        if r is not None:
            rank_host.setdefault(r, host_key(p))
    ip_host = {ip: host_key(p) for p in procs.values() for ip in p.ips}
    for r, ip in ray.ip.items():
        if world is not None and r < world and r not in rank_host and ip in ip_host:
            rank_host[r] = ip_host[ip]
    hosts = set(rank_host.values()) | {host_key(p) for p in procs.values()}
    complete = world is not None and len(rank_host) == world
    n_hosts = len(hosts) if complete else None
    nnodes_nccl = max((c.nnodes or 0 for p in procs.values() for c in p.comms.values()), default=0) or None

    single_host = n_hosts == 1 or (n_hosts is None and nnodes_nccl == 1)
    share_plugin_evidence(procs)
    share_topology(procs)
    facts = _pool_facts(pool)
    for p in procs.values():
        _credit_seen(p, facts, multi_node=not single_host)
    links = {key: _resolve_links(p, world, rank_host, single_host) for key, p in procs.items()}
    # NCCL logs a P2P/SHM connection on the sending side only: credit it to the receiver too,
    # found by its rank number (so only where that number names one process).
    incoming: dict[int, list[Link]] = defaultdict(list)
    for key, p in procs.items():
        r = rank_of[key]
        for ln, in_world in links[key]:
            if r is not None and in_world and ln.kind in ("P2P", "SHM", "NVLS") and ln.peer not in ambiguous:
                incoming[ln.peer].append(replace(ln, peer=r))
    # A process with local peers and no intra-node connection in the log (Ray folded its channel
    # lines and those of the peers that send to it): the folded channel lines, where they agree.
    on_host = defaultdict(int)
    for p in procs.values():
        on_host[host_key(p)] += 1
    for key, p in procs.items():
        r = rank_of[key]
        c = p.primary()
        local_peers = (c.local_ranks or 0) > 1 if c and c.local_ranks else (single_host and (world or 0) > 1) or on_host[host_key(p)] > 1
        has_intra = any(ln.same_host for ln, _ in links[key]) or (r is not None and bool(incoming.get(r)))
        if local_peers and not has_intra and (credit := _channel_credit(facts, 1)):
            links[key].append((credit[0], False))
            p.credited.append(credit[1])
    verdicts: list[RankVerdict] = []
    for key, p in procs.items():
        r = rank_of[key]
        own = [ln for ln, _ in links[key]]
        v = _verdict(p, r, world, own, incoming.get(r, []) if r is not None else [], n_hosts, nnodes_nccl, single_host)
        c = p.primary()
        v.job = c.comm_id if c else None
        verdicts.append(v)
    seen = {v.rank for v in verdicts if v.rank is not None}
    missing = [r for r in range(world or 0) if r not in seen]
    if missing:
        job = _Job(world, procs, ray, rank_host, n_hosts, nnodes_nccl, single_host)
        verdicts += _unseen_verdicts(missing, job, facts, incoming)
        if facts:
            for v in verdicts:
                if v.rank is None:
                    v.notes.insert(
                        0,
                        f"its rank is not in the log (Ray folded its 'comm ... rank R' lines): it is one of ranks {label_ranks(missing)}",
                    )
    verdicts.sort(key=lambda v: (v.rank is None, v.rank if v.rank is not None else 0, v.host or "", v.pid or 0))
    return verdicts


# --------------------------------------------------------------------------------------------
# Ray's folded lines: crediting ranks whose own lines were folded into other workers'.
#
# Ray keys a line by its words without digits (lines.ray_key) and folds the occurrences of one key
# from several workers into the last of them, "[repeated Nx across cluster]". A folded line says
# who emitted the printed occurrence only; its N-1 copies came from workers the log does not name.
# What the copies say is known exactly where the fact sits in words without digits ("Using network
# Socket", "Selected provider is efa", a channel "via SHM/direct/direct"), and by NCCL's wording
# where it does not: a channel line without [send]/[receive] is a P2P connection (NCCL tags every
# network connection). A fact is credited to the ranks without a line of their own when every copy
# in the log says the same and there are at least as many copies as such ranks.


@dataclass
class _Job:
    """What is known of one job as a whole, for crediting its unseen ranks."""

    world: int | None
    procs: dict[Key, Proc]
    ray: RayRanks
    rank_host: dict[int, str]
    n_hosts: int | None
    nnodes_nccl: int | None
    single_host: bool


_DIGIT = re.compile(r"\d")
_Facts = dict[str, dict[str | None, tuple[NcclLine, int]]]  # family -> value -> (a printed line, copies)


def _pool_family(ln: NcclLine) -> tuple[str, str | None] | None:
    """The fact a folded line's copies give (family, value); value None: the copies may differ."""
    msg = ln.msg
    if m := CHANNEL.search(msg):
        kind = classify_via(m["via"])[0]
        return ("net-channel", None) if m["dir"] else ("channel", kind)
    for family, rx, group in (
        ("network", USING_NETWORK, "net"),
        ("network", ASSIGNED_NET, "net"),
        ("provider", OFI_PROVIDER, "prov"),
        ("plugin", PLUGIN_LOADED, "name"),
    ):
        if m := rx.search(msg):
            return family, None if _DIGIT.search(m[group]) else m[group].split(";")[0]
    if PLUGIN_MISSING.search(msg):
        return "plugin", "missing"
    if OFI_FAILED.search(msg) or NET_INIT_FAILED.search(msg):
        return "ofi-failed", ln.key
    if m := ENV_SET.search(msg):
        same = not _DIGIT.search(m["var"] + m["val"])
        return f"env {m['var'] if same else '?'}", m["val"] if same else None
    return None


def _pool_facts(pool: Pool) -> _Facts:
    facts: _Facts = defaultdict(dict)
    for ln, copies in pool:
        fv = _pool_family(ln)
        if fv is None:
            continue
        family, value = fv
        line, n = facts[family].get(value, (ln, 0))
        facts[family][value] = (line, n + copies)
    return facts


def _one_value(facts: _Facts, family: str, need: int) -> tuple[NcclLine, int] | None:
    """The family's one value, when every copy agrees and there are ``need`` copies or more."""
    values = facts.get(family, {})
    if len(values) != 1 or None in values:
        return None
    line, copies = next(iter(values.values()))
    return (line, copies) if copies >= need else None


def _said(facts: _Facts, family: str) -> str:
    """``'Using network AWS Libfabric' (3 copies) and 'Using network Socket' (3 copies)``."""
    parts = [f"'{ln.msg}' ({n} {'copy' if n == 1 else 'copies'})" for ln, n in facts.get(family, {}).values()]
    return " and ".join(parts)


def _feed_credit(p: Proc, ln: NcclLine) -> None:
    feed(p, replace(ln, host=p.host, pid=p.pid, tid=None, repeated=1, ray_ip=None))
    p.nlines -= 1


def _channel_credit(facts: _Facts, need: int) -> tuple[Link, str] | None:
    """A same-host link standing for Ray's folded channel lines (no peer: -1), when they all are of
    one kind (P2P, SHM, NVLS) and number ``need`` or more; with the line it stands for."""
    got = _one_value(facts, "channel", need)
    if got is None:
        return None
    m = CHANNEL.search(got[0].msg)
    kind, net, gdr = classify_via(m["via"])
    return Link(-1, m["via"].strip(), kind, net, gdr, same_host=True), got[0].msg


def _credit_seen(p: Proc, facts: _Facts, multi_node: bool) -> None:
    """A process with lines of its own that lacks its network plugin's or chosen network's lines:
    take them from the folded ones where every copy agrees (and say so, or say why not)."""
    if not facts or not p.nlines:
        return
    taken: list[str] = []
    if not plugin_evidence(p):
        for family in ("plugin", "ofi-failed", "provider"):
            if got := _one_value(facts, family, 1):
                _feed_credit(p, got[0])
                taken.append(got[0].msg)
    if multi_node and not p.using_network and not any(ln.kind == "NET" for _, ln in p.links):
        if got := _one_value(facts, "network", 1):
            _feed_credit(p, got[0])
            taken.append(got[0].msg)
        elif len(facts.get("network", {})) > 1:
            p.unknown_why = (
                f"Ray folded {_said(facts, 'network')} of several workers, so which rank used which network cannot be told; "
                "set RAY_DEDUP_LOGS=0 to keep every worker's lines"
            )
    if taken:
        p.credited.extend(taken)


def _unseen_verdicts(missing: list[int], job: _Job, facts: _Facts, incoming: dict[int, list[Link]]) -> list[RankVerdict]:
    """Verdicts of the job's ranks that left no NCCL line of their own (known from ``nRanks`` or
    Ray Train's rank list): credited from Ray's folded lines where they tell (see above), else
    ``evidence == "none"``."""
    by_rank = {r: (ip, pid) for (ip, pid), r in job.ray.by_ip_pid.items()}
    local_counts = {c.local_ranks for p in job.procs.values() if (c := p.primary()) and c.nranks == job.world and c.local_ranks}
    out: list[RankVerdict] = []
    folded = sum(n for values in facts.values() for _, n in values.values())
    for r in missing:
        ip, pid = by_rank.get(r, (job.ray.ip.get(r), None))
        host = job.rank_host.get(r)
        if not facts:  # Ray folded nothing here: the rank truly left no line (it died, or the log was cut)
            note = "no NCCL line from this rank in the log (Ray's log deduplication folds identical lines: set RAY_DEDUP_LOGS=0)"
            out.append(RankVerdict(rank=r, world_size=job.world, host=host, pid=pid, ip=ip, evidence="none", notes=[note]))
            continue
        p = Proc(host, pid if pid is not None else -1)
        if ip:
            p.ips.add(ip)
        credited: list[str] = []
        for family in ("plugin", "ofi-failed", "provider", "network", *(f for f in facts if f.startswith("env "))):
            if got := _one_value(facts, family, len(missing)):
                _feed_credit(p, got[0])
                credited.append(f"{got[0].msg!r} ({got[1]} copies)")
        # its place in the world communicator, which every rank shares
        if job.single_host:
            local = job.world
        elif host is not None:
            local = sum(1 for h in job.rank_host.values() if h == host) or None
        else:
            local = next(iter(local_counts)) if len(local_counts) == 1 else None
        p.comms["folded"] = Comm("folded", r, job.world or 0, job.nnodes_nccl, local)
        own: list[Link] = []
        kinds = {k for k in facts.get("channel", {}) if k is not None}
        if (local or 0) > 1 and (credit := _channel_credit(facts, len(missing))):
            own.append(credit[0])
            n = _one_value(facts, "channel", 1)[1]
            credited.append(f"{n} folded channel lines 'via {short_via(own[-1])}'")
        donors = [q for q in job.procs.values() if q.graph_intra or q.coll_channels]
        if host is not None or job.single_host:
            donors = [q for q in donors if job.single_host or host_key(q) == host]
        elif len({p2p_link(q) for q in donors}) > 1:  # host unknown: only where every host agrees
            donors = []
        donor = donors[0] if donors else None
        if donor is not None:  # the host's topology (NVLink or PCIe), for the P2P link
            p.graph_intra, p.coll_channels, p.nvls_channels = set(donor.graph_intra), donor.coll_channels, donor.nvls_channels
        v = _verdict(p, r, job.world, own, incoming.get(r, []), job.n_hosts, job.nnodes_nccl, job.single_host)
        v.host, v.pid, v.ip = host, pid, ip
        v.notes = [n for n in v.notes if not n.startswith(("this rank logged no inter-node channel", "network plugin lines missing"))]
        why: list[str] = []
        if v.inter_node == InterNode.UNKNOWN and len(facts.get("network", {})) > 1:
            why.append(f"Ray folded {_said(facts, 'network')} of several workers, so which rank used which network cannot be told")
        if v.intra_node == IntraNode.UNKNOWN and len(kinds) > 1:
            why.append(f"Ray folded channel lines of several kinds ({', '.join(sorted(kinds))}) of several workers together")
        if why:
            v.unknown_why = "; ".join(why) + "; set RAY_DEDUP_LOGS=0 to keep every worker's lines"
        known = v.inter_node != InterNode.UNKNOWN or v.intra_node != IntraNode.UNKNOWN
        if known and (credited or incoming.get(r) or job.single_host):
            v.evidence = "folded"
            v.notes.insert(
                0,
                "no NCCL line of its own: Ray's log deduplication folded its lines into other workers' "
                "('[repeated Nx across cluster]'); credited from "
                + (", ".join(credited) if credited else "the job's communicator")
                + "; set RAY_DEDUP_LOGS=0 for per-rank certainty",
            )
        else:
            v = RankVerdict(rank=r, world_size=job.world, host=host, pid=pid, ip=ip, evidence="none", unknown_why=v.unknown_why)
            v.notes = [
                f"no NCCL line from this rank in the log: Ray's log deduplication folded {folded} line{'s' if folded != 1 else ''} of several workers, "
                "none of which tells this rank's transport (set RAY_DEDUP_LOGS=0)"
            ]
        out.append(v)
    return out


def _resolve_links(p: Proc, world: int | None, rank_host: dict[int, str], single_host: bool) -> list[tuple[Link, bool]]:
    """The process's links with ``same_host`` filled in, each with whether its communicator is
    the world (so that its rank numbers are world ranks)."""
    me = host_key(p)
    out: list[tuple[Link, bool]] = []
    for ptr, ln in p.links:
        comm = p.comms.get(ptr) if ptr else p.primary()
        in_world = comm is not None and world is not None and comm.nranks == world
        if ln.kind in ("P2P", "SHM", "NVLS"):
            same = True
        elif single_host or (comm is not None and comm.nnodes == 1):
            same = True
        elif in_world and ln.peer in rank_host:
            same = rank_host[ln.peer] == me
        else:
            same = False
        out.append((replace(ln, same_host=same), in_world))
    return out


def _verdict(
    p: Proc,
    rank: int | None,
    world: int | None,
    links: list[Link],
    incoming: list[Link],
    n_hosts: int | None,
    nnodes_nccl: int | None,
    single_host: bool,
) -> RankVerdict:
    c = p.primary()
    v = RankVerdict(
        rank=rank,
        world_size=world,
        host=p.host,
        pid=p.pid,
        ip=sorted(p.ips)[0] if p.ips else (p.bootstrap[1] if p.bootstrap else None),
        local_rank=c.local_rank if c else None,
        cuda_dev=p.cuda_dev,
        bus_id=p.bus_id,
        n_nodes=n_hosts or nnodes_nccl,
        provider=p.provider,
        nccl_version=p.version,
        bootstrap=f"{p.bootstrap[0]} {p.bootstrap[1]}" if p.bootstrap else None,
    )
    inter = [ln for ln in links if ln.kind == "NET" and not ln.same_host]
    intra = [ln for ln in links if ln.same_host] + incoming
    # links credited from Ray's folded lines have no peer (-1): the rank logged none of its own
    v.evidence = "channels" if any(ln.peer >= 0 for ln in links) else ("folded" if links else "init")

    # Inter-node.
    if inter:
        classes = {_net_class(ln.net or "", p.provider) for ln in inter}
        v.inter_node = next((k for k in _INTER_WORST if k in classes), InterNode.UNKNOWN)
        nets = sorted({f"NET/{ln.net}" for ln in inter})
        if len(classes) > 1:
            v.notes.append("inter-node links over several transports: " + ", ".join(nets))
    elif single_host:
        v.inter_node = InterNode.NONE
    elif p.using_network and ((n_hosts or 0) > 1 or (n_hosts is None and (nnodes_nccl or 0) > 1)):
        v.inter_node = _net_class(p.using_network[-1], p.provider)
        if v.evidence == "channels":
            v.notes.append(f"this rank logged no inter-node channel; inter-node transport taken from 'Using network {p.using_network[-1]}'")
    if v.inter_node in (InterNode.EFA, InterNode.LIBFABRIC):
        bits = [f"aws-ofi-nccl {p.ofi_version}" if p.ofi_version else "aws-ofi-nccl", f"provider {p.provider or '?'}"]
        if p.fabric and p.fabric != p.provider:
            bits.append(f"fabric {p.fabric}")
        if p.nics:
            bits.append(f"{p.nics} NICs")
        if p.libfabric_version:
            bits.append(f"libfabric {p.libfabric_version}")
        v.inter_detail = ", ".join(bits)
    elif inter:
        v.inter_detail = ", ".join(sorted({f"NET/{ln.net}" for ln in inter}))

    # Intra-node.
    if intra:
        order = {"NET": IntraNode.NET, "SHM": IntraNode.SHM, "P2P": IntraNode.P2P, "NVLS": IntraNode.NVLS}
        found = [order[k] for k in {ln.kind for ln in intra} if k in order]
        v.intra_node = next((k for k in _INTRA_WORST if k in found), IntraNode.UNKNOWN)
        vias = sorted({short_via(ln) for ln in intra if ln.kind != "other"})
        v.intra_detail = ", ".join(vias)
        if IntraNode.P2P in found:
            v.p2p_link = p2p_link(p)
            if v.p2p_link and v.intra_node == IntraNode.P2P:
                v.intra_detail += f" over {v.p2p_link}"
    elif c is not None and c.local_ranks == 1 and not single_host:
        v.intra_node = IntraNode.NONE
    elif world == 1:
        v.intra_node = IntraNode.NONE

    # GPUDirect RDMA, interface.
    net_links = inter or [ln for ln in links if ln.kind == "NET"]
    if net_links:
        v.gdr = any(ln.gdr for ln in net_links)
    elif "Enabled" in p.gdr_hca and v.inter_node in (InterNode.IB, InterNode.EFA):
        v.gdr = True
    uses_socket = v.inter_node == InterNode.SOCKET or any(ln.net and ln.net.lower().startswith("socket") for ln in links)
    if uses_socket and p.socket_ifs:
        v.interface = ", ".join(f"{n} {a}" for n, a in p.socket_ifs)
    elif v.inter_node == InterNode.IB and p.ib_devs:
        v.interface = ", ".join(p.ib_devs)
    elif v.inter_node in (InterNode.EFA, InterNode.LIBFABRIC):
        v.interface = f"{p.provider or '?'}" + (f" x{p.nics}" if p.nics else "")

    if single_host and c is not None and (c.nnodes or 0) > 1:
        v.notes.append(f"NCCL counted {c.nnodes} nodes (P2P/SHM unusable) but all ranks are on one host")
    v.causes = causes_of(p, v)
    v.nics, v.platform = p.nics, p.platform
    if v.inter_node == InterNode.UNKNOWN:
        v.unknown_why = p.unknown_why
    v.socket_ifs = [f"{n} {a}" for n, a in p.socket_ifs]
    v.shm_failure = p.shm_failed[0] if p.shm_failed else None
    if p.credited:
        said = "; ".join(repr(m) for m in p.credited)
        v.notes.append(
            f"lines missing for this rank taken from Ray's folded lines, where every copy agrees ({said}); "
            "set RAY_DEDUP_LOGS=0 for per-rank certainty"
        )
    if p.borrowed is not None:
        v.notes.append(f"network plugin lines missing for this rank; used those of pid {p.borrowed} on the same host")
    if p.repeated:
        v.notes.append(
            f"Ray folded {p.repeated} similar line{'s' if p.repeated != 1 else ''} of other workers into this one's "
            "('[repeated Nx across cluster]'); set RAY_DEDUP_LOGS=0 for per-rank certainty"
        )
    return v

"""The EKS cluster lifecycle: preflight, up and status; each step of up probes state before it acts.

``up`` runs these steps; each asks AWS (boto3) what exists before doing anything, so running it
twice is a no-op and running it after a failure resumes:

1. **preflight** — eksctl, helm, kubectl on PATH; AWS credentials valid (STS GetCallerIdentity);
   the instance type exists, has GPUs and, with ``cluster.efa``, supports EFA (DescribeInstanceTypes).
   Nothing is created before all of these pass.
2. **capacity** — AZs offering the GPU type with vCPU quota headroom (only when something must be
   created); see :mod:`rayft.cluster.capacity`.
3. **cluster** — EKS DescribeCluster and CloudFormation ``eksctl-<name>-cluster``:
   ACTIVE → reuse; CREATING/UPDATING → wait; DELETING → wait, then create; FAILED or a stack in
   ROLLBACK_COMPLETE → explain and clean up on confirmation; absent → ``eksctl create cluster``
   (VPC, OIDC, core add-ons and the system node group of m7i.xlarge).
4. **kubeconfig** — ``eksctl utils write-kubeconfig``.
5. **system node group**, **placement group** (optional), **GPU node group** — DescribeNodegroup
   and the ``eksctl-<name>-nodegroup-<ng>`` stack, same transitions. The GPU group is pinned to one
   AZ and the cluster's private subnet there; InsufficientInstanceCapacity in that AZ cleans up the
   failed stack and moves to the next candidate AZ.
6. **add-ons** — :mod:`rayft.cluster.addons`, then wait until the device plugins are ready.

``down`` (:mod:`rayft.cluster.eks_down`) removes the same things in reverse order and reports
billable leftovers by tag. It only deletes a cluster tagged ``rayft.io/cluster=<name>`` (what ``up``
creates); a cluster ``up`` merely reused is refused unless ``allow_untagged`` (``--delete-untagged``)
says otherwise. ``plan`` (:mod:`rayft.cluster.eks_plan`) prints every AWS call, command and rendered
file without touching anything. The probes of what exists are :mod:`rayft.cluster.eks_probes`, the
names, eksctl files and command lines :mod:`rayft.cluster.eks_render`.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from rayft.cluster import addons
from rayft.cluster.capacity import CapacityReport, ClientFactory, find_capacity
from rayft.cluster.eks_probes import (
    FAILED_STACK_STATES,
    NOT_FOUND,
    STACK_BUSY_STATES,
    cluster_private_subnets,
    cluster_status,
    error_code,
    nodegroup_info,
    nodegroup_status,
    stack_failure_reasons,
    stack_status,
)
from rayft.cluster.eks_render import (
    cluster_stack,
    cluster_tags,
    create_cluster_argv,
    create_nodegroup_argv,
    delete_cluster_argv,
    delete_nodegroup_argv,
    nodegroup_stack,
    placement_group_name,
    render_cluster_config,
    render_gpu_nodegroup_config,
    to_yaml,
    write_kubeconfig_argv,
)
from rayft.cluster.instances import Shape, UnknownInstanceTypeError, describe_shape, get_instance
from rayft.cluster.runner import Runner, missing_tools
from rayft.cluster.spec import ClusterConfig

INSTALL_HINTS = {
    "eksctl": "https://eksctl.io/installation/",
    "helm": "https://helm.sh/docs/intro/install/",
    "kubectl": "https://kubernetes.io/docs/tasks/tools/",
}
CAPACITY_ERRORS = ("InsufficientInstanceCapacity", "insufficient capacity", "InsufficientCapacity")


class LifecycleError(RuntimeError):
    """A step that cannot go on; the message says why and how to recover by hand."""


# --------------------------------------------------------------------------- the context


@dataclass
class Context:
    """Everything a lifecycle step needs; tests swap the runner, clients, confirm and sleep."""

    cfg: ClusterConfig
    runner: Runner
    clients: ClientFactory
    say: Callable[[str], None] = print
    confirm: Callable[[str], bool] = lambda q: False
    sleep: Callable[[float], None] = time.sleep
    workdir: Path = Path(".rayft")
    poll_s: float = 20.0

    def client(self, service: str) -> Any:
        return self.clients(service, self.cfg.aws.region)

    @property
    def max_polls(self) -> int:
        return max(1, int(self.cfg.aws.wait_timeout_minutes * 60 / max(self.poll_s, 1e-3)))

    def wait(self, what: str, probe: Callable[[], str], until: set[str], fail: set[str] = frozenset()) -> str:
        """Poll ``probe`` until it reports a state in ``until`` (or ``fail``); raise on time-out."""
        state = probe()
        for _ in range(self.max_polls):
            if state in until or state in fail:
                return state
            self.say(f"{what} is {state}; waiting")
            self.sleep(self.poll_s)
            state = probe()
        if state in until or state in fail:
            return state
        raise LifecycleError(
            f"{what} still {state} after {self.cfg.aws.wait_timeout_minutes} min; re-run the same command later, it resumes"
        )


@dataclass
class UpResult:
    """What ``up`` created and reused, the GPU AZ it used and the AZs it skipped (with why)."""

    created: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    gpu_az: str | None = None
    skipped_azs: dict[str, str] = field(default_factory=dict)
    addons: addons.AddonOutcome | None = None

    @property
    def changed(self) -> bool:
        return bool(self.created) or bool(self.addons and self.addons.installed)


# --------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Preflight:
    """What preflight learned: the caller's ARN and (when asked) the GPU instance type's shape."""

    arn: str
    shape: Shape | None = None


def _instance_problems(ctx: Context) -> tuple[Shape | None, list[str]]:
    """The GPU instance type as EC2 describes it, and why it cannot be used (none: it can)."""
    cfg = ctx.cfg
    itype, region = cfg.instance_type, cfg.aws.region
    try:
        shape = describe_shape(ctx.client("ec2"), itype)
    except UnknownInstanceTypeError as e:
        return None, [f"cluster.instance_type: {e}"]
    except ClientError as e:
        if error_code(e) in ("InvalidInstanceType", "InvalidParameterValue"):
            return None, [f"cluster.instance_type: EC2 does not know {itype!r} in {region} ({error_code(e)})"]
        return None, [f"could not describe instance type {itype} in {region} ({error_code(e)}: {e})"]
    except BotoCoreError as e:
        return None, [f"could not describe instance type {itype} in {region} ({type(e).__name__}: {e})"]
    problems = []
    if shape.gpus < 1:
        problems.append(f"cluster.instance_type: {itype} has no GPUs; pick a GPU instance type")
    if cfg.efa and not shape.efa_supported:
        problems.append(
            f"cluster.efa: {itype} does not support EFA; set cluster.efa: false or pick a type with EFA (e.g. g6.12xlarge, p5.48xlarge)"
        )
    return shape, problems


def preflight(ctx: Context, tools: tuple[str, ...] = ("eksctl", "helm", "kubectl"), *, instance: bool = False) -> Preflight:
    """Fail before anything starts when a tool, the credentials or (``instance``) the instance type is wrong.

    Checks: ``tools`` on PATH; STS GetCallerIdentity; with ``instance`` (what ``up`` asks for) and
    usable credentials, EC2 DescribeInstanceTypes: the type exists in the region, has GPUs and,
    with ``cluster.efa``, supports EFA. Every problem found is reported at once.

    Raises:
        LifecycleError: one line per problem, each with how to fix it. Nothing was created.
    """
    problems = []
    missing = missing_tools(tools)
    if missing:
        problems.append(
            "missing tools: " + ", ".join(missing) + " (install: " + "; ".join(f"{t}: {INSTALL_HINTS.get(t, '?')}" for t in missing) + ")"
        )
    arn = ""
    credentials = True
    try:
        arn = ctx.client("sts").get_caller_identity()["Arn"]
    except (NoCredentialsError, ClientError, BotoCoreError) as e:
        credentials = False
        problems.append(
            f"AWS credentials not usable ({type(e).__name__}: {e}); set AWS_PROFILE or AWS_ACCESS_KEY_ID/"
            "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), then re-run"
        )
    shape = None
    if instance and credentials:
        shape, found = _instance_problems(ctx)
        problems += found
    if problems:
        raise LifecycleError("cannot start:\n  " + "\n  ".join(problems))
    return Preflight(arn, shape)


# --------------------------------------------------------------------------- steps


def clear_failed_stack(ctx: Context, stack: str, *, ours: bool = False) -> None:
    """A stack left in ROLLBACK_COMPLETE (or another failed state) blocks eksctl; explain, confirm, delete."""
    cfn = ctx.client("cloudformation")
    status = stack_status(cfn, stack)
    if status in STACK_BUSY_STATES:
        status = ctx.wait(
            f"stack {stack}",
            lambda: stack_status(cfn, stack),
            until={NOT_FOUND, "CREATE_COMPLETE", "UPDATE_COMPLETE"} | FAILED_STACK_STATES,
        )
    if status not in FAILED_STACK_STATES:
        return
    reasons = stack_failure_reasons(cfn, stack)
    ctx.say(
        f"CloudFormation stack {stack} is {status}, left by a failed attempt"
        + ("".join(f"\n    {r}" for r in reasons) if reasons else "")
        + "\n  It holds no running resources, but eksctl cannot create a stack with the same name until it is deleted."
    )
    if not ours and not ctx.confirm(f"Delete stack {stack} ({status}) now?"):
        raise LifecycleError(
            f"stack {stack} is {status}; delete it, then re-run:\n"
            f"  aws cloudformation delete-stack --stack-name {stack} --region {ctx.cfg.aws.region}"
        )
    cfn.delete_stack(StackName=stack)
    ctx.wait(f"stack {stack}", lambda: stack_status(cfn, stack), until={NOT_FOUND}, fail={"DELETE_FAILED"})
    if stack_status(cfn, stack) != NOT_FOUND:
        raise LifecycleError(f"stack {stack} could not be deleted (DELETE_FAILED); inspect it in the CloudFormation console")
    ctx.say(f"deleted stack {stack}")


def _write(ctx: Context, name: str, doc: dict[str, Any]) -> Path:
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    path = ctx.workdir / name
    path.write_text(to_yaml(doc), encoding="utf-8")
    return path


def ensure_cluster(ctx: Context, cluster_azs: Callable[[], list[str]], result: UpResult) -> None:
    """Make cluster ``cfg.name`` ACTIVE: reuse, wait (CREATING/UPDATING/DELETING), recreate a FAILED one
    on confirmation, or ``eksctl create cluster`` (with the system node group) when absent.

    ``cluster_azs`` is called only when the cluster must be created (it runs the capacity search).
    Appends ``cluster`` (and the system group) to ``result.created`` or ``result.reused``.

    Raises:
        LifecycleError: FAILED and not confirmed; an unexpected state; eksctl failed; a wait timed out.
    """
    cfg, eks = ctx.cfg, ctx.client("eks")
    what = f"cluster {cfg.name}"
    status = cluster_status(eks, cfg.name)
    if status in ("CREATING", "UPDATING", "PENDING"):
        status = ctx.wait(what, lambda: cluster_status(eks, cfg.name), until={"ACTIVE"}, fail={"FAILED", NOT_FOUND})
    if status == "DELETING":
        status = ctx.wait(what, lambda: cluster_status(eks, cfg.name), until={NOT_FOUND}, fail={"FAILED"})
    if status == "FAILED":
        reasons = stack_failure_reasons(ctx.client("cloudformation"), cluster_stack(cfg))
        ctx.say(f"{what} is FAILED" + "".join(f"\n    {r}" for r in reasons))
        if not ctx.confirm(f"Delete the failed cluster {cfg.name} (eksctl delete cluster) and create it again?"):
            raise LifecycleError(
                f"{what} is FAILED; remove it by hand, then re-run `rayft cluster up`:\n  {shlex.join(delete_cluster_argv(cfg))}"
            )
        ctx.runner.run(delete_cluster_argv(cfg), stream=True)
        status = ctx.wait(what, lambda: cluster_status(eks, cfg.name), until={NOT_FOUND})
    if status == "ACTIVE":
        ctx.say(f"{what}: ACTIVE, reused")
        result.reused.append("cluster")
        return
    if status != NOT_FOUND:
        raise LifecycleError(f"{what} is in state {status}; inspect it in the EKS console before re-running")
    clear_failed_stack(ctx, cluster_stack(cfg))
    path = _write(ctx, "eksctl-cluster.yaml", render_cluster_config(cfg, cluster_azs()))
    ctx.say(f"creating {what} with its system node group (15-20 min)")
    res = ctx.runner.run(create_cluster_argv(path), check=False, stream=True)
    status = cluster_status(eks, cfg.name)
    if not res.ok or status != "ACTIVE":
        raise LifecycleError(
            f"`{shlex.join(create_cluster_argv(path))}` exited {res.returncode}; cluster status {status}. "
            "Re-run `rayft cluster up`: it resumes from what exists."
        )
    result.created.append("cluster")
    result.created.append(f"nodegroup/{cfg.aws.system_nodegroup}")


def _nodegroup_ready_or_cleared(ctx: Context, ng: str, *, ours: bool = False) -> str:
    """Probe a node group and bring it to ACTIVE (reuse) or NOT_FOUND (create); returns which.

    ``ours``: the failed group was made by this very run, so it is removed without asking.
    """
    cfg, eks = ctx.cfg, ctx.client("eks")
    what = f"node group {ng}"
    status = nodegroup_status(eks, cfg.name, ng)
    if status in ("CREATING", "UPDATING"):
        status = ctx.wait(
            what,
            lambda: nodegroup_status(eks, cfg.name, ng),
            until={"ACTIVE"},
            fail={"CREATE_FAILED", "DEGRADED", "DELETE_FAILED", NOT_FOUND},
        )
    if status == "DELETING":
        status = ctx.wait(what, lambda: nodegroup_status(eks, cfg.name, ng), until={NOT_FOUND}, fail={"DELETE_FAILED"})
    if status in ("CREATE_FAILED", "DELETE_FAILED", "DEGRADED"):
        info = nodegroup_info(eks, cfg.name, ng) or {}
        issues = [f"{i.get('code')}: {i.get('message')}" for i in (info.get("health") or {}).get("issues", [])]
        ctx.say(f"{what} is {status}" + "".join(f"\n    {i}" for i in issues))
        if not ours and not ctx.confirm(f"Delete node group {ng} ({status}) and create it again?"):
            raise LifecycleError(f"{what} is {status}; remove it by hand, then re-run:\n  {shlex.join(delete_nodegroup_argv(cfg, ng))}")
        ctx.runner.run(delete_nodegroup_argv(cfg, ng), stream=True)
        status = ctx.wait(what, lambda: nodegroup_status(eks, cfg.name, ng), until={NOT_FOUND})
    if status not in ("ACTIVE", NOT_FOUND):
        raise LifecycleError(f"{what} is in state {status}; inspect it in the EKS console before re-running")
    return status


def ensure_system_nodegroup(ctx: Context, result: UpResult) -> None:
    """Make the system node group ACTIVE (reuse, or create it in a cluster that exists without it).

    Raises:
        LifecycleError: a failed group/stack not confirmed for deletion, or eksctl failed.
    """
    cfg = ctx.cfg
    ng = cfg.aws.system_nodegroup
    if f"nodegroup/{ng}" in result.created:
        return
    if _nodegroup_ready_or_cleared(ctx, ng) == "ACTIVE":
        ctx.say(f"node group {ng}: ACTIVE, reused")
        result.reused.append(f"nodegroup/{ng}")
        return
    clear_failed_stack(ctx, nodegroup_stack(cfg, ng))
    azs = sorted(cluster_private_subnets(ctx.client("eks"), ctx.client("ec2"), cfg.name))
    path = _write(ctx, "eksctl-cluster.yaml", render_cluster_config(cfg, azs))
    res = ctx.runner.run(create_nodegroup_argv(path, ng), check=False, stream=True)
    if not res.ok or nodegroup_status(ctx.client("eks"), cfg.name, ng) != "ACTIVE":
        raise LifecycleError(f"creating node group {ng} failed (exit {res.returncode}); re-run `rayft cluster up` to resume")
    result.created.append(f"nodegroup/{ng}")


def ensure_placement_group(ctx: Context, result: UpResult) -> None:
    """Create the ``cluster`` placement group when ``cluster.aws.placement_group`` and it does not exist.

    Raises:
        botocore.exceptions.ClientError: DescribePlacementGroups / CreatePlacementGroup failed.
    """
    if not ctx.cfg.aws.placement_group:
        return
    ec2, name = ctx.client("ec2"), placement_group_name(ctx.cfg)
    groups = ec2.describe_placement_groups(Filters=[{"Name": "group-name", "Values": [name]}])["PlacementGroups"]
    if any(g.get("State") in ("available", "pending") for g in groups):
        ctx.say(f"placement group {name}: exists, reused")
        result.reused.append(f"placement-group/{name}")
        return
    tags = [{"Key": k, "Value": v} for k, v in cluster_tags(ctx.cfg).items()]
    ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}])
    result.created.append(f"placement-group/{name}")


def _reservation_az(ctx: Context) -> str | None:
    rid = ctx.cfg.aws.capacity_reservation_id
    if not rid:
        return None
    try:
        crs = ctx.client("ec2").describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    except (ClientError, BotoCoreError) as e:
        ctx.say(f"warning: could not read capacity reservation {rid} ({e}); using the configured AZs")
        return None
    return crs[0]["AvailabilityZone"] if crs else None


def _capacity_failure(ctx: Context, output: str) -> bool:
    cfg = ctx.cfg
    if any(s in output for s in CAPACITY_ERRORS):
        return True
    info = nodegroup_info(ctx.client("eks"), cfg.name, cfg.aws.gpu_nodegroup) or {}
    text = " ".join(f"{i.get('code')} {i.get('message')}" for i in (info.get("health") or {}).get("issues", []))
    text += " ".join(stack_failure_reasons(ctx.client("cloudformation"), nodegroup_stack(cfg, cfg.aws.gpu_nodegroup), limit=50))
    return any(s in text for s in CAPACITY_ERRORS)


def ensure_gpu_nodegroup(ctx: Context, candidates: Callable[[], list[str]], result: UpResult) -> None:
    """Make the GPU node group ACTIVE: reuse, or create it pinned to one AZ's private subnet.

    ``candidates`` gives the AZs to try in order (called only when creating); a capacity reservation
    pins the AZ instead. InsufficientInstanceCapacity in one AZ removes the failed stack and tries
    the next; ``result.gpu_az`` and ``result.skipped_azs`` say what happened.

    Raises:
        LifecycleError: no candidate AZ has a cluster subnet; no capacity in any candidate; any
            other create failure (with where to look).
    """
    cfg = ctx.cfg
    ng = cfg.aws.gpu_nodegroup
    eks, ec2 = ctx.client("eks"), ctx.client("ec2")
    if _nodegroup_ready_or_cleared(ctx, ng) == "ACTIVE":
        info = nodegroup_info(eks, cfg.name, ng) or {}
        size = (info.get("scalingConfig") or {}).get("desiredSize")
        ctx.say(f"node group {ng}: ACTIVE, reused")
        if size is not None and size != cfg.num_nodes:
            ctx.say(
                f"note: {ng} has {size} nodes, the config asks for {cfg.num_nodes}; to change it:\n"
                f"  eksctl scale nodegroup --cluster {cfg.name} --region {cfg.aws.region} --name {ng} "
                f"--nodes {cfg.num_nodes} --nodes-min {cfg.num_nodes} --nodes-max {cfg.num_nodes}"
            )
        result.reused.append(f"nodegroup/{ng}")
        return
    subnets = cluster_private_subnets(eks, ec2, cfg.name)
    pinned = _reservation_az(ctx)
    azs = [pinned] if pinned else [az for az in candidates() if az in subnets]
    if not azs:
        raise LifecycleError(
            f"no candidate AZ for {cfg.instance_type} has a private subnet of cluster {cfg.name} "
            f"(cluster subnets in: {', '.join(sorted(subnets)) or 'none'}); run `rayft capacity` to see why"
        )
    stack = nodegroup_stack(cfg, ng)
    ours = False
    for az in azs:
        clear_failed_stack(ctx, stack, ours=ours)
        if az not in subnets:
            result.skipped_azs[az] = "the cluster has no private subnet there"
            continue
        path = _write(ctx, "eksctl-gpu-nodegroup.yaml", render_gpu_nodegroup_config(cfg, az, subnets[az]))
        ctx.say(f"creating node group {ng}: {cfg.num_nodes} × {cfg.instance_type} in {az} ({subnets[az]})")
        res = ctx.runner.run(create_nodegroup_argv(path, ng), check=False, stream=True)
        status = nodegroup_status(eks, cfg.name, ng)
        if res.ok and status == "ACTIVE":
            result.created.append(f"nodegroup/{ng}")
            result.gpu_az = az
            return
        if _capacity_failure(ctx, res.stdout + res.stderr):
            result.skipped_azs[az] = "InsufficientInstanceCapacity"
            ctx.say(f"no capacity for {cfg.num_nodes} × {cfg.instance_type} in {az}; moving to the next AZ")
            if status != NOT_FOUND:
                _nodegroup_ready_or_cleared(ctx, ng, ours=True)
            ours = True
            continue
        raise LifecycleError(
            f"creating node group {ng} in {az} failed (exit {res.returncode}, status {status}); "
            f"see the eksctl output above and `aws cloudformation describe-stack-events --stack-name {stack}`. "
            "Re-run `rayft cluster up` to resume."
        )
    clear_failed_stack(ctx, stack, ours=True)
    raise LifecycleError(
        f"no capacity for {cfg.num_nodes} × {cfg.instance_type} in any candidate AZ ({', '.join(azs)}); "
        "try later, another region (`rayft capacity`), or a capacity reservation (cluster.aws.capacity_reservation_id)"
    )


def wait_addons_ready(ctx: Context, daemonsets: list[str], gpus_per_node: int) -> addons.Readiness:
    """Poll (every ``ctx.poll_s`` seconds, at most ``wait_timeout_minutes``) until the device-plugin
    ``daemonsets`` are ready on every GPU node and each node has ``gpus_per_node`` GPUs (and EFA) allocatable.

    Raises:
        LifecycleError: still not ready at the time-out; the message lists what is missing.
    """
    cfg = ctx.cfg
    last = addons.Readiness(ready=False)
    for i in range(ctx.max_polls):
        last = addons.check_ready(ctx.runner, daemonsets, cfg.num_nodes, gpus_per_node, cfg.efa)
        if last.ready:
            return last
        ctx.say("device plugins not ready yet: " + "; ".join(last.problems))
        ctx.sleep(ctx.poll_s)
    raise LifecycleError(
        "device plugins not ready: " + "; ".join(last.problems) + ". A healthy `helm status` does not mean the "
        "DaemonSet scheduled: check node labels/taints and `kubectl get pods -n kube-system -o wide`."
    )


# --------------------------------------------------------------------------- capacity for up


def _capacity(ctx: Context) -> CapacityReport:
    cfg = ctx.cfg
    return find_capacity(
        ctx.clients,
        cfg.instance_type,
        cfg.num_nodes,
        [cfg.aws.region],
        availability_zones=cfg.aws.availability_zones,
        capacity_type=cfg.aws.capacity_type,
    )


def _gpu_candidates(ctx: Context, cache: dict[str, Any]) -> list[str]:
    if "report" not in cache:
        report = cache["report"] = _capacity(ctx)
        for note in report.notes:
            ctx.say(f"note: {note}")
        usable = [c.az for c in report.usable(ctx.cfg.aws.region)]
        if not usable:
            msg = f"no AZ in {ctx.cfg.aws.region} can take {ctx.cfg.num_nodes} × {ctx.cfg.instance_type}"
            if report.quota_commands:
                msg += f" (need {report.need_vcpus} vCPUs of quota). Request more:\n  " + "\n  ".join(report.quota_commands)
            raise LifecycleError(msg)
        cache["azs"] = usable
    return cache["azs"]


def _cluster_azs(ctx: Context, cache: dict[str, Any]) -> list[str]:
    """The GPU candidates first (up to 3, so a capacity failure has somewhere to go), padded to ≥ 2."""
    azs = _gpu_candidates(ctx, cache)[:3]
    if len(azs) < 2:
        zones = ctx.client("ec2").describe_availability_zones(Filters=[{"Name": "state", "Values": ["available"]}])
        for z in sorted(x["ZoneName"] for x in zones["AvailabilityZones"] if x.get("ZoneType", "availability-zone") == "availability-zone"):
            if z not in azs:
                azs.append(z)
            if len(azs) >= 2:
                break
    return azs


# --------------------------------------------------------------------------- up / down / status


def up(ctx: Context) -> UpResult:
    """Bring the cluster to the config's state; every step probes first, so a second run is a no-op.

    Order: preflight (tools, credentials, instance type incl. EFA support), cluster, kubeconfig,
    system node group, placement group, GPU node group (AZ by AZ on InsufficientInstanceCapacity),
    add-ons, readiness. Waits are bounded by ``cluster.aws.wait_timeout_minutes`` per state change.

    Raises:
        LifecycleError: a step cannot go on (the message says why and how to recover); from
            preflight, before anything is created.
        rayft.cluster.runner.CommandError: helm/kubectl/eksctl failed where no recovery applies.
        botocore.exceptions.ClientError, BotoCoreError: an AWS call failed.
    """
    shape = preflight(ctx, instance=True).shape
    assert shape is not None  # preflight(instance=True) either found it or raised
    result = UpResult()
    cache: dict[str, Any] = {}
    ensure_cluster(ctx, lambda: _cluster_azs(ctx, cache), result)
    ctx.runner.run(write_kubeconfig_argv(ctx.cfg))
    ensure_system_nodegroup(ctx, result)
    ensure_placement_group(ctx, result)
    ensure_gpu_nodegroup(ctx, lambda: _gpu_candidates(ctx, cache), result)
    result.addons = addons.install_addons(ctx.runner, ctx.cfg, say=ctx.say)
    ready = wait_addons_ready(ctx, result.addons.device_plugin_daemonsets, shape.gpus)
    for n in ready.nodes:
        ctx.say(f"{n.name}: {n.gpus} GPU, {n.efa} EFA allocatable")
    ctx.say("cluster is up" if result.changed else "nothing to do: everything already matches the config")
    return result


@dataclass
class Status:
    """What :func:`status` found; ``hourly_usd`` is the On-Demand cost of the priced nodes (None: none priced)."""

    cluster: str
    nodegroups: dict[str, str]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    rayclusters: list[dict[str, str]] = field(default_factory=list)
    hourly_usd: float | None = None
    unpriced: list[str] = field(default_factory=list)


def _price(instance_type: str) -> float | None:
    """On-Demand USD per hour from the shipped catalog; None for types outside it or unpriced."""
    try:
        return get_instance(instance_type).on_demand_usd_per_hour
    except UnknownInstanceTypeError:
        return None


def status(ctx: Context) -> Status:
    """Cluster and node-group states; per node allocatable GPU/EFA; RayClusters; hourly cost (USD) of the nodes.

    Read-only apart from writing the kubeconfig. kubectl failures give empty lists, not errors.

    Raises:
        botocore.exceptions.ClientError: DescribeCluster/DescribeNodegroup failed.
        rayft.cluster.runner.CommandError: ``eksctl utils write-kubeconfig`` failed.
    """
    cfg, eks = ctx.cfg, ctx.client("eks")
    st = Status(cluster_status(eks, cfg.name), {})
    for ng in (cfg.aws.system_nodegroup, cfg.aws.gpu_nodegroup):
        st.nodegroups[ng] = nodegroup_status(eks, cfg.name, ng) if st.cluster != NOT_FOUND else NOT_FOUND
    if st.cluster != "ACTIVE":
        return st
    ctx.runner.run(write_kubeconfig_argv(cfg))
    res = ctx.runner.run(["kubectl", "get", "nodes", "--output", "json"], check=False)
    try:
        items = json.loads(res.stdout).get("items", []) if res.ok else []
    except json.JSONDecodeError:
        items = []
    total, priced = 0.0, False
    for n in items:
        r = addons.node_resources(n)
        role = ((n.get("metadata") or {}).get("labels") or {}).get("role", "")
        price = _price(r.instance_type)
        if price is None:
            st.unpriced.append(r.instance_type)
        else:
            total += price
            priced = True
        st.nodes.append(
            {"name": r.name, "role": role, "instance_type": r.instance_type, "gpus": r.gpus, "efa": r.efa, "usd_per_hour": price}
        )
    st.hourly_usd = total if priced else None
    res = ctx.runner.run(["kubectl", "get", "rayclusters.ray.io", "--all-namespaces", "--output", "json"], check=False)
    try:
        rcs = json.loads(res.stdout).get("items", []) if res.ok else []
    except json.JSONDecodeError:
        rcs = []
    for rc in rcs:
        meta = rc.get("metadata") or {}
        st.rayclusters.append(
            {
                "namespace": meta.get("namespace", ""),
                "name": meta.get("name", ""),
                "state": (rc.get("status") or {}).get("state", "?"),
            }
        )
    return st

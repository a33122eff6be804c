"""``rayft cluster down``: what ``up`` made, removed in reverse order, and the billable leftovers
found by tag afterwards (:func:`down`, :func:`leftovers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from botocore.exceptions import ClientError

from rayft.cluster import addons
from rayft.cluster.capacity import TAG_CLUSTER
from rayft.cluster.eks import Context, LifecycleError, clear_failed_stack, preflight
from rayft.cluster.eks_probes import NOT_FOUND, cluster_owner, cluster_status, error_code, nodegroup_status
from rayft.cluster.eks_render import (
    cluster_stack,
    delete_cluster_argv,
    delete_nodegroup_argv,
    nodegroup_stack,
    placement_group_name,
    write_kubeconfig_argv,
)


@dataclass
class Leftover:
    """One billable resource still tagged for the cluster: kind, id, and a short detail."""

    kind: str
    id: str
    detail: str = ""


def leftovers(ctx: Context) -> tuple[list[Leftover], list[str]]:
    """Billable resources still tagged for this cluster, and the checks that could not run.

    Never raises for a check that fails: it is listed in the second element instead.
    """
    cfg = ctx.cfg
    ec2 = ctx.client("ec2")
    name = cfg.name
    found: list[Leftover] = []
    errors: list[str] = []
    tag_filters = [
        [{"Name": f"tag:{TAG_CLUSTER}", "Values": [name]}],
        [{"Name": "tag:alpha.eksctl.io/cluster-name", "Values": [name]}],
        [{"Name": "tag:eks:cluster-name", "Values": [name]}],
        [{"Name": "tag-key", "Values": [f"kubernetes.io/cluster/{name}"]}],
    ]

    def each(kind: str, call: Callable[[list[dict]], list[Leftover]]) -> None:
        seen: set[str] = {x.id for x in found if x.kind == kind}
        for filters in tag_filters:
            try:
                for item in call(filters):
                    if item.id not in seen:
                        seen.add(item.id)
                        found.append(item)
            except Exception as e:  # noqa: BLE001 - a check that cannot run is reported, not fatal
                errors.append(f"{kind}: {type(e).__name__}: {e}")
                return

    def instances(f):
        resp = ec2.describe_instances(
            Filters=f + [{"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}]
        )
        return [Leftover("instance", i["InstanceId"], i["InstanceType"]) for r in resp["Reservations"] for i in r["Instances"]]

    def nats(f):
        resp = ec2.describe_nat_gateways(Filter=f + [{"Name": "state", "Values": ["pending", "available"]}])
        return [Leftover("nat-gateway", n["NatGatewayId"], n.get("State", "")) for n in resp["NatGateways"]]

    def volumes(f):
        resp = ec2.describe_volumes(Filters=f)
        return [Leftover("volume", v["VolumeId"], f"{v['Size']} GiB {v['State']}") for v in resp["Volumes"]]

    def reservations(f):
        resp = ec2.describe_capacity_reservations(Filters=f + [{"Name": "state", "Values": ["active", "pending"]}])
        return [Leftover("capacity-reservation", c["CapacityReservationId"], c["InstanceType"]) for c in resp["CapacityReservations"]]

    each("instance", instances)
    each("nat-gateway", nats)
    each("volume", volumes)
    each("capacity-reservation", reservations)
    try:
        elb = ctx.client("elbv2")
        arns = [lb["LoadBalancerArn"] for lb in elb.describe_load_balancers().get("LoadBalancers", [])]
        for i in range(0, len(arns), 20):
            for d in elb.describe_tags(ResourceArns=arns[i : i + 20])["TagDescriptions"]:
                tags = {t["Key"]: t["Value"] for t in d.get("Tags", [])}
                if tags.get(TAG_CLUSTER) == name or f"kubernetes.io/cluster/{name}" in tags or tags.get("elbv2.k8s.aws/cluster") == name:
                    found.append(Leftover("load-balancer", d["ResourceArn"]))
    except Exception as e:  # noqa: BLE001
        errors.append(f"load-balancer: {type(e).__name__}: {e}")
    return found, errors


def down(ctx: Context, *, allow_untagged: bool = False) -> tuple[list[Leftover], list[str]]:
    """Remove what ``up`` created, in reverse order, then report billable leftovers by tag.

    Only a cluster tagged ``rayft.io/cluster=<name>`` (on the EKS cluster or its eksctl stack) is
    deleted: one that ``up`` found and reused was not rayft's to delete. ``allow_untagged``
    (``rayft cluster down --delete-untagged``) overrides that.

    Returns:
        (billable leftovers found by tag, checks that could not run).

    Raises:
        LifecycleError: preflight failed; the cluster is not tagged as rayft's (nothing was
            touched); or a wait timed out (re-run to resume).
        rayft.cluster.runner.CommandError: helm or eksctl failed.
        botocore.exceptions.ClientError, BotoCoreError: an AWS call failed.
    """
    cfg = ctx.cfg
    preflight(ctx)
    eks = ctx.client("eks")
    status = cluster_status(eks, cfg.name)
    if status not in (NOT_FOUND, "DELETING"):
        owner = cluster_owner(eks, ctx.client("cloudformation"), cfg.name)
        if owner != cfg.name:
            found = "no rayft.io/cluster tag" if owner is None else f"tag rayft.io/cluster={owner}"
            if not allow_untagged:
                raise LifecycleError(
                    f"cluster {cfg.name} in {cfg.aws.region} has {found}: rayft did not create it (`up` only "
                    "reuses a cluster it finds), so `down` will not delete it. Nothing was changed. If it really "
                    "should go, with everything in it, re-run with --delete-untagged "
                    "(rayft cluster down CONFIG --delete-untagged)"
                )
            ctx.say(f"warning: cluster {cfg.name} has {found}; deleting it anyway (--delete-untagged)")
    if status == "ACTIVE":
        ctx.runner.run(write_kubeconfig_argv(cfg))
        addons.uninstall_addons(ctx.runner, cfg, say=ctx.say)
        for ng in (cfg.aws.gpu_nodegroup, cfg.aws.system_nodegroup):
            st = nodegroup_status(eks, cfg.name, ng)
            if st == "DELETING":
                ctx.wait(f"node group {ng}", lambda ng=ng: nodegroup_status(eks, cfg.name, ng), until={NOT_FOUND})
            elif st != NOT_FOUND:
                ctx.runner.run(delete_nodegroup_argv(cfg, ng), stream=True)
                ctx.wait(f"node group {ng}", lambda ng=ng: nodegroup_status(eks, cfg.name, ng), until={NOT_FOUND}, fail={"DELETE_FAILED"})
            else:
                ctx.say(f"node group {ng}: not found")
            clear_failed_stack(ctx, nodegroup_stack(cfg, ng), ours=True)
            if ng == cfg.aws.gpu_nodegroup:
                delete_placement_group(ctx)
    if status == "DELETING":
        ctx.wait(f"cluster {cfg.name}", lambda: cluster_status(eks, cfg.name), until={NOT_FOUND})
    elif status != NOT_FOUND:
        ctx.runner.run(delete_cluster_argv(cfg), stream=True)
        ctx.wait(f"cluster {cfg.name}", lambda: cluster_status(eks, cfg.name), until={NOT_FOUND}, fail={"FAILED"})
    else:
        ctx.say(f"cluster {cfg.name}: not found")
    for ng in (cfg.aws.gpu_nodegroup, cfg.aws.system_nodegroup):
        clear_failed_stack(ctx, nodegroup_stack(cfg, ng), ours=True)
    clear_failed_stack(ctx, cluster_stack(cfg), ours=True)
    delete_placement_group(ctx)
    return leftovers(ctx)


def delete_placement_group(ctx: Context) -> None:
    if not ctx.cfg.aws.placement_group:
        return
    name = placement_group_name(ctx.cfg)
    try:
        ctx.client("ec2").delete_placement_group(GroupName=name)
        ctx.say(f"deleted placement group {name}")
    except ClientError as e:
        if "NotFound" not in error_code(e) and "InvalidPlacementGroup" not in error_code(e):
            raise

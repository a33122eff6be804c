"""``rayft cluster plan``: every AWS call, command and rendered file that ``up`` and ``down`` would
use, without touching anything.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from rayft.cluster import addons
from rayft.cluster.capacity import TAG_CLUSTER, quota_family
from rayft.cluster.eks_render import (
    cluster_stack,
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
from rayft.cluster.spec import ClusterConfig

# --------------------------------------------------------------------------- plan


@dataclass
class PlanStep:
    """One step of :func:`plan`: its read-only probes, the actions when needed, rendered files, notes."""

    title: str
    probes: list[str] = field(default_factory=list)  # read-only AWS calls / commands
    actions: list[str] = field(default_factory=list)  # what runs when the probe says "absent"
    files: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def plan(cfg: ClusterConfig, workdir: Path = Path(".rayft"), gpu_az: str | None = None) -> list[PlanStep]:
    """Every AWS call, eksctl/helm/kubectl command and rendered file ``up`` would use. No side effect."""
    a = cfg.aws
    r = a.region
    az = gpu_az or (a.availability_zones[0] if a.availability_zones else None)
    cluster_azs = list(a.availability_zones[:3]) if len(a.availability_zones) >= 2 else []
    shown_az = az or "<first AZ offering the type with quota, chosen by `up`>"
    cluster_file = workdir / "eksctl-cluster.yaml"
    gpu_file = workdir / "eksctl-gpu-nodegroup.yaml"
    fam = quota_family(cfg.instance_type)
    code = fam.spot_code if a.capacity_type == "spot" else fam.on_demand_code
    steps = [
        PlanStep(
            "preflight",
            probes=[
                "PATH: eksctl, helm, kubectl",
                f"sts:GetCallerIdentity (region {r})",
                f"ec2:DescribeInstanceTypes(InstanceTypes=[{cfg.instance_type}])  # exists, has GPUs"
                + (", supports EFA" if cfg.efa else ""),
            ],
        ),
        PlanStep(
            f"capacity: {cfg.num_nodes} × {cfg.instance_type} in {r} (only when a node group must be created)",
            probes=[
                f"ec2:DescribeInstanceTypeOfferings(LocationType=availability-zone, Filters=[instance-type={cfg.instance_type}])",
                f"ec2:DescribeInstanceTypes(InstanceTypes=[{cfg.instance_type}])",
                f"service-quotas:GetServiceQuota(ServiceCode=ec2, QuotaCode={code}) ({fam.spot_name if a.capacity_type == 'spot' else fam.on_demand_name}, vCPUs)",
                f"ec2:DescribeInstances(Filters=[instance-state-name=pending,running]) (vCPUs in use by {fam.label} instances)",
            ],
            notes=[f"GPU AZ candidates: {', '.join(a.availability_zones) or 'every AZ offering the type'}; quota-short AZs are skipped"],
        ),
        PlanStep(
            f"cluster {cfg.name} (Kubernetes {a.kubernetes_version}) with system node group {a.system_nodegroup}",
            probes=[
                f"eks:DescribeCluster(name={cfg.name})",
                f"cloudformation:DescribeStacks(StackName={cluster_stack(cfg)})",
                f"cloudformation:DescribeStackEvents(StackName={cluster_stack(cfg)})  # only to explain a failure",
                "ec2:DescribeAvailabilityZones(Filters=[state=available])  # only when fewer than 2 GPU AZ candidates",
            ],
            actions=[
                shlex.join(delete_cluster_argv(cfg)) + "  # only if FAILED, after confirmation",
                f"cloudformation:DeleteStack(StackName={cluster_stack(cfg)})  # only if ROLLBACK_COMPLETE/failed, after confirmation",
                shlex.join(create_cluster_argv(cluster_file)),
            ],
            files={str(cluster_file): to_yaml(render_cluster_config(cfg, cluster_azs or ["<GPU AZ candidates, ≥ 2>"]))},
            notes=["ACTIVE → reuse; CREATING/UPDATING → wait; DELETING → wait, then create; FAILED → explain, delete on confirmation"],
        ),
        PlanStep("kubeconfig", actions=[shlex.join(write_kubeconfig_argv(cfg))]),
        PlanStep(
            f"system node group {a.system_nodegroup} ({a.system_nodes} × {a.system_instance_type}, label role=system)",
            probes=[
                f"eks:DescribeNodegroup(clusterName={cfg.name}, nodegroupName={a.system_nodegroup})",
                f"cloudformation:DescribeStacks(StackName={nodegroup_stack(cfg, a.system_nodegroup)})",
            ],
            actions=[shlex.join(create_nodegroup_argv(cluster_file, a.system_nodegroup)) + "  # only if the cluster existed without it"],
        ),
    ]
    if a.placement_group:
        steps.append(
            PlanStep(
                f"placement group {placement_group_name(cfg)} (strategy cluster)",
                probes=[f"ec2:DescribePlacementGroups(Filters=[group-name={placement_group_name(cfg)}])"],
                actions=[f"ec2:CreatePlacementGroup(GroupName={placement_group_name(cfg)}, Strategy=cluster)"],
            )
        )
    gpu_step = PlanStep(
        f"GPU node group {a.gpu_nodegroup}: {cfg.num_nodes} × {cfg.instance_type} in {shown_az}, EFA {'on' if cfg.efa else 'off'}",
        probes=[
            f"eks:DescribeNodegroup(clusterName={cfg.name}, nodegroupName={a.gpu_nodegroup})",
            f"cloudformation:DescribeStacks(StackName={nodegroup_stack(cfg, a.gpu_nodegroup)})",
            f"cloudformation:DescribeStackEvents(StackName={nodegroup_stack(cfg, a.gpu_nodegroup)})  # only to explain a failure",
            f"eks:DescribeCluster(name={cfg.name}) + ec2:DescribeSubnets (the cluster's private subnet in the AZ)",
        ]
        + (
            [f"ec2:DescribeCapacityReservations(CapacityReservationIds=[{a.capacity_reservation_id}]) (pins the AZ)"]
            if a.capacity_reservation_id
            else []
        ),
        actions=[
            shlex.join(delete_nodegroup_argv(cfg, a.gpu_nodegroup)) + "  # only if CREATE_FAILED/DEGRADED, after confirmation",
            f"cloudformation:DeleteStack(StackName={nodegroup_stack(cfg, a.gpu_nodegroup)})  # only if ROLLBACK_COMPLETE/failed",
            shlex.join(create_nodegroup_argv(gpu_file, a.gpu_nodegroup)),
        ],
        files={str(gpu_file): to_yaml(render_gpu_nodegroup_config(cfg, shown_az, None))},
        notes=[
            "`up` writes the cluster's private subnet id of the AZ into `subnets:` instead of `availabilityZones:`",
            "InsufficientInstanceCapacity → the failed stack is deleted and the next candidate AZ is tried",
        ],
    )
    steps.append(gpu_step)
    add = PlanStep("add-ons (helm upgrade --install, pinned versions)", notes=[])
    add.probes.append(
        shlex.join(addons.daemonsets_argv())
        + f"  # a device plugin outside Helm (eksctl's {', '.join(addons.EKSCTL_EFA.names[:1] + addons.EKSCTL_NVIDIA.names)})? then skip its chart"
    )
    for ch in addons.charts(cfg):
        add.probes.append(shlex.join(ch.status_argv()))
        if ch.release == addons.EFA_RELEASE:
            add.probes.append(shlex.join(ch.show_values_argv()) + "  # instance-type allowlist")
        add.actions.append(shlex.join(ch.upgrade_argv()))
        if ch.release == "kuberay-operator":
            add.actions.append(shlex.join(addons.kuberay_wait_argv()))
    add.notes.append("a release already deployed at the pinned version is left alone")
    steps.append(add)
    ready = PlanStep("ready", probes=[shlex.join(addons.daemonset_argv("nvidia-device-plugin"))])
    if cfg.efa:
        ready.probes.append(shlex.join(addons.daemonset_argv(addons.EKSCTL_EFA.names[0])) + "  # eksctl's, when it installed one")
        ready.probes.append(shlex.join(addons.daemonset_argv("aws-efa-k8s-device-plugin")) + "  # else the chart's")
    ready.probes.append(shlex.join(addons.gpu_nodes_argv()))
    ready.notes.append(
        f"ready: each DaemonSet's numberReady = {cfg.num_nodes} and every GPU node has nvidia.com/gpu allocatable"
        + (" and vpc.amazonaws.com/efa ≥ 1" if cfg.efa else "")
    )
    steps.append(ready)
    return steps


def render_plan(steps: list[PlanStep]) -> str:
    """``plan``'s steps as text: probes, commands, notes and each rendered file in full."""
    out: list[str] = []
    for i, s in enumerate(steps, 1):
        out.append(f"## {i}. {s.title}")
        for p in s.probes:
            out.append(f"  probe   {p}")
        for a in s.actions:
            out.append(f"  run     {a}")
        for n in s.notes:
            out.append(f"  note    {n}")
        for path, text in s.files.items():
            out.append(f"  file    {path}:")
            out.extend("          " + line for line in text.rstrip("\n").splitlines())
        out.append("")
    return "\n".join(out)


def plan_down(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """("probe" | "run", text) for what ``down`` does, in order (each run only when its probe finds the thing)."""
    out = [("probe", f"eks:DescribeCluster(name={cfg.name}), eks:DescribeNodegroup, cloudformation:DescribeStacks, helm status")]
    out.append(
        (
            "probe",
            f"ownership: tag {TAG_CLUSTER}={cfg.name} on the EKS cluster or stack {cluster_stack(cfg)}; "
            "without it `down` stops (override: --delete-untagged)",
        )
    )
    out.append(("run", shlex.join(write_kubeconfig_argv(cfg))))
    out += [("run", shlex.join(c.uninstall_argv())) for c in reversed(addons.charts(cfg))]
    out.append(("run", shlex.join(delete_nodegroup_argv(cfg, cfg.aws.gpu_nodegroup))))
    if cfg.aws.placement_group:
        out.append(("run", f"ec2:DeletePlacementGroup(GroupName={placement_group_name(cfg)})"))
    out.append(("run", shlex.join(delete_nodegroup_argv(cfg, cfg.aws.system_nodegroup))))
    out.append(("run", shlex.join(delete_cluster_argv(cfg))))
    out.append(("run", f"cloudformation:DeleteStack(StackName=eksctl-{cfg.name}-*)  # stacks left in a failed state"))
    out.append(
        (
            "probe",
            f"leftovers by tag ({TAG_CLUSTER}={cfg.name}, alpha.eksctl.io/cluster-name, eks:cluster-name, kubernetes.io/cluster/{cfg.name}): "
            "ec2:DescribeInstances, ec2:DescribeNatGateways, ec2:DescribeVolumes, ec2:DescribeCapacityReservations, "
            "elbv2:DescribeLoadBalancers + elbv2:DescribeTags",
        )
    )
    return out

"""eksctl's inputs for a cluster config: the stack, node group and placement group names, the
rendered ``ClusterConfig`` files, and the eksctl command lines (pure: nothing here calls AWS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rayft.cluster import addons
from rayft.cluster.capacity import TAG_CLUSTER
from rayft.cluster.spec import ClusterConfig

# --------------------------------------------------------------------------- names


def cluster_stack(cfg: ClusterConfig) -> str:
    """CloudFormation stack eksctl makes for the control plane: ``eksctl-<name>-cluster``."""
    return f"eksctl-{cfg.name}-cluster"


def nodegroup_stack(cfg: ClusterConfig, ng: str) -> str:
    """CloudFormation stack eksctl makes for node group ``ng``: ``eksctl-<name>-nodegroup-<ng>``."""
    return f"eksctl-{cfg.name}-nodegroup-{ng}"


def placement_group_name(cfg: ClusterConfig) -> str:
    """EC2 placement group of the GPU node group: ``rayft-<name>-<gpu group>``."""
    return f"rayft-{cfg.name}-{cfg.aws.gpu_nodegroup}"


def cluster_tags(cfg: ClusterConfig) -> dict[str, str]:
    """Tags on everything ``up`` creates: ``cluster.aws.tags`` plus ``rayft.io/cluster=<name>`` (ownership)."""
    return {**cfg.aws.tags, TAG_CLUSTER: cfg.name}


# --------------------------------------------------------------------------- eksctl config


def render_cluster_config(cfg: ClusterConfig, cluster_azs: list[str]) -> dict[str, Any]:
    """eksctl ClusterConfig for the control plane, its VPC and the system node group."""
    a = cfg.aws
    n = a.system_nodes
    return {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "metadata": {"name": cfg.name, "region": a.region, "version": str(a.kubernetes_version), "tags": cluster_tags(cfg)},
        "availabilityZones": list(cluster_azs),
        "vpc": {"clusterEndpoints": {"privateAccess": True, "publicAccess": True}, "nat": {"gateway": "Single"}},
        "iam": {"withOIDC": True},
        "addons": [{"name": "vpc-cni"}, {"name": "coredns"}, {"name": "kube-proxy"}],
        "managedNodeGroups": [
            {
                "name": a.system_nodegroup,
                "instanceType": a.system_instance_type,
                "desiredCapacity": n,
                "minSize": n,
                "maxSize": n,
                "privateNetworking": True,
                "amiFamily": a.ami_family,
                "labels": {"role": addons.SYSTEM_ROLE},
                "tags": cluster_tags(cfg),
            }
        ],
    }


def render_gpu_nodegroup_config(cfg: ClusterConfig, az: str, subnet_id: str | None) -> dict[str, Any]:
    """eksctl ClusterConfig holding only the GPU managed node group, pinned to ``az``.

    ``subnet_id``: the cluster's private subnet in ``az`` (an explicit id, so the group can never
    drift to another subnet); None renders ``availabilityZones: [az]`` (what ``plan`` shows before
    the cluster exists).
    """
    a = cfg.aws
    n = cfg.num_nodes
    ng: dict[str, Any] = {
        "name": a.gpu_nodegroup,
        "instanceType": cfg.instance_type,
        "desiredCapacity": n,
        "minSize": n,
        "maxSize": n,
    }
    if subnet_id:
        ng["subnets"] = [subnet_id]
    else:
        ng["availabilityZones"] = [az]
    ng["privateNetworking"] = True
    ng["efaEnabled"] = bool(cfg.efa)
    ng["amiFamily"] = a.ami_family
    ng["volumeSize"] = a.volume_size_gib
    if a.capacity_type == "spot":
        ng["spot"] = True
    ng["labels"] = {
        **a.gpu_labels,
        "role": addons.GPU_ROLE,
        # the NVIDIA device plugin chart's default node affinity requires this label
        "nvidia.com/gpu.present": "true",
        TAG_CLUSTER: cfg.name,
    }
    if a.gpu_taints:
        ng["taints"] = [t.model_dump() for t in a.gpu_taints]
    if a.placement_group:
        ng["placement"] = {"groupName": placement_group_name(cfg)}
    if a.capacity_reservation_id:
        ng["capacityReservation"] = {"capacityReservationTarget": {"capacityReservationID": a.capacity_reservation_id}}
    ng["tags"] = cluster_tags(cfg)
    return {
        "apiVersion": "eksctl.io/v1alpha5",
        "kind": "ClusterConfig",
        "metadata": {"name": cfg.name, "region": a.region, "tags": cluster_tags(cfg)},
        "managedNodeGroups": [ng],
    }


def to_yaml(doc: dict[str, Any]) -> str:
    """An eksctl config as YAML, keys in rendering order."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


# --------------------------------------------------------------------------- command lines


def create_cluster_argv(path: Path) -> list[str]:
    """``eksctl create cluster`` from the rendered config at ``path`` (eksctl's NVIDIA plugin off: Helm installs it)."""
    return ["eksctl", "create", "cluster", "--config-file", str(path), "--install-nvidia-plugin=false"]


def create_nodegroup_argv(path: Path, ng: str) -> list[str]:
    """``eksctl create nodegroup`` for node group ``ng`` only, from the rendered config at ``path``."""
    return ["eksctl", "create", "nodegroup", "--config-file", str(path), f"--include={ng}", "--install-nvidia-plugin=false"]


def write_kubeconfig_argv(cfg: ClusterConfig) -> list[str]:
    """``eksctl utils write-kubeconfig`` so that helm/kubectl talk to this cluster."""
    return ["eksctl", "utils", "write-kubeconfig", "--cluster", cfg.name, "--region", cfg.aws.region]


def delete_nodegroup_argv(cfg: ClusterConfig, ng: str) -> list[str]:
    """``eksctl delete nodegroup --wait`` for node group ``ng``."""
    return ["eksctl", "delete", "nodegroup", "--cluster", cfg.name, "--region", cfg.aws.region, "--name", ng, "--wait"]


def delete_cluster_argv(cfg: ClusterConfig) -> list[str]:
    """``eksctl delete cluster --wait`` (its node groups, stacks and VPC go with it)."""
    return ["eksctl", "delete", "cluster", "--name", cfg.name, "--region", cfg.aws.region, "--wait"]

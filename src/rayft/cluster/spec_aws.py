"""The AWS side of the `cluster:` config section: region, zones, EKS and node groups.

Everything `rayft capacity` and `rayft cluster plan|up|status|down` need to know beyond the
instance type and node count (which live on :class:`rayft.cluster.spec.ClusterConfig`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from rayft.config_base import ConfigModel


class Taint(ConfigModel):
    """A Kubernetes node taint, in eksctl's managed-node-group form."""

    model_config = ConfigDict(extra="forbid")

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class ChartVersions(ConfigModel):
    """Helm chart versions, pinned: floating them is how a working cluster silently breaks later."""

    model_config = ConfigDict(extra="forbid")

    nvidia_device_plugin: str = "0.20.0"
    efa_device_plugin: str = "v0.5.32"
    kuberay_operator: str = Field(default="1.7.0", pattern=r"^1\.7\.\d+$", description="KubeRay operator 1.7.x.")


class AwsSpec(ConfigModel):
    """Where and how the EKS cluster is created."""

    model_config = ConfigDict(extra="forbid")

    region: str = "us-west-2"
    capacity_regions: list[str] = Field(
        default_factory=list, description="Regions `rayft capacity` searches, in preference order; empty: just `region`."
    )
    availability_zones: list[str] = Field(
        default_factory=list, description="Candidate AZs in preference order; empty: all offering the type."
    )
    kubernetes_version: str = "1.33"
    ami_family: str = "AmazonLinux2023"
    system_instance_type: str = "m7i.xlarge"
    system_nodes: int = Field(default=1, ge=1, description="Nodes of the system node group (Ray head, KubeRay operator).")
    system_nodegroup: str = "system"
    gpu_nodegroup: str = "gpu-workers"
    volume_size_gib: int = Field(default=200, ge=20, description="Root EBS volume of each GPU node.")
    gpu_labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on GPU nodes (role=gpu-worker is always set).")
    gpu_taints: list[Taint] = Field(
        default_factory=lambda: [Taint(key="nvidia.com/gpu", value="true", effect="NoSchedule")],
        description="Taints on GPU nodes; pods that should land there need the matching tolerations.",
    )
    capacity_type: str = Field(default="on-demand", pattern="^(on-demand|spot)$")
    capacity_reservation_id: str | None = None
    placement_group: bool = False
    tags: dict[str, str] = Field(default_factory=dict)
    charts: ChartVersions = Field(default_factory=ChartVersions)
    wait_timeout_minutes: int = Field(default=45, ge=1, description="How long `up`/`down` wait for one AWS state change.")

"""The `cluster:` section of the job config: which GPU instances, how many, and where."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from rayft.cluster.spec_aws import AwsSpec
from rayft.cluster.spec_kube import KubeSpec
from rayft.config_base import ConfigModel


class ClusterConfig(ConfigModel):
    """A KubeRay RayCluster on EKS: ``num_nodes`` GPU nodes of ``instance_type``, one Ray worker pod each."""

    model_config = ConfigDict(extra="forbid")

    name: str = "rayft"
    instance_type: str = "g6.12xlarge"
    num_nodes: int = Field(default=2, ge=1)
    efa: bool = True
    kube: KubeSpec = Field(default_factory=KubeSpec)
    aws: AwsSpec = Field(default_factory=AwsSpec)

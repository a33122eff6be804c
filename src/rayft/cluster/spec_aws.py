"""The AWS side of the `cluster:` config section: region, zones, EKS and node groups."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AwsSpec(BaseModel):
    """Where and how the EKS cluster is created."""

    model_config = ConfigDict(extra="forbid")

    region: str = "us-west-2"
    availability_zones: list[str] = Field(default_factory=list, description="Candidate AZs in preference order; empty: all offering the type.")
    kubernetes_version: str = "1.33"
    system_instance_type: str = "m7i.xlarge"
    capacity_type: str = Field(default="on-demand", pattern="^(on-demand|spot)$")
    capacity_reservation_id: str | None = None
    placement_group: bool = False
    tags: dict[str, str] = Field(default_factory=dict)

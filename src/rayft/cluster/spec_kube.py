"""The Kubernetes side of the `cluster:` config section: what goes into the RayCluster/RayJob pods."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class KubeSpec(BaseModel):
    """Pod-level settings for the rendered RayCluster / RayJob manifests."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = "default"
    image: str = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    ray_version: str = Field(default="2.58.0", description="Ray version inside `image` (KubeRay rayVersion).")
    head_cpu: str = "2"
    head_memory: str = "8Gi"
    shm_size: str | None = Field(default=None, description="/dev/shm size; default: derived from node memory.")
    fsx_pvc: str | None = Field(default=None, description="PersistentVolumeClaim of an FSx for Lustre volume mounted at /fsx.")
    auth_token_secret: str | None = Field(default="rayft-auth-token", description="Secret holding the Ray auth token.")
    network_policy: bool = False
    job_ttl_seconds_after_finished: int = 600
    job_active_deadline_seconds: int | None = None
    job_backoff_limit: int = 0

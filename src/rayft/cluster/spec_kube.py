"""The Kubernetes side of the `cluster:` config section: what goes into the RayCluster/RayJob pods.

Every field has a default that reproduces the AWS sample's RayCluster (training/ray-train in
aws-samples/sample-aws-deep-learning-containers) for its instance type; `rayft manifest` derives the
rest (GPU and EFA counts, worker CPU/memory, /dev/shm) from the instance catalog.

Quantities (``head_cpu``, ``worker_memory``, ``shm_size`` …) are Kubernetes resource quantities:
``"2"``, ``"500m"``, ``"8Gi"``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from rayft.config_base import ConfigModel

# A Kubernetes resource quantity (apimachinery resource.Quantity, decimal or binary suffix).
# The one quantity pattern in rayft: manifest.parse_quantity parses with it (group 1: the number,
# group 3: the suffix), so keep those groups where they are.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
Quantity = Annotated[
    str,
    BeforeValidator(lambda v: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v),
    Field(pattern=QUANTITY_PATTERN, description="Kubernetes quantity, e.g. 4, 500m, 16Gi."),
]
# A Kubernetes label value / DNS-1123 subdomain style name.
# A string value that may be written as a YAML number or bool (`--set ...num-gpus=4`).
StrValue = Annotated[str, BeforeValidator(lambda v: str(v).lower() if isinstance(v, bool) else str(v))]
K8sName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
# A Linux capability as Kubernetes names it (no CAP_ prefix): IPC_LOCK, DAC_OVERRIDE.
Capability = Annotated[str, Field(pattern=r"^[A-Z][A-Z_]*[A-Z]$", description="Linux capability without CAP_, e.g. DAC_OVERRIDE.")]


class Toleration(ConfigModel):
    """One pod toleration (core/v1 Toleration)."""

    model_config = ConfigDict(extra="forbid")

    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class KubeSpec(ConfigModel):
    """Pod-level settings for the rendered RayCluster / RayJob manifests."""

    model_config = ConfigDict(extra="forbid")

    namespace: K8sName = "default"
    image: str = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "Always"
    ray_version: str = Field(default="2.58.0", pattern=r"^\d+\.\d+\.\d+", description="Ray version inside `image` (KubeRay rayVersion).")

    # head pod: CPU only, on the system node group
    head_cpu: Quantity = Field(default="2", description="Head CPU request.")
    head_memory: Quantity = Field(default="8Gi", description="Head memory request.")
    head_cpu_limit: Quantity | None = Field(default="3", description="Head CPU limit (None: no limit).")
    head_memory_limit: Quantity | None = Field(default="12Gi", description="Head memory limit (None: the request).")
    head_node_selector: dict[str, str] = Field(default_factory=lambda: {"role": "system"})
    head_ray_start_params: dict[str, StrValue] = Field(
        default_factory=dict, description="Extra `ray start` flags of the head (num-gpus must stay 0)."
    )

    # worker pods: one per GPU node, all of its GPUs
    worker_cpu: Quantity | None = Field(default=None, description="Worker CPU (request = limit); default: vCPUs less 1/6 for system pods.")
    worker_memory: Quantity | None = Field(default=None, description="Worker memory (request = limit); default: instance memory less 1/6.")
    worker_node_selector: dict[str, str] = Field(
        default_factory=lambda: {"role": "gpu-worker"},
        description="Labels of the GPU node group; node.kubernetes.io/instance-type is added.",
    )
    worker_tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Extra worker tolerations; one per taint of the GPU node group (cluster.aws.gpu_taints) is always added.",
    )
    worker_ray_start_params: dict[str, StrValue] = Field(
        default_factory=dict, description="Extra `ray start` flags of the workers; num-gpus must equal the GPU limit."
    )
    worker_env: dict[str, StrValue] = Field(default_factory=dict, description="Extra environment of the worker container.")

    shm_size: Quantity | None = Field(
        default=None,
        description="/dev/shm of each worker pod; default: a third of its memory limit (max 200Gi). The head gets a third of its own.",
    )
    ray_session_dir: str = Field(default="/tmp/ray", description="Ray session directory (an emptyDir volume).")

    # shared storage
    fsx_pvc: str | None = Field(
        default=None, description="PersistentVolumeClaim of an FSx for Lustre volume, mounted at `shared_mount_path`."
    )
    shared_mount_path: str = Field(default="/fsx", pattern=r"^/")
    hf_home: str | None = Field(default=None, description="HF_HOME in the pods; default: <shared_mount_path>/hf-cache when fsx_pvc is set.")
    service_account: str | None = Field(default=None, description="ServiceAccount of the pods (IRSA / Pod Identity for s3:// storage).")
    config_mount_path: str = Field(
        default="/etc/rayft/config.yaml", pattern=r"^/.+\.ya?ml$", description="Where the job config is mounted."
    )

    # security
    auth: Literal["token", "disabled"] = Field(default="token", description="Ray token authentication (KubeRay authOptions).")
    auth_token_secret: str | None = Field(
        default=None,
        description="Existing Secret (key auth_token) with the Ray token; None: KubeRay generates one per cluster.",
    )
    network_policy: bool = Field(default=False, description="Also render a NetworkPolicy confining the Ray pods.")
    run_as_non_root: bool = Field(
        default=False,
        description="securityContext.runAsNonRoot on every container. The default image (AWS's Ray DLC) runs as root, so "
        "false by default; set it (with run_as_user for an image whose USER is a name) for an image built to run as a user.",
    )
    run_as_user: int | None = Field(
        default=None, ge=1, description="securityContext.runAsUser of every container, e.g. 1000 (the `ray` user of rayproject/ray)."
    )
    capabilities_add: list[Capability] = Field(
        default_factory=list,
        description="Linux capabilities added to every container besides IPC_LOCK (EFA workers); all others are dropped.",
    )

    # RayJob
    job_cluster: Literal["embed", "select"] = Field(
        default="embed", description="embed: the RayJob carries the RayCluster; select: it runs on the rendered RayCluster."
    )
    job_shutdown_after_finishes: bool = True
    job_ttl_seconds_after_finished: int = Field(default=600, ge=0)
    job_active_deadline_seconds: int | None = Field(default=None, gt=0)
    job_backoff_limit: int = Field(default=0, ge=0)
    runtime_env: dict[str, Any] = Field(
        default_factory=dict, description="Ray runtime_env of the job (RayJob runtimeEnvYAML), e.g. {pip: [rayft]}."
    )

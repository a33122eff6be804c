"""The GPU instance catalog: what one EC2 instance type brings to a Ray worker pod.

Two sources, one shape (:class:`InstanceType`):

* :func:`get_instance` reads the table shipped with the package (``instance_catalog.json``, next
  to this file). Every figure there names its source and the date it was taken
  (:meth:`InstanceType.source_of`).
* :func:`describe_instance_type` asks EC2 ``DescribeInstanceTypes`` when a client is given or AWS
  credentials are present, and falls back to the shipped table otherwise. EC2 does not report
  NVLink, GPUDirect RDMA or prices; those come from the table when the type is in it, else from the
  GPU model (NVLink for A100/H100/H200/B200/B300 boards; GPUDirect RDMA for those with EFA).

:func:`shape_from_ec2` is the one parser of a DescribeInstanceTypes item (also used by
:mod:`rayft.cluster.capacity` for vCPU arithmetic, where the type need not have GPUs);
:func:`describe_shape` asks EC2 for it.

Units: memory in MiB (``*_mib``) with GiB helpers, prices in US dollars per instance-hour
(On-Demand, us-east-1, Linux).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CATALOG_FILE = "instance_catalog.json"

#: The Kubernetes extended resources an instance's devices are advertised as (by the NVIDIA and
#: AWS EFA device plugins); the manifests request them and the add-on readiness check counts them.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# GPU models whose multi-GPU EC2 boards are joined by NVLink/NVSwitch, and which support GPUDirect
# RDMA over EFA. Used only for types that are not in the shipped table.
_NVLINK_MODELS = frozenset({"V100", "A100", "H100", "H200", "B200", "B300"})
_GDR_MODELS = frozenset({"A100", "H100", "H200", "B200", "B300"})


class UnknownInstanceTypeError(KeyError):
    """An instance type that is neither in the shipped catalog nor known to EC2."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message as written
        return str(self.args[0]) if self.args else ""


class NotAGpuInstanceError(ValueError):
    """An instance type that exists but has no GPUs (EC2 returned no GpuInfo)."""


class Source(BaseModel):
    """Where one figure comes from and when it was taken (``date``: ISO 8601 day)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


class InstanceType(BaseModel):
    """One GPU instance type.

    Attributes:
        name: EC2 instance type, e.g. ``g6.12xlarge``.
        gpu_count: GPUs per instance (what ``nvidia.com/gpu`` advertises on the node).
        gpu_model: EC2's GPU name, e.g. ``L4``, ``H100``.
        gpu_memory_mib: memory of one GPU, MiB.
        vcpus: default vCPUs.
        memory_mib: instance memory, MiB.
        max_efa_interfaces: most EFA interfaces the type takes (``vpc.amazonaws.com/efa``); 0 = no EFA.
        gpudirect_rdma: EFA can read/write GPU memory directly (p4d and newer P types).
        nvlink: GPUs are joined by NVLink/NVSwitch (False: PCIe only).
        on_demand_usd_per_hour: On-Demand price in us-east-1, Linux, USD per hour; None if not recorded.
        origin: ``catalog`` (shipped table) or ``ec2`` (DescribeInstanceTypes).
        sources: field name → :class:`Source`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    gpu_count: int = Field(ge=1)
    gpu_model: str
    gpu_memory_mib: int = Field(gt=0)
    vcpus: int = Field(ge=1)
    memory_mib: int = Field(gt=0)
    max_efa_interfaces: int = Field(ge=0)
    gpudirect_rdma: bool
    nvlink: bool
    on_demand_usd_per_hour: float | None = Field(default=None, gt=0)
    origin: Literal["catalog", "ec2"] = "catalog"
    sources: dict[str, Source] = Field(default_factory=dict)

    @property
    def efa_supported(self) -> bool:
        """True when the type takes at least one EFA interface."""
        return self.max_efa_interfaces > 0

    @property
    def memory_gib(self) -> float:
        """Instance memory in GiB."""
        return self.memory_mib / 1024

    @property
    def gpu_memory_gib(self) -> float:
        """Memory of one GPU in GiB."""
        return self.gpu_memory_mib / 1024

    def source_of(self, field: str) -> Source:
        """The source and date of one figure.

        Raises:
            KeyError: ``field`` has no recorded source.
        """
        try:
            return self.sources[field]
        except KeyError:
            raise KeyError(f"{self.name}: no source recorded for {field!r}") from None


@lru_cache(maxsize=1)
def _raw_catalog() -> dict[str, Any]:
    text = resources.files("rayft.cluster").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def _catalog() -> dict[str, InstanceType]:
    raw = _raw_catalog()
    sources = {k: Source.model_validate(v) for k, v in raw["sources"].items()}
    out: dict[str, InstanceType] = {}
    for name, rec in raw["instances"].items():
        rec = dict(rec)
        refs = rec.pop("sources")
        out[name] = InstanceType.model_validate(
            {**rec, "name": name, "origin": "catalog", "sources": {f: sources[ref] for f, ref in refs.items()}}
        )
    return out


def catalog() -> dict[str, InstanceType]:
    """Every instance type in the shipped table, by name (a copy; safe to modify)."""
    return dict(_catalog())


def get_instance(name: str) -> InstanceType:
    """The shipped catalog's entry for ``name`` (no network).

    Raises:
        UnknownInstanceTypeError: ``name`` is not in the table; the message lists the known types.
    """
    try:
        return _catalog()[name]
    except KeyError:
        known = ", ".join(sorted(_catalog()))
        raise UnknownInstanceTypeError(
            f"unknown GPU instance type {name!r}; the shipped catalog has: {known}. "
            "Other types are looked up with EC2 DescribeInstanceTypes when AWS credentials are present."
        ) from None


def _default_ec2_client(region: str | None) -> Any | None:
    """A boto3 EC2 client when boto3 is installed and credentials resolve, else None.

    ``region`` wins over the session's default region (a type may exist in one region and not in
    another); without either, us-east-1.
    """
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return None
    session = boto3.Session()
    if session.get_credentials() is None:
        return None
    cfg = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2})
    return session.client("ec2", region_name=region or session.region_name or "us-east-1", config=cfg)


@dataclass(frozen=True)
class Shape:
    """What one DescribeInstanceTypes item says about a type, GPU or not.

    Attributes:
        instance_type: EC2 instance type.
        vcpus: default vCPUs (what EC2 vCPU quotas count).
        memory_mib: instance memory, MiB (0 when the item has none).
        gpus: GPUs per instance, summed over GPU kinds (0: no GPU).
        efa_supported: EC2 reports EFA support.
        max_efa_interfaces: most EFA interfaces (0 without EFA).
    """

    instance_type: str
    vcpus: int
    memory_mib: int
    gpus: int
    efa_supported: bool
    max_efa_interfaces: int


def shape_from_ec2(info: dict[str, Any]) -> Shape:
    """Parse one ``InstanceTypes[]`` item of DescribeInstanceTypes (the only place that does).

    Raises:
        KeyError: the item lacks ``InstanceType`` or ``VCpuInfo.DefaultVCpus``.
    """
    gpus = sum(int(g.get("Count", 0)) for g in (info.get("GpuInfo") or {}).get("Gpus") or [])
    net = info.get("NetworkInfo") or {}
    efa_supported = bool(net.get("EfaSupported"))
    return Shape(
        instance_type=info["InstanceType"],
        vcpus=int(info["VCpuInfo"]["DefaultVCpus"]),
        memory_mib=int((info.get("MemoryInfo") or {}).get("SizeInMiB", 0)),
        gpus=gpus,
        efa_supported=efa_supported,
        max_efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)) if efa_supported else 0,
    )


def describe_shape(ec2: Any, instance_type: str) -> Shape:
    """Ask EC2 DescribeInstanceTypes (client ``ec2``) for ``instance_type``'s :class:`Shape`.

    No fallback to the shipped table: callers (capacity, ``cluster up``) need the live answer.

    Raises:
        botocore.exceptions.ClientError: e.g. ``InvalidInstanceType`` for a type EC2 does not know.
        UnknownInstanceTypeError: EC2 answered with no item for it.
    """
    items = ec2.describe_instance_types(InstanceTypes=[instance_type]).get("InstanceTypes") or []
    if not items:
        raise UnknownInstanceTypeError(f"unknown instance type {instance_type!r} (EC2 returned no match)")
    return shape_from_ec2(items[0])


def instance_from_ec2(info: dict[str, Any], date: str) -> InstanceType:
    """Build an :class:`InstanceType` from one ``InstanceTypes[]`` item of DescribeInstanceTypes.

    NVLink, GPUDirect RDMA and the price come from the shipped table when the type is in it, else
    NVLink/GDR are inferred from the GPU model and the price is None.

    Raises:
        NotAGpuInstanceError: the item has no ``GpuInfo``.
    """
    shape = shape_from_ec2(info)
    name = shape.instance_type
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if not gpus or shape.gpus < 1:
        raise NotAGpuInstanceError(f"{name} has no GPUs (DescribeInstanceTypes returned no GpuInfo)")
    gpu = gpus[0]
    efa = shape.max_efa_interfaces
    ec2_src = Source(source=f"EC2 DescribeInstanceTypes ({name})", date=date)
    known = _catalog().get(name)
    if known is not None:
        nvlink, gdr, price = known.nvlink, known.gpudirect_rdma, known.on_demand_usd_per_hour
        extra = {f: known.sources[f] for f in ("nvlink", "gpudirect_rdma", "on_demand_usd_per_hour")}
    else:
        model = gpu["Name"]
        nvlink = model in _NVLINK_MODELS and shape.gpus > 1
        gdr = model in _GDR_MODELS and efa > 0
        price = None
        inferred = Source(source=f"inferred from the GPU model ({model}) and EFA support", date=date)
        extra = {"nvlink": inferred, "gpudirect_rdma": inferred}
    return InstanceType(
        name=name,
        gpu_count=shape.gpus,
        gpu_model=gpu["Name"],
        gpu_memory_mib=int(gpu["MemoryInfo"]["SizeInMiB"]),
        vcpus=shape.vcpus,
        memory_mib=shape.memory_mib,
        max_efa_interfaces=efa,
        gpudirect_rdma=gdr,
        nvlink=nvlink,
        on_demand_usd_per_hour=price,
        origin="ec2",
        sources={
            **{f: ec2_src for f in ("gpu_count", "gpu_model", "gpu_memory_mib", "vcpus", "memory_mib", "max_efa_interfaces")},
            **extra,
        },
    )


def describe_instance_type(name: str, ec2_client: Any | None = None, *, region: str | None = None) -> InstanceType:
    """Look ``name`` up with EC2 DescribeInstanceTypes, falling back to the shipped table.

    With ``ec2_client=None`` a client is made only when boto3 finds AWS credentials, in ``region``
    (pass the cluster's: ``cluster.aws.region``), else the session's region, else us-east-1. When
    there is no client, or the call fails for a reason other than an unknown type (no network,
    access denied, throttling), the shipped table answers.

    Raises:
        UnknownInstanceTypeError: EC2 says the type does not exist, or (offline) the table lacks it.
        NotAGpuInstanceError: the type exists but has no GPUs.
    """
    client = ec2_client if ec2_client is not None else _default_ec2_client(region)
    if client is None:
        return get_instance(name)
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - a client without botocore is a test double
        BotoCoreError = ClientError = ()  # type: ignore[assignment]
    try:
        resp = client.describe_instance_types(InstanceTypes=[name])
    except ClientError as e:  # type: ignore[misc]
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("InvalidInstanceType", "InvalidParameterValue"):
            raise UnknownInstanceTypeError(f"unknown instance type {name!r} (EC2: {code})") from None
        return get_instance(name)
    except BotoCoreError:  # type: ignore[misc]
        return get_instance(name)
    items = resp.get("InstanceTypes") or []
    if not items:
        raise UnknownInstanceTypeError(f"unknown instance type {name!r} (EC2 returned no match)")
    from datetime import date

    return instance_from_ec2(items[0], date.today().isoformat())

"""RayCluster and RayJob manifests for any EKS GPU instance type, rendered from the job config.

The path: :func:`render` (config + instance catalog → plain dicts) → :func:`check` (contradictions
between the config, the instance and the rendered objects) → :func:`validate` (Kubernetes OpenAPI
via kubernetes-validate, KubeRay CRD schemas via jsonschema) → :func:`write` (one YAML per object).
:func:`build` runs the first three; nothing is written unless all of them pass.

Objects rendered (:class:`Manifests`):

* ``ConfigMap`` ``<name>-config``: the resolved job config, mounted in every pod at
  ``cluster.kube.config_mount_path`` so the RayJob entrypoint can run ``rayft train <that path>``.
* ``RayCluster`` ``<name>``: a CPU head on the system node group and one GPU worker group, one pod
  per node taking all of its GPUs and EFA interfaces.
* ``RayJob`` ``<name>``: embeds that cluster spec (``cluster.kube.job_cluster: embed``) or selects
  the RayCluster by name (``select``).
* ``NetworkPolicy`` ``<name>-ray`` when ``cluster.kube.network_policy`` is true.

Every container runs with ``allowPrivilegeEscalation: false`` and every capability dropped but
``IPC_LOCK`` on EFA workers (:func:`security_context`); every pod's ``terminationGracePeriodSeconds``
covers ``checkpoint.signal_grace_s`` (:func:`termination_grace_s`).
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rayft.cluster.instances import EFA_RESOURCE, GPU_RESOURCE, InstanceType, get_instance
from rayft.cluster.spec import ClusterConfig
from rayft.cluster.spec_kube import QUANTITY_PATTERN
from rayft.config import RayftConfig, dump_config

RAY_API_VERSION = "ray.io/v1"
KUBERAY_CRD_VERSION = "v1.7.0"
WORKER_GROUP = "gpu-workers"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
MAX_RAYCLUSTER_NAME = 53  # KubeRay: 63 - len("-serve-svc")
MAX_RAYJOB_NAME = 47  # KubeRay appends 6 characters for the RayCluster it creates
SHM_CAP_GIB = 200  # Ray caps its default object store at 200 GB; more /dev/shm is never used
HEADROOM_FRACTION = 6  # 1/6 of vCPUs and memory left to kubelet, daemon sets and system pods

# Ray inside known images; the image tag is checked against cluster.kube.ray_version.
KNOWN_IMAGE_RAY = {
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1": "2.58.0",
}
_RAYPROJECT_TAG = re.compile(r"^(?:docker\.io/)?(?:rayproject|anyscale)/ray(?:-ml)?:(\d+\.\d+\.\d+)")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")

PCIE_SHM_ENV = {"NCCL_SHM_USE_CUDA_MEMCPY": "1"}

# Capabilities an EFA worker keeps once every other one is dropped: libfabric's EFA provider
# registers (pins) its buffers and the GPU memory it reads and writes, which locks memory beyond
# RLIMIT_MEMLOCK unless the node raised that limit; CAP_IPC_LOCK lifts it. docs/manifests.md gives
# the sources. NCCL's socket and shared-memory transports need none.
EFA_CAPABILITIES = ("IPC_LOCK",)
# Seconds Kubernetes waits between SIGTERM and SIGKILL beyond checkpoint.signal_grace_s (rayft's own stop).
TERMINATION_MARGIN_S = 5


class ManifestError(ValueError):
    """Rendered manifests that contradict the config or do not validate.

    ``problems`` holds one ``(field, message)`` pair per finding; ``field`` is a dotted config key
    (``train.num_workers``) or an object path (``RayCluster/rayft: spec.workerGroupSpecs[0]...``).
    """

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        lines = [f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in the rendered manifests:"]
        lines += [f"  {f}: {m}" for f, m in problems]
        super().__init__("\n".join(lines))


@dataclass
class Manifests:
    """The rendered objects, as plain dicts ready for YAML."""

    config_map: dict[str, Any]
    raycluster: dict[str, Any]
    rayjob: dict[str, Any]
    network_policy: dict[str, Any] | None = None
    instance: InstanceType | None = None
    notes: list[str] = field(default_factory=list)
    #: things that will likely make the job fail but that rayft cannot be sure of (printed, not errors)
    warnings: list[str] = field(default_factory=list)

    def to_apply(self, job_cluster: str) -> dict[str, dict[str, Any]]:
        """File name → object, for what is applied in ``job_cluster`` mode (embed/select)."""
        out = {"configmap.yaml": self.config_map}
        if job_cluster == "select":
            out["raycluster.yaml"] = self.raycluster
        out["rayjob.yaml"] = self.rayjob
        if self.network_policy is not None:
            out["networkpolicy.yaml"] = self.network_policy
        return out


# --------------------------------------------------------------------------- quantities
#
# Our own parser: the ``kubernetes`` client package (kubernetes.utils.parse_quantity) is not a
# dependency. The pattern is the config's (spec_kube.QUANTITY_PATTERN): group 1 the number,
# group 3 the suffix.

_SUFFIX = {
    "": 1,
    "m": Decimal("0.001"),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QTY = re.compile(QUANTITY_PATTERN)


def parse_quantity(q: str | int | float) -> Decimal:
    """A Kubernetes quantity as a number (CPU in cores, memory in bytes).

    Raises:
        ValueError: not a quantity.
    """
    if isinstance(q, (int, float)):
        return Decimal(str(q))
    m = _QTY.match(q.strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {q!r}")
    num, suf = Decimal(m.group(1)), m.group(3) or ""
    if len(suf) > 1 and suf[0] in ("e", "E"):  # an exponent; a lone "E" is the exa suffix
        return num * Decimal(10) ** int(suf[1:])
    return num * Decimal(_SUFFIX[suf])


def _gib(n: int) -> str:
    return f"{n}Gi"


# --------------------------------------------------------------------------- derived figures


def worker_resources(instance: InstanceType, cluster: ClusterConfig) -> dict[str, str]:
    """Worker container limits (= requests): GPUs, EFA interfaces, CPU, memory, as quantities."""
    kube = cluster.kube
    cpu = kube.worker_cpu or str(instance.vcpus - math.ceil(instance.vcpus / HEADROOM_FRACTION))
    mem_gib = instance.memory_mib // 1024
    memory = kube.worker_memory or _gib(mem_gib - math.ceil(mem_gib / HEADROOM_FRACTION))
    res = {GPU_RESOURCE: str(instance.gpu_count)}
    if cluster.efa:
        res[EFA_RESOURCE] = str(instance.max_efa_interfaces)
    res["cpu"] = cpu
    res["memory"] = memory
    return res


def default_shm(memory_limit: str) -> str:
    """/dev/shm for a pod with this memory limit: a third of it (whole GiB, 1..200)."""
    gib = int(parse_quantity(memory_limit) // 2**30)
    return _gib(max(1, min(SHM_CAP_GIB, gib // 3)))


def image_ray_version(image: str) -> str | None:
    """The Ray version inside ``image`` when known (table of images, rayproject/ray tags), else None."""
    if image in KNOWN_IMAGE_RAY:
        return KNOWN_IMAGE_RAY[image]
    m = _RAYPROJECT_TAG.match(image)
    return m.group(1) if m else None


def image_lacks_rayft(image: str) -> bool:
    """True for images known not to contain rayft: the known DLC images and stock rayproject/ray tags.

    Any other image is assumed to be built for the job (rayft installed).
    """
    return image in KNOWN_IMAGE_RAY or _RAYPROJECT_TAG.match(image) is not None


def runtime_env_installs_rayft(runtime_env: dict[str, Any]) -> bool:
    """True when the Ray runtime_env names rayft in a package list (``pip``, ``uv``, ``conda``) or ships ``py_modules``."""
    for key in ("pip", "uv", "conda", "py_modules"):
        if key in runtime_env and "rayft" in str(runtime_env[key]).lower():
            return True
    return False


def is_shared_path(path: str, cluster: ClusterConfig) -> bool:
    """True when ``path`` is reachable from every pod: a URI (s3://…) or under the FSx mount."""
    if _URI.match(path):
        return True
    if cluster.kube.fsx_pvc is None:
        return False
    p, mount = PurePosixPath(path), PurePosixPath(cluster.kube.shared_mount_path)
    return p.is_absolute() and (p == mount or mount in p.parents)


def hf_home(cluster: ClusterConfig) -> str | None:
    """HF_HOME for the pods: the configured one, else a cache on FSx when there is one."""
    if cluster.kube.hf_home:
        return cluster.kube.hf_home
    if cluster.kube.fsx_pvc:
        return str(PurePosixPath(cluster.kube.shared_mount_path) / "hf-cache")
    return None


# --------------------------------------------------------------------------- rendering


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "rayft", "app.kubernetes.io/instance": name, "app.kubernetes.io/managed-by": "rayft"}


def _env(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in d.items()]


def _volumes(cluster: ClusterConfig, shm: str, config_map: str) -> tuple[list[dict], list[dict]]:
    kube = cluster.kube
    cfg_path = PurePosixPath(kube.config_mount_path)
    volumes: list[dict[str, Any]] = [
        {"name": "ray-logs", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "rayft-config", "configMap": {"name": config_map, "items": [{"key": "config.yaml", "path": cfg_path.name}]}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "ray-logs", "mountPath": kube.ray_session_dir},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "rayft-config", "mountPath": str(cfg_path.parent), "readOnly": True},
    ]
    if kube.fsx_pvc:
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": kube.fsx_pvc}})
        mounts.append({"name": "shared", "mountPath": kube.shared_mount_path})
    return volumes, mounts


def termination_grace_s(signal_grace_s: float) -> int:
    """Every pod's terminationGracePeriodSeconds: rayft's stop on SIGTERM (``checkpoint.signal_grace_s``,
    rounded up) plus :data:`TERMINATION_MARGIN_S`, so that Kubernetes' SIGKILL comes after it."""
    return math.ceil(signal_grace_s) + TERMINATION_MARGIN_S


def security_context(cluster: ClusterConfig, *, efa_worker: bool) -> dict[str, Any]:
    """A container's securityContext: no privilege escalation, every capability dropped but
    :data:`EFA_CAPABILITIES` on an EFA worker and ``cluster.kube.capabilities_add``; non-root when
    ``cluster.kube.run_as_non_root``."""
    kube = cluster.kube
    add = list(EFA_CAPABILITIES) if efa_worker else []
    add += [c for c in kube.capabilities_add if c not in add]
    caps: dict[str, list[str]] = {"drop": ["ALL"]}
    if add:
        caps["add"] = add
    sc: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": caps}
    if kube.run_as_non_root:
        sc["runAsNonRoot"] = True
    if kube.run_as_user is not None:
        sc["runAsUser"] = kube.run_as_user
    return sc


def _pod_spec(
    cluster: ClusterConfig,
    container: dict[str, Any],
    volumes: list[dict],
    *,
    node_selector: dict,
    grace_s: int,
    tolerations: list[dict] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if cluster.kube.service_account:
        spec["serviceAccountName"] = cluster.kube.service_account
    spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    spec["terminationGracePeriodSeconds"] = grace_s
    spec["containers"] = [container]
    spec["volumes"] = volumes
    return spec


def _lifecycle(grace_s: int) -> dict[str, Any]:
    """The pod's preStop hook, which Kubernetes runs before its SIGTERM and within
    ``terminationGracePeriodSeconds``: ``rayft stop`` asks the cluster's rayft runs to checkpoint
    their last finished step and stop (as a SIGTERM to their drivers would) and waits for them, then
    ``ray stop`` ends this node's Ray processes as in the AWS sample. A missing ``rayft`` (an image
    without it) or a run that does not end in time does not block ``ray stop``."""
    wait = max(grace_s - TERMINATION_MARGIN_S, 1)
    stop = f'rayft stop --wait {wait} --reason "preStop of pod $HOSTNAME" || true; ray stop'
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", stop]}}}


def _head_group(cluster: ClusterConfig, config_map: str, common_env: dict[str, str], grace_s: int) -> dict[str, Any]:
    kube = cluster.kube
    limits = {"cpu": kube.head_cpu_limit, "memory": kube.head_memory_limit or kube.head_memory}
    limits = {k: v for k, v in limits.items() if v is not None}
    requests = {"cpu": kube.head_cpu, "memory": kube.head_memory}
    shm = default_shm(limits["memory"])
    volumes, mounts = _volumes(cluster, shm, config_map)
    env = {"NVIDIA_VISIBLE_DEVICES": "void", **common_env}
    container = {
        "name": HEAD_CONTAINER,
        "image": kube.image,
        "imagePullPolicy": kube.image_pull_policy,
        "env": _env(env),
        "ports": [
            {"containerPort": 6379, "name": "gcs-server"},
            {"containerPort": 8265, "name": "dashboard"},
            {"containerPort": 10001, "name": "client"},
        ],
        "resources": {"limits": limits, "requests": requests},
        "volumeMounts": mounts,
        "lifecycle": _lifecycle(grace_s),
        "securityContext": security_context(cluster, efa_worker=False),
    }
    params = {"dashboard-host": "0.0.0.0", "num-gpus": "0", **kube.head_ray_start_params}
    return {
        "serviceType": "ClusterIP",
        "enableIngress": False,
        "rayStartParams": params,
        "template": {
            "metadata": {"labels": _labels(cluster.name)},
            "spec": _pod_spec(cluster, container, volumes, node_selector=dict(kube.head_node_selector), grace_s=grace_s),
        },
    }


def worker_env(instance: InstanceType, cluster: ClusterConfig, common_env: dict[str, str]) -> dict[str, str]:
    """Environment of the GPU worker container (NCCL/EFA variables first, then the user's)."""
    env = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    if cluster.efa:
        env |= {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"}
        if instance.gpudirect_rdma:
            env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    if not instance.nvlink and instance.gpu_count > 1:
        env |= PCIE_SHM_ENV
    env |= common_env
    env |= cluster.kube.worker_env
    return env


def worker_tolerations(cluster: ClusterConfig) -> list[dict[str, str]]:
    """Tolerations of the worker pods: one per taint of the GPU node group, then the extra ones."""
    out: list[dict[str, str]] = []
    for t in cluster.aws.gpu_taints:
        tol = {"key": t.key, "operator": "Equal", "value": t.value} if t.value else {"key": t.key, "operator": "Exists"}
        out.append({**tol, "effect": t.effect})
    for t in cluster.kube.worker_tolerations:
        tol = t.model_dump(exclude_none=True)
        if tol not in out:
            out.append(tol)
    return out


def _worker_group(
    instance: InstanceType, cluster: ClusterConfig, config_map: str, common_env: dict[str, str], grace_s: int
) -> dict[str, Any]:
    kube = cluster.kube
    res = worker_resources(instance, cluster)
    shm = kube.shm_size or default_shm(res["memory"])
    volumes, mounts = _volumes(cluster, shm, config_map)
    container = {
        "name": WORKER_CONTAINER,
        "image": kube.image,
        "imagePullPolicy": kube.image_pull_policy,
        "env": _env(worker_env(instance, cluster, common_env)),
        "resources": {"limits": dict(res), "requests": dict(res)},
        "volumeMounts": mounts,
        "lifecycle": _lifecycle(grace_s),
        "securityContext": security_context(cluster, efa_worker=cluster.efa),
    }
    node_selector = {**kube.worker_node_selector, "node.kubernetes.io/instance-type": instance.name}
    tolerations = worker_tolerations(cluster)
    params = {"num-gpus": str(instance.gpu_count), **kube.worker_ray_start_params}
    return {
        "groupName": WORKER_GROUP,
        "replicas": cluster.num_nodes,
        "minReplicas": cluster.num_nodes,
        "maxReplicas": cluster.num_nodes,
        "rayStartParams": params,
        "template": {
            "metadata": {"labels": _labels(cluster.name)},
            "spec": _pod_spec(cluster, container, volumes, node_selector=node_selector, grace_s=grace_s, tolerations=tolerations),
        },
    }


def _raycluster_spec(cfg: RayftConfig, instance: InstanceType, config_map: str) -> dict[str, Any]:
    cluster = cfg.cluster
    assert cluster is not None
    kube = cluster.kube
    common_env: dict[str, str] = {}
    if (h := hf_home(cluster)) is not None:
        common_env["HF_HOME"] = h
    spec: dict[str, Any] = {"rayVersion": kube.ray_version}
    auth: dict[str, Any] = {"mode": kube.auth}
    if kube.auth == "token" and kube.auth_token_secret:
        auth["secretName"] = kube.auth_token_secret
    spec["authOptions"] = auth
    grace_s = termination_grace_s(cfg.checkpoint.signal_grace_s)
    spec["headGroupSpec"] = _head_group(cluster, config_map, common_env, grace_s)
    spec["workerGroupSpecs"] = [_worker_group(instance, cluster, config_map, common_env, grace_s)]
    return spec


def entrypoint(cfg: RayftConfig) -> str:
    """The RayJob entrypoint: ``rayft train <config path inside the pod>``."""
    assert cfg.cluster is not None
    return f"rayft train {cfg.cluster.kube.config_mount_path}"


def render(cfg: RayftConfig, instance: InstanceType | None = None) -> Manifests:
    """Render every object for ``cfg`` (no checks; see :func:`build`).

    ``instance`` defaults to the shipped catalog's entry for ``cluster.instance_type``.

    Raises:
        ManifestError: the config has no ``cluster:`` section.
        rayft.cluster.instances.UnknownInstanceTypeError: the instance type is not in the catalog.
    """
    if cfg.cluster is None:
        raise ManifestError([("cluster", "the config has no cluster: section; rayft manifest needs one")])
    cluster = cfg.cluster
    kube = cluster.kube
    instance = instance or get_instance(cluster.instance_type)
    name = cluster.name
    labels = _labels(name)
    cm_name = f"{name}-config"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm_name, "namespace": kube.namespace, "labels": labels},
        "data": {"config.yaml": dump_config(cfg)},
    }
    cluster_spec = _raycluster_spec(cfg, instance, cm_name)
    raycluster = {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": kube.namespace, "labels": labels},
        "spec": cluster_spec,
    }
    job_spec: dict[str, Any] = {
        "entrypoint": entrypoint(cfg),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": kube.job_shutdown_after_finishes,
    }
    if kube.job_shutdown_after_finishes:
        job_spec["ttlSecondsAfterFinished"] = kube.job_ttl_seconds_after_finished
    job_spec["backoffLimit"] = kube.job_backoff_limit
    if kube.job_active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = kube.job_active_deadline_seconds
    if kube.runtime_env:
        job_spec["runtimeEnvYAML"] = yaml.safe_dump(kube.runtime_env, sort_keys=False)
    if kube.job_cluster == "embed":
        job_spec["rayClusterSpec"] = copy.deepcopy(cluster_spec)
    else:
        job_spec["clusterSelector"] = {"ray.io/cluster": name}
    rayjob = {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": kube.namespace, "labels": labels},
        "spec": job_spec,
    }
    netpol = _network_policy(cluster) if kube.network_policy else None
    return Manifests(config_map, raycluster, rayjob, netpol, instance)


def _network_policy(cluster: ClusterConfig) -> dict[str, Any]:
    """Ingress to the Ray pods only from each other, plus dashboard/client from the namespace."""
    pods = {"matchLabels": {"app.kubernetes.io/name": "rayft", "app.kubernetes.io/instance": cluster.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{cluster.name}-ray", "namespace": cluster.kube.namespace, "labels": _labels(cluster.name)},
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": pods}]},
                {
                    "from": [{"podSelector": {}}],
                    "ports": [{"protocol": "TCP", "port": 8265}, {"protocol": "TCP", "port": 10001}],
                },
            ],
        },
    }


# --------------------------------------------------------------------------- contradictions


def _container(group: dict[str, Any], name: str) -> dict[str, Any]:
    for c in group["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(name)


def _check_cluster_spec(where: str, spec: dict[str, Any], instance: InstanceType, cfg: RayftConfig) -> list[tuple[str, str]]:
    """Contradictions visible in one rendered RayCluster spec."""
    cluster = cfg.cluster
    assert cluster is not None
    out: list[tuple[str, str]] = []
    head = spec["headGroupSpec"]
    if str(head["rayStartParams"].get("num-gpus")) != "0":
        out.append(
            (
                f"{where}.headGroupSpec.rayStartParams.num-gpus (cluster.kube.head_ray_start_params)",
                f"{head['rayStartParams'].get('num-gpus')}, but the head runs on a CPU node: num-gpus must be 0",
            )
        )
    for i, g in enumerate(spec["workerGroupSpecs"]):
        gw = f"{where}.workerGroupSpecs[{i}]"
        c = _container(g, WORKER_CONTAINER)
        limits = c["resources"].get("limits", {})
        gpu_limit = limits.get(GPU_RESOURCE)
        num_gpus = g["rayStartParams"].get("num-gpus")
        if num_gpus is None or gpu_limit is None or parse_quantity(str(num_gpus)) != parse_quantity(str(gpu_limit)):
            out.append(
                (
                    f"{gw}.rayStartParams.num-gpus (cluster.kube.worker_ray_start_params)",
                    f"num-gpus {num_gpus} != the pod's {GPU_RESOURCE} limit {gpu_limit}: Ray and the kubelet would disagree",
                )
            )
        if gpu_limit is not None and parse_quantity(str(gpu_limit)) > instance.gpu_count:
            out.append((f"{gw}.resources.limits.{GPU_RESOURCE}", f"{gpu_limit} GPUs > {instance.gpu_count} on {instance.name}"))
        efa = limits.get(EFA_RESOURCE)
        if efa is not None and parse_quantity(str(efa)) > instance.max_efa_interfaces:
            out.append(
                (
                    f"{gw}.resources.limits.{EFA_RESOURCE}",
                    f"{efa} EFA interfaces requested; {instance.name} takes at most {instance.max_efa_interfaces}",
                )
            )
        mem = parse_quantity(limits.get("memory", "0"))
        if mem > instance.memory_mib * 2**20:
            out.append(("cluster.kube.worker_memory", f"{limits['memory']} exceeds {instance.name}'s {instance.memory_mib // 1024}Gi"))
        if limits.get("cpu") and parse_quantity(limits["cpu"]) > instance.vcpus:
            out.append(("cluster.kube.worker_cpu", f"{limits['cpu']} CPUs exceed {instance.name}'s {instance.vcpus} vCPUs"))
        for grp_name, grp in (("head", head), ("worker", g)):
            lim = _container(grp, HEAD_CONTAINER if grp is head else WORKER_CONTAINER)["resources"]["limits"].get("memory")
            for v in grp["template"]["spec"]["volumes"]:
                size = v.get("emptyDir", {}).get("sizeLimit")
                if v["name"] == "dshm" and size and lim and parse_quantity(size) > parse_quantity(lim):
                    out.append(("cluster.kube.shm_size", f"/dev/shm {size} exceeds the {grp_name} pod's memory limit {lim}"))
    if spec.get("rayVersion") != cluster.kube.ray_version:
        out.append((f"{where}.rayVersion", f"{spec.get('rayVersion')} != cluster.kube.ray_version {cluster.kube.ray_version}"))
    return out


def check(cfg: RayftConfig, manifests: Manifests) -> list[tuple[str, str]]:
    """Every contradiction between the config, the instance and the rendered objects.

    Returns ``(field, message)`` pairs; empty when consistent. Checked: num-gpus = the GPU limit;
    EFA only on instances with EFA; workers × GPUs per worker = ``train.num_workers`` (world size);
    ``rayVersion`` = the image's Ray; shared storage when there is more than one node; names within
    KubeRay's limits; RayJob fields KubeRay rejects together; resources within the instance.

    Not errors: ``manifests.notes`` (information) and ``manifests.warnings`` (likely failures or risks rayft
    cannot be sure of: an image without rayft and a runtime_env that does not install it, ``auth: disabled``,
    ``run_as_non_root`` with an image whose user the kubelet cannot verify).
    """
    cluster = cfg.cluster
    assert cluster is not None and manifests.instance is not None
    inst = manifests.instance
    kube = cluster.kube
    out: list[tuple[str, str]] = []

    # names
    if not _DNS1035.match(cluster.name):
        out.append(("cluster.name", f"{cluster.name!r} is not a DNS-1035 label (lower case letters, digits, '-'; starts with a letter)"))
    limit = MAX_RAYJOB_NAME
    if len(cluster.name) > limit:
        out.append(("cluster.name", f"{len(cluster.name)} characters; KubeRay allows at most {limit} for a RayJob"))

    # EFA
    if cluster.efa and not inst.efa_supported:
        out.append(("cluster.efa", f"EFA requested but {inst.name} has no EFA interfaces; set cluster.efa: false"))

    # world size
    gpus_per_worker = inst.gpu_count
    world = cluster.num_nodes * gpus_per_worker
    nw = cfg.train.num_workers
    if isinstance(nw, int) and nw != world:
        out.append(
            (
                "train.num_workers",
                f"{nw} != world size {world} ({cluster.num_nodes} nodes × {gpus_per_worker} GPUs of {inst.name})",
            )
        )
    if cfg.train.use_gpu is False:
        out.append(("train.use_gpu", f"false, but the cluster is {world} GPUs of {inst.name}"))

    # Ray version vs image
    image_ray = image_ray_version(kube.image)
    if image_ray is not None and image_ray != kube.ray_version:
        out.append(("cluster.kube.ray_version", f"{kube.ray_version} != Ray {image_ray} inside {kube.image}"))
    elif image_ray is None:
        manifests.notes.append(f"Ray version of image {kube.image} is unknown; rayVersion {kube.ray_version} is not checked")

    # the entrypoint needs rayft inside the pods
    if image_lacks_rayft(kube.image) and not runtime_env_installs_rayft(kube.runtime_env):
        manifests.warnings.append(
            f"the RayJob runs `{entrypoint(cfg)}`, but {kube.image} does not contain rayft and "
            "cluster.kube.runtime_env does not install it, so the job would fail with `rayft: not found`. "
            'Either set cluster.kube.runtime_env: {pip: ["rayft @ <wheel URL or s3:// path>"]} '
            f"(or a pinned version from your index), or build an image FROM {kube.image} with rayft installed "
            "and set cluster.kube.image to it"
        )

    # a non-root pod that the kubelet cannot start: the known images' USER is root (AWS's DLC) or a name (rayproject/ray's `ray`)
    if kube.run_as_non_root and kube.run_as_user is None and image_lacks_rayft(kube.image):
        manifests.warnings.append(
            f"cluster.kube.run_as_non_root: true, but {kube.image} does not run as a numeric non-root user, so the kubelet "
            "would refuse to start its containers; set cluster.kube.run_as_user (1000 is the `ray` user of rayproject/ray)"
        )

    # Ray without authentication
    if kube.auth == "disabled":
        reach = (
            "every pod of the namespace still reaches the dashboard and client ports (cluster.kube.network_policy)"
            if kube.network_policy
            else "set at least cluster.kube.network_policy: true"
        )
        manifests.warnings.append(
            "cluster.kube.auth: disabled: the Ray head accepts jobs, tasks and dashboard requests (ports 8265, 10001, 6379) "
            "from anyone who can reach it, and whatever they submit runs in the pods with their service account and "
            f"storage; keep cluster.kube.auth: token (the default), or {reach}"
        )

    # shared storage
    if cluster.num_nodes > 1:
        sp = cfg.checkpoint.storage_path
        if not is_shared_path(sp, cluster):
            hint = f"under {kube.shared_mount_path} (cluster.kube.fsx_pvc)" if kube.fsx_pvc else "an s3:// URI, or set cluster.kube.fsx_pvc"
            out.append(("checkpoint.storage_path", f"{sp!r} is node-local but the cluster has {cluster.num_nodes} nodes; use {hint}"))
        for i, f in enumerate(cfg.data.train_files):
            if not is_shared_path(f, cluster):
                out.append(
                    (
                        f"data.train_files[{i}]",
                        f"{f!r} is a path on this machine, not visible in the pods; put it on shared storage or use a URI",
                    )
                )
    for i, f in enumerate(cfg.data.train_files):
        if _URI.match(f):
            manifests.notes.append(
                f"data.train_files[{i}]: {f} is a URI; rayft's data reader reads files (put it under {kube.shared_mount_path})"
            )
    if cluster.num_nodes > 1 and hf_home(cluster) is None:
        manifests.notes.append("no shared file system (cluster.kube.fsx_pvc): each pod keeps its own Hugging Face cache")
    if kube.hf_home and not is_shared_path(kube.hf_home, cluster):
        out.append(
            ("cluster.kube.hf_home", f"{kube.hf_home!r} is not on shared storage ({kube.shared_mount_path} with cluster.kube.fsx_pvc)")
        )

    # RayJob rules KubeRay enforces
    if kube.job_cluster == "select":
        if kube.job_shutdown_after_finishes:
            out.append(
                ("cluster.kube.job_shutdown_after_finishes", "must be false with job_cluster: select (the RayCluster is not the job's)")
            )
        if kube.job_backoff_limit > 0:
            out.append(("cluster.kube.job_backoff_limit", "KubeRay rejects backoffLimit > 0 with job_cluster: select"))
    ttl_set = "job_ttl_seconds_after_finished" in kube.model_fields_set
    if not kube.job_shutdown_after_finishes and ttl_set and kube.job_ttl_seconds_after_finished > 0:
        out.append(
            (
                "cluster.kube.job_ttl_seconds_after_finished",
                "KubeRay rejects a TTL when job_shutdown_after_finishes is false; remove it or set it to 0",
            )
        )

    # the rendered objects themselves
    out += _check_cluster_spec(f"RayCluster/{cluster.name}: spec", manifests.raycluster["spec"], inst, cfg)
    if "rayClusterSpec" in manifests.rayjob["spec"]:
        out += _check_cluster_spec(f"RayJob/{cluster.name}: spec.rayClusterSpec", manifests.rayjob["spec"]["rayClusterSpec"], inst, cfg)
    return _dedupe(out)


def _dedupe(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen, out = set(), []
    for it in items:
        if it not in seen:
            seen.add(it)
            out.append(it)
    return out


# --------------------------------------------------------------------------- schema validation


def shared_reference_dir() -> Path:
    """Where the KubeRay CRDs are looked for: $RAYFT_KUBERAY_CRDS, else ../shared/reference/kuberay-v1.7.0."""
    env = os.environ.get("RAYFT_KUBERAY_CRDS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "reference" / f"kuberay-{KUBERAY_CRD_VERSION}"


def _strict(schema: Any) -> Any:
    """Forbid fields a structural schema would silently prune (unknown keys become errors)."""
    if isinstance(schema, dict):
        if "properties" in schema:
            for v in schema["properties"].values():
                _strict(v)
            if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
        for key in ("items", "additionalProperties", "not"):
            if isinstance(schema.get(key), dict):
                _strict(schema[key])
        for key in ("anyOf", "allOf", "oneOf"):
            for v in schema.get(key, []):
                _strict(v)
    return schema


@lru_cache(maxsize=8)
def _crd_validator(path: str, kind: str):
    import jsonschema

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        crd = yaml.load(f, Loader=loader)
    if crd.get("spec", {}).get("names", {}).get("kind") != kind:
        raise ValueError(f"{path} is not the {kind} CRD")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft202012Validator(schema)


def _crd_errors(obj: dict[str, Any], crd_dir: Path) -> list[tuple[str, str]]:
    kind = obj["kind"]
    path = crd_dir / f"ray.io_{kind.lower()}s.yaml"
    validator = _crd_validator(str(path), kind)
    out = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        loc = _jsonpath(e.absolute_path)
        out.append((f"{kind}/{obj['metadata']['name']}: {loc}", f"KubeRay {KUBERAY_CRD_VERSION} CRD: {e.message}"))
    return out


def _jsonpath(path) -> str:
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "<root>"


def kubernetes_version(requested: str) -> str:
    """The Kubernetes version kubernetes-validate checks against: ``requested`` (major.minor) when it
    ships schemas for it, else the nearest it ships."""
    from kubernetes_validate.utils import all_versions

    shipped = all_versions()
    mm = lambda v: tuple(int(x) for x in v.split(".")[:2])  # noqa: E731
    want = mm(requested)
    candidates = [v for v in shipped if mm(v) <= want]
    return candidates[-1] if candidates else shipped[0]


def _k8s_errors(obj: dict[str, Any], where: str, version: str) -> list[tuple[str, str]]:
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError as KVError

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except KVError as e:
        return [(f"{where}: {_jsonpath(e.path)}", f"Kubernetes {e.version} OpenAPI: {e.message}")]
    return []


def _pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if obj["kind"] == "RayCluster":
        spec, prefix = obj["spec"], "spec"
    elif "rayClusterSpec" in obj["spec"]:
        spec, prefix = obj["spec"]["rayClusterSpec"], "spec.rayClusterSpec"
    else:
        return []
    out = [(f"{prefix}.headGroupSpec.template", spec["headGroupSpec"]["template"])]
    for i, g in enumerate(spec.get("workerGroupSpecs", [])):
        out.append((f"{prefix}.workerGroupSpecs[{i}].template", g["template"]))
    return out


def validate(manifests: Manifests, *, kube_version: str = "1.33", crd_dir: Path | None = None) -> list[tuple[str, str]]:
    """Schema problems of every rendered object; empty when all validate.

    Core objects (ConfigMap, NetworkPolicy) and every pod template inside the RayCluster/RayJob are
    checked strictly (unknown fields are errors) against the Kubernetes OpenAPI schema shipped with
    kubernetes-validate (offline), for ``kube_version`` or the nearest shipped. RayCluster and RayJob
    are checked against the KubeRay v1.7.0 CRD schemas in ``crd_dir`` with unknown fields forbidden;
    when ``crd_dir`` is None or missing that step is skipped and a note is added to ``manifests.notes``.

    Raises:
        ValueError: a file in ``crd_dir`` is not the expected CRD.
    """
    version = kubernetes_version(kube_version)
    out: list[tuple[str, str]] = []
    core = [manifests.config_map] + ([manifests.network_policy] if manifests.network_policy else [])
    for obj in core:
        out += _k8s_errors(obj, f"{obj['kind']}/{obj['metadata']['name']}", version)
    for obj in (manifests.raycluster, manifests.rayjob):
        for where, tmpl in _pod_templates(obj):
            pod_template = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "check", "namespace": obj["metadata"]["namespace"]},
                "template": tmpl,
            }
            out += _k8s_errors(pod_template, f"{obj['kind']}/{obj['metadata']['name']}: {where}", version)
    if crd_dir is not None and (crd_dir / "ray.io_rayclusters.yaml").is_file():
        for obj in (manifests.raycluster, manifests.rayjob):
            out += _crd_errors(obj, crd_dir)
    else:
        manifests.notes.append(f"KubeRay CRD validation skipped: no CRDs at {crd_dir}")
    return out


# --------------------------------------------------------------------------- build / write


def build(cfg: RayftConfig, instance: InstanceType | None = None, *, crd_dir: Path | None = None) -> Manifests:
    """Render, check for contradictions, validate. The only entry point that should feed :func:`write`.

    Raises:
        ManifestError: contradictions (each naming its config key) or schema violations.
        rayft.cluster.instances.UnknownInstanceTypeError: ``cluster.instance_type`` is unknown.
    """
    m = render(cfg, instance)
    problems = check(cfg, m)
    if problems:
        raise ManifestError(problems)
    assert cfg.cluster is not None
    problems = validate(m, kube_version=cfg.cluster.aws.kubernetes_version, crd_dir=crd_dir)
    if problems:
        raise ManifestError(problems)
    return m


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(obj: dict[str, Any]) -> str:
    """One object as YAML, keys in rendering order, no anchors/aliases."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=120)


def write(manifests: Manifests, out_dir: str | os.PathLike[str], job_cluster: str, source: str = "") -> list[Path]:
    """Write one YAML file per object to apply (see :meth:`Manifests.to_apply`); returns the paths.

    Raises:
        OSError: the directory cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = f"# Rendered by `rayft manifest`{' from ' + source if source else ''}; edit the config, not this file.\n"
    paths = []
    for fname, obj in manifests.to_apply(job_cluster).items():
        p = out / fname
        p.write_text(header + to_yaml(obj), encoding="utf-8")
        paths.append(p)
    return paths

"""RayCluster and RayJob manifests for any EKS GPU instance type, rendered from the job config.

The path: :func:`render` (config + instance catalog → plain dicts) →
:func:`rayft.cluster.manifest_check.check` (contradictions between the config, the instance and the
rendered objects) → :func:`rayft.cluster.manifest_schema.validate` (Kubernetes OpenAPI via
kubernetes-validate, KubeRay CRD schemas via jsonschema) → :func:`write` (one YAML per object).
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
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rayft.cluster.instances import EFA_RESOURCE, GPU_RESOURCE, InstanceType, get_instance
from rayft.cluster.spec import ClusterConfig
from rayft.cluster.spec_kube import QUANTITY_PATTERN
from rayft.config import RayftConfig
from rayft.config_load import dump_config

RAY_API_VERSION = "ray.io/v1"
KUBERAY_CRD_VERSION = "v1.7.0"
WORKER_GROUP = "gpu-workers"
HEAD_CONTAINER = "ray-head"
WORKER_CONTAINER = "ray-worker"
MAX_RAYCLUSTER_NAME = 53  # KubeRay: 63 - len("-serve-svc")
SHM_CAP_GIB = 200  # Ray caps its default object store at 200 GB; more /dev/shm is never used
HEADROOM_FRACTION = 6  # 1/6 of vCPUs and memory left to kubelet, daemon sets and system pods

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


# --------------------------------------------------------------------------- build / write


def build(cfg: RayftConfig, instance: InstanceType | None = None, *, crd_dir: Path | None = None) -> Manifests:
    """Render, check for contradictions, validate. The only entry point that should feed :func:`write`.

    Raises:
        ManifestError: contradictions (each naming its config key) or schema violations.
        rayft.cluster.instances.UnknownInstanceTypeError: ``cluster.instance_type`` is unknown.
    """
    # the checks import this module's types and constants: imported here, not at the top
    from rayft.cluster.manifest_check import check
    from rayft.cluster.manifest_schema import validate

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

"""Contradictions between a job config, its instance type and the manifests rendered from them
(:func:`check`): each names the config key to change. Run by :func:`rayft.cluster.manifest.build`
before the schema validation.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from rayft.cluster.instances import EFA_RESOURCE, GPU_RESOURCE, InstanceType
from rayft.cluster.manifest import HEAD_CONTAINER, WORKER_CONTAINER, Manifests, entrypoint, hf_home, parse_quantity
from rayft.cluster.spec import ClusterConfig
from rayft.config import RayftConfig

MAX_RAYJOB_NAME = 47  # KubeRay appends 6 characters for the RayCluster it creates
# Ray inside known images; the image tag is checked against cluster.kube.ray_version.
KNOWN_IMAGE_RAY = {
    "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1": "2.58.0",
}
_RAYPROJECT_TAG = re.compile(r"^(?:docker\.io/)?(?:rayproject|anyscale)/ray(?:-ml)?:(\d+\.\d+\.\d+)")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")


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

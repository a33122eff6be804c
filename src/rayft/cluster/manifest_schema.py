"""The rendered manifests against their schemas (:func:`validate`): Kubernetes' OpenAPI through
kubernetes-validate, KubeRay's CRDs through jsonschema (strict: a field the CRD does not know is an
error, not silently pruned). Run by :func:`rayft.cluster.manifest.build` after
:func:`rayft.cluster.manifest_check.check`.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rayft.cluster.manifest import KUBERAY_CRD_VERSION, Manifests


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


def pod_templates(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
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
        for where, tmpl in pod_templates(obj):
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

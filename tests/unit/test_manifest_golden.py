"""Golden files for three instance types, and schema validation of everything rendered.

Each folder under golden/ holds a config.yaml and the expected raycluster.yaml / rayjob.yaml
(plus networkpolicy.yaml when the config asks for one). Regenerate after an intended change with
``RAYFT_UPDATE_GOLDEN=1 pytest tests/unit/test_manifest_golden.py`` and review the diff.

Schema validation uses kubernetes-validate (offline, shipped schemas) and the KubeRay v1.7.0 CRDs
in ../shared/reference/kuberay-v1.7.0; the CRD part skips when that folder is absent.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from rayft.cluster import manifest as M
from rayft.cluster import manifest_check as MC
from rayft.cluster import manifest_schema as MS
from rayft.config_load import load_config

GOLDEN = Path(__file__).resolve().parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "config.yaml").is_file())
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
CRDS = SHARED / "reference" / "kuberay-v1.7.0"
SAMPLE = "g6.12xlarge-sample"
UPDATE = os.environ.get("RAYFT_UPDATE_GOLDEN") == "1"


def crds_or_skip() -> Path:
    if not (CRDS / "ray.io_rayclusters.yaml").is_file():
        pytest.skip(f"KubeRay CRDs not found at {CRDS} (the shared/ folder next to the repository is absent)")
    return CRDS


def render_case(case: str) -> tuple[object, M.Manifests]:
    cfg = load_config(GOLDEN / case / "config.yaml")
    return cfg, M.render(cfg)


def golden_objects(m: M.Manifests) -> dict[str, dict]:
    out = {"raycluster.yaml": m.raycluster, "rayjob.yaml": m.rayjob}
    if m.network_policy is not None:
        out["networkpolicy.yaml"] = m.network_policy
    return out


def test_three_instance_types_are_covered():
    types = {yaml.safe_load((GOLDEN / c / "config.yaml").read_text())["cluster"]["instance_type"] for c in CASES}
    assert len(types) >= 3, types


@pytest.mark.parametrize("case", CASES)
def test_golden(case):
    cfg, m = render_case(case)
    assert MC.check(cfg, m) == []
    for fname, obj in golden_objects(m).items():
        path = GOLDEN / case / fname
        text = M.to_yaml(obj)
        if UPDATE:
            path.write_text(text, encoding="utf-8")
        assert path.is_file(), f"missing golden file {path}; run with RAYFT_UPDATE_GOLDEN=1"
        assert text == path.read_text(encoding="utf-8"), f"{case}/{fname} differs from the golden file"


@pytest.mark.parametrize("case", CASES)
def test_kubernetes_openapi_validation(case):
    cfg, m = render_case(case)
    assert MS.validate(m, kube_version=cfg.cluster.aws.kubernetes_version, crd_dir=None) == []
    assert any("CRD validation skipped" in n for n in m.notes)


@pytest.mark.parametrize("case", CASES)
def test_kuberay_crd_validation(case):
    crds = crds_or_skip()
    cfg, m = render_case(case)
    assert MS.validate(m, kube_version=cfg.cluster.aws.kubernetes_version, crd_dir=crds) == []
    assert M.build(cfg, crd_dir=crds).rayjob == m.rayjob


def test_kubernetes_validation_catches_a_bad_pod_template():
    _, m = render_case(SAMPLE)
    bad = copy.deepcopy(m)
    c = bad.raycluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    c["resources"]["limit"] = c["resources"].pop("limits")  # a typo the API server would prune
    bad.config_map["data"]["n"] = 3
    problems = dict(MS.validate(bad, crd_dir=None))
    assert any(k.endswith("template.spec.containers[0].resources") and "'limit' was unexpected" in v for k, v in problems.items())
    assert "ConfigMap/ray-train-cluster-config: data.n" in problems


def test_crd_validation_catches_unknown_and_mistyped_fields():
    crds = crds_or_skip()
    _, m = render_case(SAMPLE)
    bad = copy.deepcopy(m)
    bad.raycluster["spec"]["workerGroupSpecs"][0]["replica"] = 2
    bad.rayjob["spec"]["backoffLimit"] = "none"
    bad.rayjob["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "password"
    problems = dict(MS.validate(bad, crd_dir=crds))
    assert "'replica' was unexpected" in problems["RayCluster/ray-train-cluster: spec.workerGroupSpecs[0]"]
    assert "not of type 'integer'" in problems["RayJob/ray-train-cluster: spec.backoffLimit"]
    assert "is not one of" in problems["RayJob/ray-train-cluster: spec.rayClusterSpec.authOptions.mode"]


def test_a_mistyped_node_selector_fails_both_schemas():
    crds = crds_or_skip()
    _, m = render_case(SAMPLE)
    m.raycluster["spec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"]["role"] = 7
    where = [k for k, _ in MS.validate(m, crd_dir=crds) if k.startswith("RayCluster/")]
    assert len(where) == 2 and all(k.endswith("nodeSelector.role") for k in where), where

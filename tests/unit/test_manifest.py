"""RayCluster / RayJob rendering: the AWS sample's fields, the additions, and every contradiction."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from rayft.cluster import manifest as M
from rayft.cluster import manifest_check as MC
from rayft.cluster import manifest_schema as MS
from rayft.cluster.instances import get_instance
from rayft.config import ConfigError, RayftConfig
from rayft.config_load import load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "qwen2.5-1.5b-eks.yaml"


def cfg_from(overrides: list[str] | None = None, path: Path = EXAMPLE) -> RayftConfig:
    return load_config(path, overrides or [])


def named(items: list[dict], name: str, key: str = "name") -> dict:
    found = [i for i in items if i.get(key) == name]
    assert found, f"no item with {key}={name!r} in {items}"
    return found[0]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def worker(spec: dict) -> dict:
    return spec["workerGroupSpecs"][0]


def wcontainer(spec: dict) -> dict:
    return named(worker(spec)["template"]["spec"]["containers"], "ray-worker")


def hcontainer(spec: dict) -> dict:
    return named(spec["headGroupSpec"]["template"]["spec"]["containers"], "ray-head")


def problems_of(overrides: list[str], path: Path = EXAMPLE) -> dict[str, str]:
    cfg = cfg_from(overrides, path)
    m = M.render(cfg)
    return {f: msg for f, msg in MC.check(cfg, m)}


# --------------------------------------------------------------------------- the AWS sample

# Every field the sample's manifest/raycluster.yaml sets, with its env.sh values substituted
# (RAY_CLUSTER_NAME=ray-train-cluster, NAMESPACE=ray-train, GPUS_PER_NODE=4, RAY_VERSION=2.58.0).
# docs/manifests.md shows the same table.
SAMPLE_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"


def test_sample_job_matches_every_field_the_sample_sets():
    m = M.render(cfg_from())
    rc = m.raycluster
    assert (rc["apiVersion"], rc["kind"]) == ("ray.io/v1", "RayCluster")
    assert rc["metadata"]["name"] == "ray-train-cluster" and rc["metadata"]["namespace"] == "ray-train"
    spec = rc["spec"]
    assert spec["rayVersion"] == "2.58.0"

    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert head["rayStartParams"]["num-gpus"] == "0"
    hs = head["template"]["spec"]
    assert hs["nodeSelector"] == {"role": "system"}
    hc = hcontainer(spec)
    assert hc["image"] == SAMPLE_IMAGE and hc["imagePullPolicy"] == "Always"
    assert env_of(hc)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert {(p["name"], p["containerPort"]) for p in hc["ports"]} == {("gcs-server", 6379), ("dashboard", 8265), ("client", 10001)}
    assert hc["resources"]["limits"] == {"cpu": "3", "memory": "12Gi"}
    assert hc["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}
    assert named(hc["volumeMounts"], "ray-logs")["mountPath"] == "/tmp/ray"
    # preStop: rayft's runs checkpoint and stop within the grace period (checkpoint.signal_grace_s 25), then Ray stops
    assert hc["lifecycle"]["preStop"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        'rayft stop --wait 25 --reason "preStop of pod $HOSTNAME" || true; ray stop',
    ]
    assert named(hs["volumes"], "ray-logs")["emptyDir"] == {}

    w = worker(spec)
    assert w["groupName"] == "gpu-workers"
    assert (w["replicas"], w["minReplicas"], w["maxReplicas"]) == (2, 2, 2)
    assert w["rayStartParams"]["num-gpus"] == "4"
    ws = w["template"]["spec"]
    assert ws["nodeSelector"]["role"] == "gpu-worker"
    wc = wcontainer(spec)
    assert wc["image"] == SAMPLE_IMAGE and wc["imagePullPolicy"] == "Always"
    env = env_of(wc)
    assert {k: env[k] for k in ("NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "FI_PROVIDER", "NCCL_NET_PLUGIN")} == {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "FI_PROVIDER": "efa",
        "NCCL_NET_PLUGIN": "ofi",
    }
    sample_res = {"nvidia.com/gpu": "4", "vpc.amazonaws.com/efa": "1", "cpu": "40", "memory": "160Gi"}
    assert wc["resources"]["limits"] == sample_res and wc["resources"]["requests"] == sample_res
    assert named(wc["volumeMounts"], "ray-logs")["mountPath"] == "/tmp/ray"
    assert wc["lifecycle"]["preStop"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        'rayft stop --wait 25 --reason "preStop of pod $HOSTNAME" || true; ray stop',
    ]
    assert named(ws["volumes"], "ray-logs")["emptyDir"] == {}


def test_sample_job_additions():
    cfg = cfg_from()
    m = M.render(cfg)
    spec = m.raycluster["spec"]
    head, wc = hcontainer(spec), wcontainer(spec)
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP" and spec["headGroupSpec"]["enableIngress"] is False
    assert spec["authOptions"] == {"mode": "token"}
    assert env_of(wc)["NCCL_SHM_USE_CUDA_MEMCPY"] == "1"  # L4: PCIe, no NVLink
    assert "FI_EFA_USE_DEVICE_RDMA" not in env_of(wc)  # g6 has no GPUDirect RDMA
    ws = worker(spec)["template"]["spec"]
    assert ws["nodeSelector"]["node.kubernetes.io/instance-type"] == "g6.12xlarge"
    assert ws["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert named(ws["volumes"], "dshm")["emptyDir"] == {"medium": "Memory", "sizeLimit": "53Gi"}  # 160Gi / 3
    assert named(spec["headGroupSpec"]["template"]["spec"]["volumes"], "dshm")["emptyDir"]["sizeLimit"] == "4Gi"
    assert named(ws["volumes"], "shared")["persistentVolumeClaim"] == {"claimName": "fsx-claim"}
    for c in (head, wc):
        assert named(c["volumeMounts"], "shared")["mountPath"] == "/fsx"
        assert named(c["volumeMounts"], "rayft-config")["mountPath"] == "/etc/rayft"
        assert env_of(c)["HF_HOME"] == "/fsx/hf-cache"
    assert MC.check(cfg, m) == []


def test_rayjob_embeds_the_cluster_and_runs_rayft_train():
    cfg = cfg_from(["cluster.kube.job_active_deadline_seconds=7200"])
    m = M.render(cfg)
    js = m.rayjob["spec"]
    assert js["entrypoint"] == "rayft train /etc/rayft/config.yaml"
    assert js["shutdownAfterJobFinishes"] is True and js["ttlSecondsAfterFinished"] == 600
    assert js["backoffLimit"] == 0 and js["activeDeadlineSeconds"] == 7200
    assert js["rayClusterSpec"] == m.raycluster["spec"]
    assert set(m.to_apply("embed")) == {"configmap.yaml", "rayjob.yaml"}


def test_rayjob_select_mode():
    cfg = cfg_from(["cluster.kube.job_cluster=select", "cluster.kube.job_shutdown_after_finishes=false"])
    m = M.render(cfg)
    assert m.rayjob["spec"]["clusterSelector"] == {"ray.io/cluster": "ray-train-cluster"}
    assert "rayClusterSpec" not in m.rayjob["spec"] and "ttlSecondsAfterFinished" not in m.rayjob["spec"]
    assert set(m.to_apply("select")) == {"configmap.yaml", "raycluster.yaml", "rayjob.yaml"}
    assert MC.check(cfg, m) == []


def test_config_map_carries_the_resolved_config():
    cfg = cfg_from()
    m = M.render(cfg)
    assert m.config_map["metadata"]["name"] == "ray-train-cluster-config"
    inside = yaml.safe_load(m.config_map["data"]["config.yaml"])
    assert RayftConfig.model_validate(inside) == cfg


def test_p5_renders_32_efa_interfaces_and_gdr():
    cfg = cfg_from(["cluster.instance_type=p5.48xlarge", "train.num_workers=16"])
    m = M.render(cfg)
    wc = wcontainer(m.raycluster["spec"])
    assert wc["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert wc["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert wc["resources"]["limits"]["cpu"] == "160" and wc["resources"]["limits"]["memory"] == "1706Gi"
    env = env_of(wc)
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1" and "NCCL_SHM_USE_CUDA_MEMCPY" not in env
    assert MC.check(cfg, m) == []


@pytest.mark.parametrize("itype", ["g5.12xlarge", "g6e.12xlarge", "g6.12xlarge"])
def test_pcie_gpus_get_shm_cuda_memcpy(itype):
    m = M.render(cfg_from([f"cluster.instance_type={itype}"]))
    assert env_of(wcontainer(m.raycluster["spec"]))["NCCL_SHM_USE_CUDA_MEMCPY"] == "1"


def test_efa_off_drops_the_efa_resource_and_env():
    m = M.render(cfg_from(["cluster.efa=false"]))
    wc = wcontainer(m.raycluster["spec"])
    assert "vpc.amazonaws.com/efa" not in wc["resources"]["limits"]
    assert "FI_PROVIDER" not in env_of(wc) and env_of(wc)["NCCL_SOCKET_IFNAME"] == "eth0"


def test_auth_secret_and_network_policy():
    m = M.render(cfg_from(["cluster.kube.auth_token_secret=my-token", "cluster.kube.network_policy=true"]))
    assert m.raycluster["spec"]["authOptions"] == {"mode": "token", "secretName": "my-token"}
    np_ = m.network_policy
    assert np_ is not None and np_["kind"] == "NetworkPolicy"
    sel = np_["spec"]["podSelector"]["matchLabels"]
    assert sel == {"app.kubernetes.io/name": "rayft", "app.kubernetes.io/instance": "ray-train-cluster"}
    pod_labels = worker(m.raycluster["spec"])["template"]["metadata"]["labels"]
    assert sel.items() <= pod_labels.items()


def test_tolerations_follow_the_gpu_node_group_taints():
    cfg = cfg_from(
        [
            "cluster.aws.gpu_taints=[{key: dedicated, value: training}, {key: efa, effect: NoExecute}]",
            "cluster.kube.worker_tolerations=[{key: spot, effect: NoSchedule}]",
        ]
    )
    ws = worker(M.render(cfg).raycluster["spec"])["template"]["spec"]
    assert ws["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"},
        {"key": "efa", "operator": "Exists", "effect": "NoExecute"},
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_pods_land_on_the_node_groups_rayft_creates():
    """Worker selector/tolerations match the eksctl GPU node group; the head's selector the system group."""
    eks = pytest.importorskip("rayft.cluster.eks_render")
    cfg = cfg_from(["cluster.aws.gpu_labels={team: ml}"])
    m = M.render(cfg)
    ng = eks.render_gpu_nodegroup_config(cfg.cluster, "us-east-2a", None)["managedNodeGroups"][0]
    node_labels = {**ng["labels"], "node.kubernetes.io/instance-type": ng["instanceType"]}
    ws = worker(m.raycluster["spec"])["template"]["spec"]
    assert ws["nodeSelector"].items() <= node_labels.items()
    for taint in ng.get("taints", []):
        assert any(
            t["key"] == taint["key"] and t["effect"] == taint["effect"] and (t["operator"] == "Exists" or t.get("value") == taint["value"])
            for t in ws["tolerations"]
        )
    system = eks.render_cluster_config(cfg.cluster, ["us-east-2a", "us-east-2b"])["managedNodeGroups"][0]
    hs = m.raycluster["spec"]["headGroupSpec"]["template"]["spec"]
    assert hs["nodeSelector"].items() <= system["labels"].items()


def test_worker_overrides():
    m = M.render(cfg_from(["cluster.kube.worker_cpu=44", "cluster.kube.worker_memory=180Gi", "cluster.kube.shm_size=32Gi"]))
    wc = wcontainer(m.raycluster["spec"])
    assert wc["resources"]["limits"]["cpu"] == "44" and wc["resources"]["limits"]["memory"] == "180Gi"
    assert named(worker(m.raycluster["spec"])["template"]["spec"]["volumes"], "dshm")["emptyDir"]["sizeLimit"] == "32Gi"


# --------------------------------------------------------------------------- contradictions (one test each)


def test_contradiction_num_gpus_vs_gpu_limit():
    p = problems_of(["cluster.kube.worker_ray_start_params.num-gpus=2"])
    key = [k for k in p if "rayStartParams.num-gpus" in k]
    assert key and "cluster.kube.worker_ray_start_params" in key[0]
    assert "num-gpus 2 != the pod's nvidia.com/gpu limit 4" in p[key[0]]


def test_contradiction_num_gpus_caught_in_the_rendered_object():
    cfg = cfg_from()
    m = M.render(cfg)
    worker(m.raycluster["spec"])["rayStartParams"]["num-gpus"] = "3"
    assert any("num-gpus 3 != " in msg for _, msg in MC.check(cfg, m))


def test_contradiction_head_with_gpus():
    p = problems_of(["cluster.kube.head_ray_start_params.num-gpus=1"])
    key = [k for k in p if "headGroupSpec.rayStartParams.num-gpus" in k]
    assert key and "cluster.kube.head_ray_start_params" in key[0] and "must be 0" in p[key[0]]


def test_contradiction_efa_on_instance_without_efa():
    p = problems_of(["cluster.instance_type=g6.xlarge", "train.num_workers=2"])
    assert "cluster.efa" in p and "g6.xlarge has no EFA" in p["cluster.efa"]
    assert "cluster.efa" not in problems_of(["cluster.instance_type=g6.xlarge", "train.num_workers=2", "cluster.efa=false"])


def test_contradiction_world_size():
    p = problems_of(["train.num_workers=6"])
    assert p["train.num_workers"] == "6 != world size 8 (2 nodes × 4 GPUs of g6.12xlarge)"
    assert "train.num_workers" not in problems_of(["train.num_workers=auto"])


def test_contradiction_use_gpu_false():
    assert "train.use_gpu" in problems_of(["train.use_gpu=false"])


def test_contradiction_ray_version_vs_image():
    p = problems_of(["cluster.kube.ray_version=2.60.0"])
    assert "cluster.kube.ray_version" in p and "2.58.0" in p["cluster.kube.ray_version"]
    p = problems_of(["cluster.kube.image=rayproject/ray:2.59.1-py311-gpu", "cluster.kube.ray_version=2.58.0"])
    assert "Ray 2.59.1" in p["cluster.kube.ray_version"]
    assert "cluster.kube.ray_version" not in problems_of(["cluster.kube.image=rayproject/ray:2.58.0-gpu"])


def test_unknown_image_is_a_note_not_an_error():
    cfg = cfg_from(["cluster.kube.image=123.dkr.ecr.us-east-1.amazonaws.com/mine:latest"])
    m = M.render(cfg)
    assert MC.check(cfg, m) == []
    assert any("is unknown" in n for n in m.notes)


def test_contradiction_node_local_storage_on_many_nodes():
    p = problems_of(["checkpoint.storage_path=./runs"])
    assert "checkpoint.storage_path" in p and "2 nodes" in p["checkpoint.storage_path"]
    p = problems_of(["cluster.kube.fsx_pvc=null", "checkpoint.storage_path=/fsx/runs"])
    assert "checkpoint.storage_path" in p  # /fsx without the PVC is node-local
    assert "checkpoint.storage_path" not in problems_of(["checkpoint.storage_path=s3://bucket/runs"])
    assert "checkpoint.storage_path" not in problems_of(["checkpoint.storage_path=./runs", "cluster.num_nodes=1", "train.num_workers=4"])


def test_contradiction_local_train_files_on_many_nodes():
    p = problems_of(["data.train_files=/home/me/data.json"])
    assert "data.train_files[0]" in p


def test_contradiction_shm_larger_than_memory():
    p = problems_of(["cluster.kube.shm_size=200Gi"])
    assert "cluster.kube.shm_size" in p and "160Gi" in p["cluster.kube.shm_size"]


def test_contradiction_worker_resources_beyond_the_instance():
    p = problems_of(["cluster.kube.worker_cpu=64", "cluster.kube.worker_memory=256Gi"])
    assert "48 vCPUs" in p["cluster.kube.worker_cpu"] and "192Gi" in p["cluster.kube.worker_memory"]


def test_contradiction_rayjob_select_rules():
    p = problems_of(["cluster.kube.job_cluster=select", "cluster.kube.job_backoff_limit=2"])
    assert "cluster.kube.job_shutdown_after_finishes" in p and "cluster.kube.job_backoff_limit" in p
    p = problems_of(["cluster.kube.job_shutdown_after_finishes=false", "cluster.kube.job_ttl_seconds_after_finished=300"])
    assert "cluster.kube.job_ttl_seconds_after_finished" in p
    assert problems_of(["cluster.kube.job_shutdown_after_finishes=false"]) == {}  # the default TTL is simply not rendered


def test_contradiction_cluster_name():
    assert "cluster.name" in problems_of(["cluster.name=Ray_Train"])
    assert "47" in problems_of(["cluster.name=" + "a" * 48])["cluster.name"]


def test_build_raises_with_every_field_named():
    cfg = cfg_from(["train.num_workers=6", "cluster.kube.ray_version=2.60.0"])
    with pytest.raises(M.ManifestError) as ei:
        M.build(cfg)
    text = str(ei.value)
    assert "train.num_workers" in text and "cluster.kube.ray_version" in text
    assert {f for f, _ in ei.value.problems} >= {"train.num_workers", "cluster.kube.ray_version"}


def test_config_errors_name_the_kube_field():
    from rayft.config import ConfigError

    with pytest.raises(ConfigError, match="cluster.kube.head_memory"):
        cfg_from(["cluster.kube.head_memory=lots"])


def test_no_cluster_section_is_an_error():
    raw = yaml.safe_load(EXAMPLE.read_text())
    del raw["cluster"]
    with pytest.raises(M.ManifestError, match="cluster"):
        M.render(RayftConfig.model_validate(raw))


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "q, v",
    [
        ("4", 4),
        ("500m", Decimal("0.5")),
        ("160Gi", 160 * 2**30),
        ("1e3", 1000),
        ("2k", 2000),
        ("1E3", 1000),
        ("1E", 10**18),
        ("+.5Ki", 512),
        ("3.", 3),
    ],
)
def test_parse_quantity(q, v):
    assert M.parse_quantity(q) == v


def test_one_quantity_pattern_for_the_config_and_the_parser():
    import re

    from rayft.cluster.spec_kube import QUANTITY_PATTERN

    assert M._QTY.pattern == QUANTITY_PATTERN
    for q in ("4", "500m", "160Gi", "1e3", "1E", "12 GB", "1e", "Gi", "-1"):  # both accept exactly the same strings
        assert (re.fullmatch(QUANTITY_PATTERN, q) is not None) == (M._QTY.match(q) is not None), q


def test_parse_quantity_rejects_garbage():
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        M.parse_quantity("12 GB")


def test_worker_resources_leave_a_sixth_for_the_system():
    cfg = cfg_from()
    assert cfg.cluster is not None
    assert M.worker_resources(get_instance("g6e.48xlarge"), cfg.cluster) == {
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "4",
        "cpu": "160",
        "memory": "1280Gi",
    }


def test_kubernetes_version_picks_a_shipped_one():
    assert MS.kubernetes_version("1.33") == "1.33.0"
    newest = MS.kubernetes_version("9.99")
    assert newest.startswith("1.")


def test_cli_writes_the_files(tmp_path):
    from typer.testing import CliRunner

    from rayft.cli import app

    r = CliRunner().invoke(app, ["manifest", str(EXAMPLE), "-o", str(tmp_path), "--no-ec2", "--set", "cluster.kube.network_policy=true"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["configmap.yaml", "networkpolicy.yaml", "rayjob.yaml"]
    job = yaml.safe_load((tmp_path / "rayjob.yaml").read_text())
    assert job["spec"]["entrypoint"] == "rayft train /etc/rayft/config.yaml"


def test_cli_refuses_contradictions_and_writes_nothing(tmp_path):
    from typer.testing import CliRunner

    from rayft.cli import app

    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["manifest", str(EXAMPLE), "-o", str(out), "--no-ec2", "--set", "train.num_workers=5"])
    assert r.exit_code == 1
    assert "train.num_workers" in r.output
    assert not out.exists()


def test_default_image_without_rayft_is_a_warning_with_the_ways_to_provide_it():
    cfg = cfg_from()
    m = M.render(cfg)
    assert MC.check(cfg, m) == []  # a warning, not an error
    [w] = m.warnings
    assert "rayft train /etc/rayft/config.yaml" in w and "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1" in w
    assert "cluster.kube.runtime_env: {pip:" in w and "cluster.kube.image" in w
    assert M.build(cfg, crd_dir=None).warnings == [w]  # build does not refuse it


@pytest.mark.parametrize(
    "overrides",
    [
        ['cluster.kube.runtime_env={"pip": ["rayft @ s3://bucket/rayft-0.1.0-py3-none-any.whl"]}'],
        ['cluster.kube.runtime_env={"uv": ["rayft==0.1.0"]}'],
        ["cluster.kube.image=123456789012.dkr.ecr.us-west-2.amazonaws.com/rayft:0.1.0", "cluster.kube.ray_version=2.58.0"],
    ],
)
def test_no_rayft_warning_when_runtime_env_or_image_provides_it(overrides):
    cfg = cfg_from(overrides)
    m = M.render(cfg)
    MC.check(cfg, m)
    assert m.warnings == []


def test_rayproject_image_without_rayft_warns_too():
    cfg = cfg_from(["cluster.kube.image=rayproject/ray:2.58.0-gpu"])
    m = M.render(cfg)
    MC.check(cfg, m)
    assert len(m.warnings) == 1 and "rayproject/ray:2.58.0-gpu does not contain rayft" in m.warnings[0]


def test_cli_prints_the_rayft_warning_and_still_writes(tmp_path):
    from typer.testing import CliRunner

    from rayft.cli import app

    r = CliRunner().invoke(app, ["manifest", str(EXAMPLE), "-o", str(tmp_path), "--no-ec2"])
    assert r.exit_code == 0, r.output
    assert "warning" in r.output and "does not contain rayft" in " ".join(r.output.split())
    assert (tmp_path / "rayjob.yaml").is_file()


def test_cli_looks_the_instance_up_in_the_clusters_region(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from rayft.cli import app
    from rayft.cluster import instances

    seen = {}

    def fake(name, ec2_client=None, *, region=None):
        seen.update(name=name, region=region)
        return get_instance(name)

    monkeypatch.setattr(instances, "describe_instance_type", fake)
    r = CliRunner().invoke(app, ["manifest", str(EXAMPLE), "-o", str(tmp_path), "--set", "cluster.aws.region=eu-north-1"])
    assert r.exit_code == 0, r.output
    assert seen == {"name": "g6.12xlarge", "region": "eu-north-1"}


def test_notes_for_uri_data_and_a_per_pod_hf_cache():
    cfg = cfg_from(["cluster.kube.fsx_pvc=null", "checkpoint.storage_path=s3://b/runs", "data.train_files=s3://b/d.json"])
    m = M.render(cfg)
    assert MC.check(cfg, m) == []
    assert any(n.startswith("data.train_files[0]: s3://b/d.json is a URI") for n in m.notes)
    assert any("own Hugging Face cache" in n for n in m.notes)
    assert "HF_HOME" not in env_of(wcontainer(m.raycluster["spec"]))


# --------------------------------------------------------------------------- pod security and termination


def containers(obj: dict) -> list[tuple[str, dict]]:
    """(where, container) for every container of every pod template in a RayCluster or RayJob."""
    return [(where, c) for where, tmpl in MS.pod_templates(obj) for c in tmpl["spec"]["containers"]]


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    return [(where, tmpl["spec"]) for where, tmpl in MS.pod_templates(obj)]


def test_every_container_drops_every_capability_but_ipc_lock_on_efa_workers():
    m = M.render(cfg_from())  # job_cluster: embed
    m_select = M.render(cfg_from(["cluster.kube.job_cluster=select", "cluster.kube.job_shutdown_after_finishes=false"]))
    found = containers(m.raycluster) + containers(m.rayjob) + containers(m_select.raycluster)
    assert len(found) == 6
    for where, c in found:
        expected = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        if c["name"] == "ray-worker":
            expected["capabilities"] = {"drop": ["ALL"], "add": ["IPC_LOCK"]}  # EFA: libfabric pins memory
        assert c["securityContext"] == expected, where
    # without EFA no capability is added, not even on the workers
    for where, c in containers(M.render(cfg_from(["cluster.efa=false"])).raycluster):
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}, where


def test_non_root_and_extra_capabilities_are_config_options_and_still_validate():
    cfg = cfg_from(
        [
            "cluster.kube.run_as_non_root=true",
            "cluster.kube.run_as_user=1000",
            "cluster.kube.capabilities_add=[DAC_OVERRIDE, IPC_LOCK]",
            "cluster.kube.image=rayproject/ray:2.58.0-gpu",
            'cluster.kube.runtime_env={"pip": ["rayft==0.1.0"]}',
        ]
    )
    m = M.build(cfg, crd_dir=MS.shared_reference_dir())  # Kubernetes' schema, and KubeRay's CRDs where ../shared has them
    assert m.warnings == []
    spec = m.rayjob["spec"]["rayClusterSpec"]
    assert wcontainer(spec)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK", "DAC_OVERRIDE"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
    }
    assert hcontainer(spec)["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_OVERRIDE", "IPC_LOCK"]}
    with pytest.raises(ConfigError, match=r"cluster.kube.capabilities_add.0 \(from --set\): String should match pattern"):
        cfg_from(["cluster.kube.capabilities_add=[cap_ipc_lock]"])


def test_non_root_with_an_image_whose_user_the_kubelet_cannot_verify_is_a_warning():
    cfg = cfg_from(["cluster.kube.run_as_non_root=true"])
    m = M.render(cfg)
    assert MC.check(cfg, m) == []
    assert [w for w in m.warnings if w.startswith("cluster.kube.run_as_non_root")] == [
        "cluster.kube.run_as_non_root: true, but public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1 does not run as a "
        "numeric non-root user, so the kubelet would refuse to start its containers; set cluster.kube.run_as_user (1000 is the "
        "`ray` user of rayproject/ray)"
    ]


@pytest.mark.parametrize(("grace", "pod_grace"), [(None, 30), ("60", 65), ("12.2", 18)])
def test_every_pod_waits_for_rayfts_stop_before_sigkill(grace, pod_grace):
    cfg = cfg_from([f"checkpoint.signal_grace_s={grace}"] if grace else [])
    m = M.render(cfg)
    specs = pod_specs(m.raycluster) + pod_specs(m.rayjob)
    assert len(specs) == 4
    for where, spec in specs:
        assert spec["terminationGracePeriodSeconds"] == pod_grace, where
    assert MS.validate(m, crd_dir=MS.shared_reference_dir()) == []


def test_auth_disabled_is_a_warning_and_the_cli_prints_it(tmp_path):
    from typer.testing import CliRunner

    from rayft.cli import app

    cfg = cfg_from(["cluster.kube.auth=disabled"])
    m = M.render(cfg)
    assert MC.check(cfg, m) == []
    auth = [w for w in m.warnings if w.startswith("cluster.kube.auth")]
    assert auth == [
        "cluster.kube.auth: disabled: the Ray head accepts jobs, tasks and dashboard requests (ports 8265, 10001, 6379) from anyone "
        "who can reach it, and whatever they submit runs in the pods with their service account and storage; keep "
        "cluster.kube.auth: token (the default), or set at least cluster.kube.network_policy: true"
    ]
    m = M.render(cfg := cfg_from(["cluster.kube.auth=disabled", "cluster.kube.network_policy=true"]))
    MC.check(cfg, m)
    assert any(
        w.endswith("every pod of the namespace still reaches the dashboard and client ports (cluster.kube.network_policy)")
        for w in m.warnings
    )
    m = M.render(cfg := cfg_from())
    MC.check(cfg, m)
    assert not any(w.startswith("cluster.kube.auth") for w in m.warnings)
    r = CliRunner().invoke(app, ["manifest", str(EXAMPLE), "-o", str(tmp_path), "--no-ec2", "--set", "cluster.kube.auth=disabled"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "warning: cluster.kube.auth: disabled: the Ray head accepts jobs" in out
    assert yaml.safe_load((tmp_path / "rayjob.yaml").read_text())["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "disabled"}

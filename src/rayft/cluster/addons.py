"""Cluster add-ons, installed with ``helm upgrade --install`` at pinned chart versions.

- NVIDIA device plugin (advertises ``nvidia.com/gpu``), scheduled on ``role=gpu-worker`` nodes;
  those nodes carry the ``nvidia.com/gpu.present=true`` label its default affinity requires.
- AWS EFA device plugin (advertises ``vpc.amazonaws.com/efa``). eksctl installs its own copy, a
  DaemonSet with the same name, for node groups with ``efaEnabled``; when one that Helm does not
  manage is found, ours is skipped so two never run. The chart only schedules on an explicit
  instance-type allowlist (read from ``helm show values`` at the pinned version); a type outside
  it gets a warning.
- KubeRay operator 1.7.x on the system node group.

Ready means each device-plugin DaemonSet's ready count equals the GPU node count and every GPU
node has its GPUs (and, with EFA, at least one EFA interface) allocatable.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from rayft.cluster.runner import Result, Runner
from rayft.cluster.spec import ClusterConfig

GPU_ROLE = "gpu-worker"
SYSTEM_ROLE = "system"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

NVIDIA_REPO = "https://nvidia.github.io/k8s-device-plugin"
EKS_REPO = "https://aws.github.io/eks-charts"
KUBERAY_REPO = "https://ray-project.github.io/kuberay-helm/"

#: DaemonSet names eksctl uses for the plugins it installs itself.
EKSCTL_NVIDIA_DS = "nvidia-device-plugin-daemonset"
EKSCTL_EFA_DS = "aws-efa-k8s-device-plugin"


@dataclass(frozen=True)
class Chart:
    """One Helm release: what to install, where, with which values."""

    release: str
    chart: str
    repo: str
    version: str
    namespace: str
    daemonset: str | None = None  # the DaemonSet it runs (device plugins)
    create_namespace: bool = False
    set_values: tuple[tuple[str, str], ...] = ()
    set_json: tuple[tuple[str, str], ...] = ()

    def upgrade_argv(self) -> list[str]:
        argv = [
            "helm", "upgrade", "--install", self.release, self.chart,
            "--repo", self.repo, "--version", self.version, "--namespace", self.namespace,
        ]  # fmt: skip
        if self.create_namespace:
            argv.append("--create-namespace")
        for k, v in self.set_values:
            argv += ["--set", f"{k}={v}"]
        for k, v in self.set_json:
            argv += ["--set-json", f"{k}={v}"]
        return argv

    def status_argv(self) -> list[str]:
        return ["helm", "status", self.release, "--namespace", self.namespace, "--output", "json"]

    def uninstall_argv(self) -> list[str]:
        return ["helm", "uninstall", self.release, "--namespace", self.namespace, "--wait"]

    def show_values_argv(self) -> list[str]:
        return ["helm", "show", "values", self.chart, "--repo", self.repo, "--version", self.version]


def _tolerations(cfg: ClusterConfig) -> str:
    tols = [{"key": t.key, "operator": "Exists", "effect": t.effect} for t in cfg.aws.gpu_taints]
    tols.append({"key": "CriticalAddonsOnly", "operator": "Exists"})
    return json.dumps(tols, separators=(",", ":"))


def charts(cfg: ClusterConfig) -> list[Chart]:
    """The add-on releases for ``cfg``, in install order (``down`` removes them in reverse)."""
    v = cfg.aws.charts
    gpu_sel = (("nodeSelector.role", GPU_ROLE),)
    out = [
        Chart(
            "nvidia-device-plugin", "nvidia-device-plugin", NVIDIA_REPO, v.nvidia_device_plugin, "kube-system",
            daemonset="nvidia-device-plugin", set_values=gpu_sel, set_json=(("tolerations", _tolerations(cfg)),),
        ),
    ]  # fmt: skip
    if cfg.efa:
        out.append(
            Chart(
                "aws-efa-k8s-device-plugin", "aws-efa-k8s-device-plugin", EKS_REPO, v.efa_device_plugin, "kube-system",
                daemonset="aws-efa-k8s-device-plugin", set_values=gpu_sel, set_json=(("tolerations", _tolerations(cfg)),),
            )
        )  # fmt: skip
    out.append(
        Chart(
            "kuberay-operator", "kuberay-operator", KUBERAY_REPO, v.kuberay_operator, "kuberay-operator",
            create_namespace=True, set_values=(("nodeSelector.role", SYSTEM_ROLE),),
        )
    )  # fmt: skip
    return out


def kuberay_wait_argv(timeout_s: int = 300) -> list[str]:
    return [
        "kubectl", "wait", "--for=condition=Available", "deployment/kuberay-operator",
        "--namespace", "kuberay-operator", f"--timeout={timeout_s}s",
    ]  # fmt: skip


def daemonset_argv(name: str) -> list[str]:
    return ["kubectl", "get", "daemonset", name, "--namespace", "kube-system", "--output", "json"]


def gpu_nodes_argv() -> list[str]:
    return ["kubectl", "get", "nodes", "--selector", f"role={GPU_ROLE}", "--output", "json"]


# --------------------------------------------------------------------------- probes


def release_state(runner: Runner, chart: Chart) -> tuple[str, str | None]:
    """(status, deployed chart version) of a release; ("absent", None) when Helm has none."""
    res = runner.run(chart.status_argv(), check=False)
    if not res.ok:
        return "absent", None
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError:
        return "unknown", None
    status = (doc.get("info") or {}).get("status", "unknown")
    version = ((doc.get("chart") or {}).get("metadata") or {}).get("version")
    return status, version


def _json_or_none(res: Result) -> dict[str, Any] | None:
    if not res.ok:
        return None
    try:
        return json.loads(res.stdout)
    except json.JSONDecodeError:
        return None


def foreign_daemonset(runner: Runner, name: str) -> dict[str, Any] | None:
    """The DaemonSet ``name`` in kube-system when it exists and Helm does not manage it (eksctl's)."""
    ds = _json_or_none(runner.run(daemonset_argv(name), check=False))
    if ds is None:
        return None
    meta = ds.get("metadata") or {}
    helm = (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "Helm" or "meta.helm.sh/release-name" in (
        meta.get("annotations") or {}
    )
    return None if helm else ds


def efa_allowlist(runner: Runner, chart: Chart) -> list[str] | None:
    """Instance types the EFA chart (at its pinned version) schedules on; None when unknown."""
    res = runner.run(chart.show_values_argv(), check=False)
    if not res.ok:
        return None
    try:
        values = yaml.safe_load(res.stdout) or {}
    except yaml.YAMLError:
        return None
    got = (values.get("supportedInstanceLabels") or {}).get("values")
    return list(got) if isinstance(got, list) else None


@dataclass
class NodeResources:
    name: str
    instance_type: str
    gpus: int
    efa: int


def gpu_node_resources(runner: Runner) -> list[NodeResources]:
    doc = _json_or_none(runner.run(gpu_nodes_argv(), check=False)) or {}
    return [_node_resources(n) for n in doc.get("items", [])]


def _node_resources(n: dict[str, Any]) -> NodeResources:
    alloc = (n.get("status") or {}).get("allocatable") or {}
    labels = (n.get("metadata") or {}).get("labels") or {}
    return NodeResources(
        name=(n.get("metadata") or {}).get("name", "?"),
        instance_type=labels.get("node.kubernetes.io/instance-type", "?"),
        gpus=int(alloc.get(GPU_RESOURCE, 0) or 0),
        efa=int(alloc.get(EFA_RESOURCE, 0) or 0),
    )


@dataclass
class Readiness:
    ready: bool
    daemonsets: dict[str, int] = field(default_factory=dict)  # name -> numberReady
    nodes: list[NodeResources] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_ready(runner: Runner, daemonsets: list[str], gpu_nodes: int, gpus_per_node: int, efa: bool) -> Readiness:
    """Ready: every DaemonSet ready on all GPU nodes; every GPU node has its GPUs (and EFA) allocatable."""
    r = Readiness(ready=True)
    for name in daemonsets:
        ds = _json_or_none(runner.run(daemonset_argv(name), check=False))
        n = int(((ds or {}).get("status") or {}).get("numberReady", 0) or 0)
        r.daemonsets[name] = n
        if n < gpu_nodes:
            r.ready = False
            r.problems.append(f"DaemonSet {name}: {n}/{gpu_nodes} ready")
    r.nodes = gpu_node_resources(runner)
    if len(r.nodes) < gpu_nodes:
        r.ready = False
        r.problems.append(f"{len(r.nodes)}/{gpu_nodes} GPU nodes registered")
    for node in r.nodes:
        if node.gpus < gpus_per_node:
            r.ready = False
            r.problems.append(f"{node.name}: {GPU_RESOURCE} allocatable {node.gpus}, want {gpus_per_node}")
        if efa and node.efa < 1:
            r.ready = False
            r.problems.append(f"{node.name}: {EFA_RESOURCE} allocatable {node.efa}, want ≥ 1")
    return r


# --------------------------------------------------------------------------- install / remove


@dataclass
class AddonOutcome:
    installed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # release -> why
    warnings: list[str] = field(default_factory=list)
    device_plugin_daemonsets: list[str] = field(default_factory=list)


def install_addons(
    runner: Runner, cfg: ClusterConfig, say: Callable[[str], None] = lambda s: None
) -> AddonOutcome:
    """Install or upgrade each chart unless it is already deployed at the pinned version."""
    out = AddonOutcome()
    for chart in charts(cfg):
        if chart.daemonset:
            eksctl_name = EKSCTL_EFA_DS if chart.release == "aws-efa-k8s-device-plugin" else EKSCTL_NVIDIA_DS
            if foreign_daemonset(runner, eksctl_name) is not None:
                why = f"DaemonSet kube-system/{eksctl_name} already runs, installed outside Helm (by eksctl)"
                out.skipped[chart.release] = why
                out.device_plugin_daemonsets.append(eksctl_name)
                say(f"{chart.release}: skipped, {why}; two copies must never run")
                continue
            out.device_plugin_daemonsets.append(chart.daemonset)
        status, version = release_state(runner, chart)
        if status == "deployed" and version == chart.version:
            out.unchanged.append(chart.release)
            say(f"{chart.release}: deployed at {version} (unchanged)")
            continue
        if chart.release == "aws-efa-k8s-device-plugin":
            allow = efa_allowlist(runner, chart)
            if allow is None:
                out.warnings.append(f"could not read the EFA chart's instance-type allowlist ({shlex.join(chart.show_values_argv())})")
            elif cfg.instance_type not in allow:
                out.warnings.append(
                    f"{cfg.instance_type} is not in the allowlist of aws-efa-k8s-device-plugin {chart.version}: "
                    f"its DaemonSet will not schedule there and {EFA_RESOURCE} stays 0"
                )
        if status != "absent":
            say(f"{chart.release}: {status} at {version}, upgrading to {chart.version}")
        runner.run(chart.upgrade_argv())
        if chart.release == "kuberay-operator":
            runner.run(kuberay_wait_argv())
        out.installed.append(chart.release)
    for w in out.warnings:
        say(f"warning: {w}")
    return out


def uninstall_addons(runner: Runner, cfg: ClusterConfig, say: Callable[[str], None] = lambda s: None) -> list[str]:
    """Remove the Helm releases ``up`` installed, in reverse order; returns the commands run."""
    ran = []
    for chart in reversed(charts(cfg)):
        status, _ = release_state(runner, chart)
        if status == "absent":
            say(f"{chart.release}: not installed")
            continue
        runner.run(chart.uninstall_argv())
        ran.append(shlex.join(chart.uninstall_argv()))
    return ran

"""Cluster add-ons, installed with ``helm upgrade --install`` at pinned chart versions.

- NVIDIA device plugin (advertises ``nvidia.com/gpu``), scheduled on ``role=gpu-worker`` nodes;
  those nodes carry the ``nvidia.com/gpu.present=true`` label its default affinity requires.
- AWS EFA device plugin (advertises ``vpc.amazonaws.com/efa``). eksctl installs its own copy for
  node groups with ``efaEnabled``: the DaemonSet ``kube-system/aws-efa-k8s-device-plugin-daemonset``
  (eksctl's pkg/addons/assets/efa-device-plugin.yaml). A device-plugin DaemonSet that Helm does not
  manage is recognised by its name, its pod label ``name`` or its container image
  (:data:`EKSCTL_EFA`, :data:`EKSCTL_NVIDIA`); when one is found, our chart is skipped so two never
  run. The chart only schedules on an explicit instance-type allowlist (read from
  ``helm show values`` at the pinned version); a type outside it gets a warning.
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

from rayft.cluster.instances import EFA_RESOURCE, GPU_RESOURCE, UnknownInstanceTypeError, get_instance
from rayft.cluster.runner import Result, Runner
from rayft.cluster.spec import ClusterConfig

GPU_ROLE = "gpu-worker"
SYSTEM_ROLE = "system"

NVIDIA_REPO = "https://nvidia.github.io/k8s-device-plugin"
EKS_REPO = "https://aws.github.io/eks-charts"
KUBERAY_REPO = "https://ray-project.github.io/kuberay-helm/"


@dataclass(frozen=True)
class PluginSignature:
    """How a device-plugin DaemonSet installed outside Helm (by eksctl, or by hand) is recognised.

    Any one of: its name is in ``names``; its pod template's ``name`` label is ``pod_label``; a
    container image's repository (the last path part, without tag or digest) is ``image``.
    """

    names: tuple[str, ...]
    pod_label: str
    image: str

    def matches(self, ds: dict[str, Any]) -> bool:
        """True when the DaemonSet object ``ds`` (kubectl's JSON) is this plugin."""
        meta = ds.get("metadata") or {}
        if meta.get("name") in self.names:
            return True
        tmpl = (ds.get("spec") or {}).get("template") or {}
        if ((tmpl.get("metadata") or {}).get("labels") or {}).get("name") == self.pod_label:
            return True
        containers = (tmpl.get("spec") or {}).get("containers") or []
        return any(_image_repo(c.get("image", "")) == self.image for c in containers)


def _image_repo(image: str) -> str:
    """``602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.3.3`` → ``aws-efa-k8s-device-plugin``."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


#: eksctl's own plugins (eksctl-io/eksctl pkg/addons/assets/{efa,nvidia}-device-plugin.yaml): the
#: EFA DaemonSet is ``aws-efa-k8s-device-plugin-daemonset`` (pods labelled
#: ``name=aws-efa-k8s-device-plugin``); the NVIDIA one ``nvidia-device-plugin-daemonset``. The EFA
#: chart's own DaemonSet name ``aws-efa-k8s-device-plugin`` is recognised too (e.g. applied from a
#: rendered chart without Helm).
EKSCTL_EFA = PluginSignature(
    names=("aws-efa-k8s-device-plugin-daemonset", "aws-efa-k8s-device-plugin"),
    pod_label="aws-efa-k8s-device-plugin",
    image="aws-efa-k8s-device-plugin",
)
EKSCTL_NVIDIA = PluginSignature(
    names=("nvidia-device-plugin-daemonset",),
    pod_label="nvidia-device-plugin-ds",
    image="k8s-device-plugin",
)
EFA_RELEASE = "aws-efa-k8s-device-plugin"


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
            "helm",
            "upgrade",
            "--install",
            self.release,
            self.chart,
            "--repo",
            self.repo,
            "--version",
            self.version,
            "--namespace",
            self.namespace,
        ]
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
            "nvidia-device-plugin",
            "nvidia-device-plugin",
            NVIDIA_REPO,
            v.nvidia_device_plugin,
            "kube-system",
            daemonset="nvidia-device-plugin",
            set_values=gpu_sel,
            set_json=(("tolerations", _tolerations(cfg)),),
        ),
    ]
    if cfg.efa:
        out.append(
            Chart(
                EFA_RELEASE,
                "aws-efa-k8s-device-plugin",
                EKS_REPO,
                v.efa_device_plugin,
                "kube-system",
                daemonset="aws-efa-k8s-device-plugin",
                set_values=gpu_sel,
                set_json=(("tolerations", _tolerations(cfg)),),
            )
        )
    out.append(
        Chart(
            "kuberay-operator",
            "kuberay-operator",
            KUBERAY_REPO,
            v.kuberay_operator,
            "kuberay-operator",
            create_namespace=True,
            set_values=(("nodeSelector.role", SYSTEM_ROLE),),
        )
    )
    return out


def kuberay_wait_argv(timeout_s: int = 300) -> list[str]:
    """``kubectl wait`` until the KubeRay operator Deployment is Available (``timeout_s`` seconds)."""
    return [
        "kubectl",
        "wait",
        "--for=condition=Available",
        "deployment/kuberay-operator",
        "--namespace",
        "kuberay-operator",
        f"--timeout={timeout_s}s",
    ]


def daemonset_argv(name: str) -> list[str]:
    """``kubectl get daemonset NAME`` in kube-system, as JSON (readiness of one plugin)."""
    return ["kubectl", "get", "daemonset", name, "--namespace", "kube-system", "--output", "json"]


def daemonsets_argv() -> list[str]:
    """``kubectl get daemonsets`` in kube-system, as JSON (to find plugins installed outside Helm)."""
    return ["kubectl", "get", "daemonsets", "--namespace", "kube-system", "--output", "json"]


def gpu_nodes_argv() -> list[str]:
    """``kubectl get nodes`` of the GPU node group (label ``role=gpu-worker``), as JSON."""
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


def _helm_managed(ds: dict[str, Any]) -> bool:
    meta = ds.get("metadata") or {}
    return (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "Helm" or "meta.helm.sh/release-name" in (
        meta.get("annotations") or {}
    )


def kube_system_daemonsets(runner: Runner) -> list[dict[str, Any]] | None:
    """Every DaemonSet in kube-system (kubectl JSON items); None when kubectl could not list them."""
    doc = _json_or_none(runner.run(daemonsets_argv(), check=False))
    return None if doc is None else list(doc.get("items") or [])


def foreign_daemonset(daemonsets: list[dict[str, Any]], plugin: PluginSignature) -> dict[str, Any] | None:
    """The first DaemonSet of ``daemonsets`` that is ``plugin`` and that Helm does not manage (eksctl's)."""
    for ds in daemonsets:
        if not _helm_managed(ds) and plugin.matches(ds):
            return ds
    return None


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
    """One node's allocatable GPUs and EFA interfaces (counts)."""

    name: str
    instance_type: str
    gpus: int
    efa: int


def gpu_node_resources(runner: Runner) -> list[NodeResources]:
    """Allocatable GPUs/EFA of every GPU node (none when kubectl fails)."""
    doc = _json_or_none(runner.run(gpu_nodes_argv(), check=False)) or {}
    return [node_resources(n) for n in doc.get("items", [])]


def node_resources(n: dict[str, Any]) -> NodeResources:
    """Name, instance type and allocatable ``nvidia.com/gpu`` / ``vpc.amazonaws.com/efa`` of one node (kubectl JSON)."""
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
    """The outcome of :func:`check_ready`; ``problems`` says what is missing when not ready."""

    ready: bool
    daemonsets: dict[str, int] = field(default_factory=dict)  # name -> numberReady
    nodes: list[NodeResources] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check_ready(runner: Runner, daemonsets: list[str], gpu_nodes: int, gpus_per_node: int, efa: bool) -> Readiness:
    """Ready: every DaemonSet ready on all GPU nodes; every GPU node has its GPUs allocatable and, with
    ``efa``, all its EFA interfaces (the instance catalog's count for the node's type; at least one
    for a type not in the catalog)."""
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
        want = _efa_wanted(node.instance_type) if efa else 0
        if node.efa < want:
            r.ready = False
            if want == 1:
                r.problems.append(f"{node.name}: {EFA_RESOURCE} allocatable {node.efa}, want ≥ 1")
            else:  # a p5.48xlarge offering 1 of its 32 EFA interfaces runs NCCL on a fraction of its network
                r.problems.append(f"{node.name}: {EFA_RESOURCE} allocatable {node.efa}, want {want} (all of {node.instance_type}'s)")
    return r


def _efa_wanted(instance_type: str) -> int:
    """EFA interfaces a GPU node of ``instance_type`` should offer: the catalog's count, else at least one."""
    try:
        return max(1, get_instance(instance_type).max_efa_interfaces)
    except UnknownInstanceTypeError:
        return 1


# --------------------------------------------------------------------------- install / remove


@dataclass
class AddonOutcome:
    """What :func:`install_addons` did per release, and the device-plugin DaemonSets to wait for."""

    installed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # release -> why
    warnings: list[str] = field(default_factory=list)
    device_plugin_daemonsets: list[str] = field(default_factory=list)


def install_addons(runner: Runner, cfg: ClusterConfig, say: Callable[[str], None] = lambda s: None) -> AddonOutcome:
    """Install or upgrade each chart of :func:`charts` unless it is already deployed at the pinned version.

    A device-plugin chart is skipped when the same plugin already runs outside Helm (eksctl's; see
    :data:`EKSCTL_EFA`), so two copies never run; :attr:`AddonOutcome.device_plugin_daemonsets`
    then names that DaemonSet for the readiness check. A type outside the EFA chart's allowlist
    gives a warning (also passed to ``say``), not an error.

    Raises:
        rayft.cluster.runner.CommandError: a ``helm upgrade --install`` or ``kubectl wait`` failed.
    """
    out = AddonOutcome()
    existing: list[dict[str, Any]] | None = None
    for chart in charts(cfg):
        if chart.daemonset:
            if existing is None:
                existing = kube_system_daemonsets(runner)
                if existing is None:
                    out.warnings.append(
                        f"could not list DaemonSets in kube-system ({shlex.join(daemonsets_argv())}); "
                        "a device plugin installed outside Helm would not be noticed"
                    )
                    existing = []
            plugin = EKSCTL_EFA if chart.release == EFA_RELEASE else EKSCTL_NVIDIA
            found = foreign_daemonset(existing, plugin)
            if found is not None:
                name = (found.get("metadata") or {}).get("name", "?")
                why = f"DaemonSet kube-system/{name} already runs, installed outside Helm (by eksctl)"
                out.skipped[chart.release] = why
                out.device_plugin_daemonsets.append(name)
                say(f"{chart.release}: skipped, {why}; two copies must never run")
                continue
            out.device_plugin_daemonsets.append(chart.daemonset)
        status, version = release_state(runner, chart)
        if status == "deployed" and version == chart.version:
            out.unchanged.append(chart.release)
            say(f"{chart.release}: deployed at {version} (unchanged)")
            continue
        if chart.release == EFA_RELEASE:
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

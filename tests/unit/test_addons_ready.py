"""The add-ons' readiness check counts every EFA interface the node's instance type has (issue 20):
a p5.48xlarge offering 1 of its 32 is not ready. kubectl's answers are given as the JSON it prints."""

from __future__ import annotations

import json

from rayft.cluster.addons import check_ready, daemonset_argv, gpu_nodes_argv
from rayft.cluster.runner import Result


class Kubectl:
    """Answers `kubectl get nodes` and `kubectl get daemonset` with fixed JSON."""

    def __init__(self, nodes: list[tuple[str, str, int, int]]):
        self.nodes = nodes

    def run(self, argv, *, check=True, stream=False):
        argv = tuple(argv)
        if list(argv) == gpu_nodes_argv():
            items = [
                {
                    "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": itype}},
                    "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)}},
                }
                for name, itype, gpus, efa in self.nodes
            ]
            return Result(argv, 0, json.dumps({"items": items}))
        if list(argv) == daemonset_argv(argv[3]):
            return Result(argv, 0, json.dumps({"status": {"numberReady": len(self.nodes)}}))
        return Result(argv, 1, "", "unexpected")


def test_every_efa_interface_of_the_type_is_wanted():
    nodes = [("gpu-a", "p5.48xlarge", 8, 32), ("gpu-b", "p5.48xlarge", 8, 1)]
    r = check_ready(Kubectl(nodes), ["aws-efa-k8s-device-plugin"], 2, 8, efa=True)
    assert not r.ready
    assert r.problems == ["gpu-b: vpc.amazonaws.com/efa allocatable 1, want 32 (all of p5.48xlarge's)"]
    # one interface is all a g6.12xlarge has; a type the catalog lacks needs at least one
    assert check_ready(Kubectl([("gpu-c", "g6.12xlarge", 4, 1)]), [], 1, 4, efa=True).ready
    r = check_ready(Kubectl([("gpu-d", "x9.metal", 4, 0)]), [], 1, 4, efa=True)
    assert r.problems == ["gpu-d: vpc.amazonaws.com/efa allocatable 0, want ≥ 1"]
    assert check_ready(Kubectl(nodes), [], 2, 8, efa=False).ready  # without EFA, not counted

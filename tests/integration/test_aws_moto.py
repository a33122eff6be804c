"""Cluster lifecycle against the moto server (a real HTTP AWS API emulator on a loopback port
the OS assigns when it binds: port 0, read back from the server).

AWS state (EKS clusters and node groups, CloudFormation stacks, VPC subnets, instances, quotas)
lives in moto and is read by the code under test through boto3 over HTTP. eksctl, helm and kubectl
are never run: a recorder stands in for them, records every command line and, like eksctl would,
creates or deletes the matching resources in moto through the AWS API.

What moto cannot express is set on its in-process backend (the server runs in this process):
a CloudFormation stack in ROLLBACK_COMPLETE, an EKS cluster in CREATING/DELETING. moto 5.2.5 has
no EC2 Service Quotas (service-quotas knows only `vpc`), so quota values come from a botocore
Stubber on the service-quotas client only; the "quota unavailable" path runs on moto as it is.
moto has no capacity-reservation API either: where `down`'s leftover check needs one, that single
call is answered on the client (:func:`_with_capacity_reservations`), never left to moto's failure.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber
from typer.testing import CliRunner

from rayft.cluster import capacity as cap
from rayft.cluster import eks, eks_down, eks_plan, eks_probes, eks_render
from rayft.cluster.runner import Result
from rayft.cluster.spec import ClusterConfig

pytestmark = pytest.mark.integration

ACCOUNT = "123456789012"
REGION = "us-west-2"
TRIVIAL_TEMPLATE = json.dumps({"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}}})


# --------------------------------------------------------------------------- the moto server


@pytest.fixture(scope="module")
def moto_url():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # port 0: the OS picks a free port when the server binds (no pick-free-rebind race)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    assert port != 0
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(moto_url, monkeypatch):
    """Fake credentials, every boto3 client pointed at the moto server, state reset per test."""
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")).read()
    return moto_url


_SHARED: list = []


def _clients():
    """One client factory for the module (the server URL and fake credentials never change)."""
    if not _SHARED:
        _SHARED.append(cap.boto3_clients())
    return _SHARED[0]


def _recording(factory, calls: list[str]):
    """``factory`` with fresh clients that record every AWS operation as ``service:Operation``."""
    cache = {}

    def record(model, **kw):
        calls.append(f"{model.service_model.service_name}:{model.name}")

    def get(service, region):
        if (service, region) not in cache:
            base = factory(service, region)
            client = base if service == "service-quotas" else boto3.session.Session().client(service, region_name=region)
            client.meta.events.register_first("before-call.*.*", record)
            cache[(service, region)] = client
        return cache[(service, region)]

    return get


def _quota_factory(value: float | None, code: str = "L-DB2E81BA"):
    """boto3 clients on moto, except service-quotas: a Stubber answering GetServiceQuota with ``value``."""
    real = _clients()
    sq = boto3.client("service-quotas", region_name=REGION, endpoint_url="http://127.0.0.1:9")
    stub = Stubber(sq)
    for _ in range(10):
        stub.add_response(
            "get_service_quota",
            {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}},
            {"ServiceCode": "ec2", "QuotaCode": code},
        )
    stub.activate()
    return lambda service, region: sq if service == "service-quotas" else real(service, region)


def _with_capacity_reservations(factory, reservations: list[dict], calls: list[dict]):
    """``factory``, but its EC2 client answers DescribeCapacityReservations itself with ``reservations``.

    Everything else still goes to moto. (moto 5.2.5 implements no capacity-reservation API; the
    test must not depend on how it fails.) Each call's parameters are appended to ``calls``.
    """
    ec2 = boto3.session.Session().client("ec2", region_name=REGION)

    def params(params, **kw):
        calls.append(params)

    def answer(**kw):  # botocore: an answer from a before-call handler replaces the HTTP request
        return AWSResponse(f"{REGION}/stubbed", 200, {}, None), {"CapacityReservations": reservations}

    ec2.meta.events.register("provide-client-params.ec2.DescribeCapacityReservations", params)
    ec2.meta.events.register("before-call.ec2.DescribeCapacityReservations", answer)
    return lambda service, region: ec2 if service == "ec2" else factory(service, region)


def _backend(service: str):
    if service == "eks":
        from moto.eks.models import eks_backends

        return eks_backends[ACCOUNT][REGION]
    from moto.cloudformation.models import cloudformation_backends

    return cloudformation_backends[ACCOUNT][REGION]


def _set_stack(name: str, status: str, reason: str | None = None) -> None:
    for st in _backend("cloudformation").stacks.values():
        if st.name == name:
            st.status = status
            if reason:
                st._add_stack_event("CREATE_FAILED", resource_status_reason=reason)
            return
    raise KeyError(name)


# --------------------------------------------------------------------------- eksctl / helm / kubectl stand-in


class World:
    """Records every command; does to moto what eksctl would, and answers helm/kubectl like a cluster."""

    def __init__(self, no_capacity_azs=(), gpus=4, efa=1):
        self.calls: list[list[str]] = []
        self.no_capacity_azs = set(no_capacity_azs)
        self.releases: dict[str, str] = {}  # release -> chart version
        self.eksctl_efa_plugin = False
        self.gpu_nodes = 0
        self.gpus, self.efa = gpus, efa
        self.rendered: dict[str, str] = {}
        c = _clients()
        self.ec2, self.eks, self.cfn = c("ec2", REGION), c("eks", REGION), c("cloudformation", REGION)

    # the Runner protocol
    def run(self, argv, *, check=True, stream=False):
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        res = self._dispatch(argv)
        if check and not res.ok:
            from rayft.cluster.runner import CommandError

            raise CommandError(res)
        return res

    @property
    def lines(self) -> list[str]:
        return [shlex.join(c) for c in self.calls]

    @property
    def mutating(self) -> list[str]:
        read_only = (("helm", "status"), ("helm", "show"), ("kubectl", "get"), ("kubectl", "wait"), ("eksctl", "utils"))
        return [shlex.join(c) for c in self.calls if tuple(c[:2]) not in read_only]

    def _ok(self, argv, out=""):
        return Result(tuple(argv), 0, out, "")

    def _fail(self, argv, err):
        return Result(tuple(argv), 1, "", err)

    def _dispatch(self, a):
        if a[:3] == ["eksctl", "create", "cluster"]:
            return self._create_cluster(a)
        if a[:3] == ["eksctl", "create", "nodegroup"]:
            return self._create_nodegroup(a)
        if a[:3] == ["eksctl", "delete", "nodegroup"]:
            name, ng = a[a.index("--cluster") + 1], a[a.index("--name") + 1]
            self.eks.delete_nodegroup(clusterName=name, nodegroupName=ng)
            self.cfn.delete_stack(StackName=f"eksctl-{name}-nodegroup-{ng}")
            return self._ok(a)
        if a[:3] == ["eksctl", "delete", "cluster"]:
            name = a[a.index("--name") + 1]
            self.eks.delete_cluster(name=name)
            self.cfn.delete_stack(StackName=f"eksctl-{name}-cluster")
            return self._ok(a)
        if a[:3] == ["eksctl", "utils", "write-kubeconfig"]:
            return self._ok(a)
        if a[:2] == ["helm", "status"]:
            rel = a[2]
            if rel not in self.releases:
                return self._fail(a, "Error: release: not found")
            return self._ok(a, json.dumps({"info": {"status": "deployed"}, "chart": {"metadata": {"version": self.releases[rel]}}}))
        if a[:3] == ["helm", "upgrade", "--install"]:
            self.releases[a[3]] = a[a.index("--version") + 1]
            return self._ok(a)
        if a[:2] == ["helm", "uninstall"]:
            self.releases.pop(a[2], None)
            return self._ok(a)
        if a[:3] == ["helm", "show", "values"]:
            return self._ok(a, yaml.safe_dump({"supportedInstanceLabels": {"values": ["g6.12xlarge", "p5.48xlarge"]}}))
        if a[:3] == ["kubectl", "get", "daemonsets"]:
            return self._ok(a, json.dumps({"items": self._daemonsets()}))
        if a[:3] == ["kubectl", "get", "daemonset"]:
            return self._daemonset(a)
        if a[:3] == ["kubectl", "get", "nodes"]:
            return self._ok(a, json.dumps({"items": self._nodes(a)}))
        if a[:3] == ["kubectl", "get", "rayclusters.ray.io"]:
            return self._ok(
                a, json.dumps({"items": [{"metadata": {"namespace": "default", "name": "rayft"}, "status": {"state": "ready"}}]})
            )
        if a[:2] == ["kubectl", "wait"]:
            return self._ok(a)
        raise AssertionError(f"unexpected command: {shlex.join(a)}")

    def _doc(self, a):
        path = a[a.index("--config-file") + 1]
        text = Path(path).read_text()
        self.rendered[Path(path).name] = text
        return yaml.safe_load(text)

    def _create_cluster(self, a):
        doc = self._doc(a)
        name = doc["metadata"]["name"]
        vpc = self.ec2.create_vpc(CidrBlock="192.168.0.0/16")["Vpc"]["VpcId"]
        ids = []
        for i, az in enumerate(doc["availabilityZones"]):
            pub = self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"192.168.{i * 32}.0/20", AvailabilityZone=az)["Subnet"]["SubnetId"]
            self.ec2.create_tags(Resources=[pub], Tags=[{"Key": "kubernetes.io/role/elb", "Value": "1"}])
            self.ec2.modify_subnet_attribute(SubnetId=pub, MapPublicIpOnLaunch={"Value": True})
            prv = self.ec2.create_subnet(VpcId=vpc, CidrBlock=f"192.168.{i * 32 + 16}.0/20", AvailabilityZone=az)["Subnet"]["SubnetId"]
            self.ec2.create_tags(Resources=[prv], Tags=[{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}])
            ids += [pub, prv]
        tags = doc["metadata"].get("tags") or {}  # eksctl puts metadata.tags on the cluster and its stacks
        self.eks.create_cluster(
            name=name,
            version=doc["metadata"]["version"],
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/eks",
            resourcesVpcConfig={"subnetIds": ids},
            tags=tags,
        )
        self.cfn.create_stack(
            StackName=f"eksctl-{name}-cluster", TemplateBody=TRIVIAL_TEMPLATE, Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
        )
        for ng in doc.get("managedNodeGroups", []):
            self._make_nodegroup(name, ng)
        return self._ok(a)

    def _private_subnet(self, cluster, az):
        return eks_probes.cluster_private_subnets(self.eks, self.ec2, cluster)[az]

    def _make_nodegroup(self, cluster, ng):
        if "subnets" in ng:
            subnets = ng["subnets"]
        else:
            subnets = [
                self._private_subnet(cluster, z)
                for z in ng.get("availabilityZones") or sorted(eks_probes.cluster_private_subnets(self.eks, self.ec2, cluster))
            ]
        az = self.ec2.describe_subnets(SubnetIds=subnets)["Subnets"][0]["AvailabilityZone"]
        stack = f"eksctl-{cluster}-nodegroup-{ng['name']}"
        self.cfn.create_stack(StackName=stack, TemplateBody=TRIVIAL_TEMPLATE)
        if az in self.no_capacity_azs and ng["name"] == "gpu-workers":
            _set_stack(
                stack,
                "ROLLBACK_COMPLETE",
                f'Resource handler returned message: "InsufficientInstanceCapacity: We currently do not have sufficient {ng["instanceType"]} capacity in {az}"',
            )
            return False
        self.eks.create_nodegroup(
            clusterName=cluster,
            nodegroupName=ng["name"],
            nodeRole=f"arn:aws:iam::{ACCOUNT}:role/ng",
            subnets=subnets,
            instanceTypes=[ng["instanceType"]],
            labels=ng.get("labels", {}),
            scalingConfig={"minSize": ng["minSize"], "maxSize": ng["maxSize"], "desiredSize": ng["desiredCapacity"]},
        )
        if ng.get("efaEnabled"):
            self.eksctl_efa_plugin = True  # eksctl installs its own EFA device plugin
        if ng["name"] == "gpu-workers":
            self.gpu_nodes = ng["desiredCapacity"]
        return True

    def _create_nodegroup(self, a):
        doc = self._doc(a)
        include = next(x.split("=", 1)[1] for x in a if x.startswith("--include="))
        ng = next(n for n in doc["managedNodeGroups"] if n["name"] == include)
        if self._make_nodegroup(doc["metadata"]["name"], ng):
            return self._ok(a)
        return Result(tuple(a), 1, "Error: waiter state transitioned to Failure; InsufficientInstanceCapacity\n", "")

    def _daemonsets(self):
        """kube-system's DaemonSets: eksctl's EFA plugin (as eksctl names it) and the Helm releases'."""
        ready = {"status": {"numberReady": self.gpu_nodes}}
        out = []
        if self.eksctl_efa_plugin:  # eksctl-io/eksctl pkg/addons/assets/efa-device-plugin.yaml
            out.append(
                {
                    "metadata": {"name": "aws-efa-k8s-device-plugin-daemonset", "namespace": "kube-system"},
                    "spec": {
                        "template": {
                            "metadata": {"labels": {"name": "aws-efa-k8s-device-plugin"}},
                            "spec": {
                                "containers": [
                                    {
                                        "name": "aws-efa-k8s-device-plugin",
                                        "image": "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.3.3",
                                    },
                                ]
                            },
                        }
                    },
                    **ready,
                }
            )
        for rel in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
            if rel in self.releases:
                out.append(
                    {
                        "metadata": {
                            "name": rel,
                            "namespace": "kube-system",
                            "labels": {"app.kubernetes.io/managed-by": "Helm"},
                            "annotations": {"meta.helm.sh/release-name": rel},
                        },
                        **ready,
                    }
                )
        return out

    def _daemonset(self, a):
        name = a[3]
        for ds in self._daemonsets():
            if ds["metadata"]["name"] == name:
                return self._ok(a, json.dumps(ds))
        return self._fail(a, f'Error from server (NotFound): daemonsets.apps "{name}" not found')

    def _nodes(self, a):
        gpu = [
            {
                "metadata": {"name": f"gpu-{i}", "labels": {"role": "gpu-worker", "node.kubernetes.io/instance-type": "g6.12xlarge"}},
                "status": {"allocatable": {"nvidia.com/gpu": str(self.gpus), "vpc.amazonaws.com/efa": str(self.efa)}},
            }
            for i in range(self.gpu_nodes)
        ]
        if "--selector" in a:
            return gpu
        system = {
            "metadata": {"name": "sys-0", "labels": {"role": "system", "node.kubernetes.io/instance-type": "m7i.xlarge"}},
            "status": {"allocatable": {}},
        }
        return [system, *gpu]


# --------------------------------------------------------------------------- helpers


def _cfg(**aws) -> ClusterConfig:
    base = {"region": REGION, "availability_zones": ["us-west-2a", "us-west-2b", "us-west-2c"]}
    return ClusterConfig.model_validate({"name": "rayft", "instance_type": "g6.12xlarge", "num_nodes": 2, "aws": {**base, **aws}})


def _ctx(cfg, world, tmp_path, clients=None, confirm=None, sleep=None, messages=None):
    msgs = messages if messages is not None else []
    return eks.Context(
        cfg=cfg,
        runner=world,
        clients=clients or _quota_factory(192.0),
        say=msgs.append,
        confirm=confirm or (lambda q: msgs.append(f"? {q}") or True),
        sleep=sleep or (lambda s: None),
        workdir=tmp_path / "work",
        poll_s=1,
    )


@pytest.fixture
def tools_present(monkeypatch):
    monkeypatch.setattr(eks, "missing_tools", lambda tools=(): [])


# --------------------------------------------------------------------------- capacity on moto


def test_offerings_and_running_usage_from_moto(aws):
    c = _clients()
    ec2 = c("ec2", REGION)
    assert cap.offered_azs(ec2, "g6.12xlarge") == ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]
    shape = cap.describe_shape(ec2, "g6.12xlarge")
    assert (shape.vcpus, shape.gpus, shape.efa_supported, shape.max_efa_interfaces) == (48, 4, True, 1)
    ami = "ami-12c6146b"
    ec2.run_instances(ImageId=ami, MinCount=2, MaxCount=2, InstanceType="g5.12xlarge")  # 2 × 48 vCPUs
    ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge")  # another family
    stopped = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][0]["InstanceId"]
    ec2.stop_instances(InstanceIds=[stopped])  # not running: not counted
    assert cap.vcpus_in_use(ec2, cap.quota_family("g6.12xlarge"), spot=False) == 96
    assert cap.vcpus_in_use(ec2, cap.quota_family("p5.48xlarge"), spot=False) == 96
    rep = cap.find_capacity(_quota_factory(200.0), "g6.12xlarge", 2, [REGION], availability_zones=["us-west-2b", "us-west-2a"])
    assert [(x.az, x.used_vcpus, x.headroom, x.quota_ok) for x in rep.ranked()] == [
        ("us-west-2b", 96, 104.0, True),
        ("us-west-2a", 96, 104.0, True),
    ]


def test_configured_az_that_does_not_offer_the_type(aws):
    rep = cap.find_capacity(_quota_factory(500.0), "g6.12xlarge", 1, [REGION], availability_zones=["us-west-2z", "us-west-2c"])
    assert [(x.az, x.verdict) for x in rep.ranked()] == [("us-west-2c", "quota ok"), ("us-west-2z", "not offered")]


def test_moto_has_no_ec2_quotas_so_headroom_is_unknown(aws):
    rep = cap.find_capacity(_clients(), "g6.12xlarge", 2, [REGION])
    assert {x.verdict for x in rep.candidates} == {"quota unknown"}
    assert all(x.quota.value is None and x.quota.source == "unavailable" for x in rep.candidates)
    assert rep.usable() and rep.quota_commands == []
    assert "could not read quota L-DB2E81BA" in rep.notes[0]


def test_capacity_cli_prints_the_quota_increase_for_a_zero_quota(aws, monkeypatch, tmp_path):
    from rayft.cli import app

    factory = _quota_factory(0.0)
    monkeypatch.setattr(cap, "boto3_clients", lambda: factory)
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({"data": {"train_files": ["x.jsonl"]}, "cluster": {"num_nodes": 2, "aws": {"region": REGION}}}))
    res = CliRunner().invoke(app, ["capacity", str(f)])
    assert res.exit_code == 1
    assert (
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA "
        "--desired-value 96 --region us-west-2\n"
    ) in res.stdout


# --------------------------------------------------------------------------- state probes and waits


def test_state_probes(aws):
    c = _clients()
    e, cfn = c("eks", REGION), c("cloudformation", REGION)
    assert eks_probes.cluster_status(e, "nope") == eks_probes.NOT_FOUND
    assert eks_probes.nodegroup_status(e, "nope", "ng") == eks_probes.NOT_FOUND
    assert eks_probes.stack_status(cfn, "eksctl-nope-cluster") == eks_probes.NOT_FOUND
    e.create_cluster(name="c1", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    assert eks_probes.cluster_status(e, "c1") == "ACTIVE"
    cfn.create_stack(StackName="eksctl-c1-nodegroup-gpu-workers", TemplateBody=TRIVIAL_TEMPLATE)
    assert eks_probes.stack_status(cfn, "eksctl-c1-nodegroup-gpu-workers") == "CREATE_COMPLETE"
    _set_stack("eksctl-c1-nodegroup-gpu-workers", "ROLLBACK_COMPLETE", "InsufficientInstanceCapacity in us-west-2a")
    assert eks_probes.stack_status(cfn, "eksctl-c1-nodegroup-gpu-workers") == "ROLLBACK_COMPLETE"
    assert any("InsufficientInstanceCapacity" in r for r in eks_probes.stack_failure_reasons(cfn, "eksctl-c1-nodegroup-gpu-workers"))
    cfn.delete_stack(StackName="eksctl-c1-nodegroup-gpu-workers")
    assert eks_probes.stack_status(cfn, "eksctl-c1-nodegroup-gpu-workers") == eks_probes.NOT_FOUND


def test_creating_cluster_is_waited_for_then_reused(aws, tmp_path):
    c = _clients()
    c("eks", REGION).create_cluster(name="rayft", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    cluster = _backend("eks").clusters["rayft"]
    cluster.status = "CREATING"
    polls = []

    def sleep(s):
        polls.append(s)
        if len(polls) == 3:
            cluster.status = "ACTIVE"

    world, msgs = World(), []
    ctx = _ctx(_cfg(), world, tmp_path, sleep=sleep, messages=msgs)
    result = eks.UpResult()
    eks.ensure_cluster(ctx, lambda: ["us-west-2a", "us-west-2b"], result)
    assert polls == [1, 1, 1] and result.reused == ["cluster"] and world.calls == []
    assert msgs.count("cluster rayft is CREATING; waiting") == 3


def test_deleting_cluster_is_waited_for_then_created(aws, tmp_path):
    c = _clients()
    c("eks", REGION).create_cluster(name="rayft", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    _backend("eks").clusters["rayft"].status = "DELETING"
    world = World()
    ctx = _ctx(_cfg(), world, tmp_path, sleep=lambda s: _backend("eks").clusters.pop("rayft", None))
    result = eks.UpResult()
    eks.ensure_cluster(ctx, lambda: ["us-west-2a", "us-west-2b"], result)
    assert result.created[0] == "cluster"
    assert world.lines == [f"eksctl create cluster --config-file {tmp_path}/work/eksctl-cluster.yaml --install-nvidia-plugin=false"]
    assert eks_probes.cluster_status(c("eks", REGION), "rayft") == "ACTIVE"


def test_wait_times_out_with_a_resume_hint(aws, tmp_path):
    c = _clients()
    c("eks", REGION).create_cluster(name="rayft", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    _backend("eks").clusters["rayft"].status = "UPDATING"
    ctx = _ctx(_cfg(wait_timeout_minutes=1), World(), tmp_path)
    with pytest.raises(eks.LifecycleError, match="still UPDATING after 1 min; re-run"):
        eks.ensure_cluster(ctx, lambda: [], eks.UpResult())


def test_failed_cluster_is_explained_and_recreated_on_confirmation(aws, tmp_path):
    _clients()("eks", REGION).create_cluster(name="rayft", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    _backend("eks").clusters["rayft"].status = "FAILED"
    world, msgs = World(), []
    result = eks.UpResult()
    eks.ensure_cluster(_ctx(_cfg(), world, tmp_path, messages=msgs), lambda: ["us-west-2a", "us-west-2b"], result)
    assert "? Delete the failed cluster rayft (eksctl delete cluster) and create it again?" in msgs
    assert world.mutating == [
        "eksctl delete cluster --name rayft --region us-west-2 --wait",
        f"eksctl create cluster --config-file {tmp_path}/work/eksctl-cluster.yaml --install-nvidia-plugin=false",
    ]
    assert result.created == ["cluster", "nodegroup/system"]


def test_addon_at_another_version_is_upgraded_and_efa_allowlist_is_checked(aws, tmp_path):
    from rayft.cluster import addons

    cfg = ClusterConfig.model_validate({"instance_type": "g5.48xlarge", "aws": {"region": REGION}})
    world, msgs = World(), []
    world.releases = {"nvidia-device-plugin": "0.17.0", "kuberay-operator": "1.7.0"}
    out = addons.install_addons(world, cfg, say=msgs.append)
    assert out.installed == ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"] and out.unchanged == ["kuberay-operator"]
    assert "nvidia-device-plugin: deployed at 0.17.0, upgrading to 0.20.0" in msgs
    assert world.releases["nvidia-device-plugin"] == "0.20.0"
    assert out.warnings == [
        "g5.48xlarge is not in the allowlist of aws-efa-k8s-device-plugin v0.5.32: its DaemonSet will not "
        "schedule there and vpc.amazonaws.com/efa stays 0"
    ]


# --------------------------------------------------------------------------- up, twice, and down


def test_up_from_nothing_runs_exactly_the_plan_and_a_second_up_is_a_no_op(aws, tmp_path, tools_present):
    cfg = _cfg()
    world, msgs, aws_calls = World(), [], []
    result = eks.up(_ctx(cfg, world, tmp_path, messages=msgs, clients=_recording(_quota_factory(192.0), aws_calls)))
    work = tmp_path / "work"
    assert result.created == ["cluster", "nodegroup/system", "nodegroup/gpu-workers"]
    assert result.gpu_az == "us-west-2a"
    # every command up ran that changes something is printed, verbatim, by plan
    plan_text = eks_plan.render_plan(eks_plan.plan(cfg, work))
    assert world.mutating == [
        f"eksctl create cluster --config-file {work}/eksctl-cluster.yaml --install-nvidia-plugin=false",
        f"eksctl create nodegroup --config-file {work}/eksctl-gpu-nodegroup.yaml --include=gpu-workers --install-nvidia-plugin=false",
        "helm upgrade --install nvidia-device-plugin nvidia-device-plugin --repo https://nvidia.github.io/k8s-device-plugin "
        "--version 0.20.0 --namespace kube-system --set nodeSelector.role=gpu-worker --set-json "
        '\'tolerations=[{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"},{"key":"CriticalAddonsOnly","operator":"Exists"}]\'',
        "helm upgrade --install kuberay-operator kuberay-operator --repo https://ray-project.github.io/kuberay-helm/ "
        "--version 1.7.0 --namespace kuberay-operator --create-namespace --set nodeSelector.role=system",
    ]
    for line in world.mutating + [
        "kubectl wait --for=condition=Available deployment/kuberay-operator --namespace kuberay-operator --timeout=300s"
    ]:
        assert f"  run     {line}" in plan_text
    for line in world.lines:  # the read-only commands too
        assert line in plan_text, line
    # and every AWS call up made is named by plan
    assert {"sts:GetCallerIdentity", "eks:DescribeCluster", "ec2:DescribeSubnets", "service-quotas:GetServiceQuota"} <= set(aws_calls)
    for call in set(aws_calls):
        assert call in plan_text, call
    # eksctl installed the EFA plugin for the efaEnabled group: ours is skipped, never two
    assert "aws-efa-k8s-device-plugin" not in world.releases
    assert result.addons.skipped["aws-efa-k8s-device-plugin"].startswith(
        "DaemonSet kube-system/aws-efa-k8s-device-plugin-daemonset already runs"
    )
    assert result.addons.device_plugin_daemonsets == ["nvidia-device-plugin", "aws-efa-k8s-device-plugin-daemonset"]
    assert "kubectl get daemonset aws-efa-k8s-device-plugin-daemonset --namespace kube-system --output json" in world.lines
    # the GPU group was pinned to the cluster's private subnet in the chosen AZ
    gpu_doc = yaml.safe_load(world.rendered["eksctl-gpu-nodegroup.yaml"])["managedNodeGroups"][0]
    c = _clients()
    private = eks_probes.cluster_private_subnets(c("eks", REGION), c("ec2", REGION), "rayft")
    assert gpu_doc["subnets"] == [private["us-west-2a"]] and "availabilityZones" not in gpu_doc
    assert gpu_doc["efaEnabled"] is True and gpu_doc["labels"]["nvidia.com/gpu.present"] == "true"
    assert gpu_doc["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    cluster_doc = yaml.safe_load(world.rendered["eksctl-cluster.yaml"])
    assert cluster_doc["availabilityZones"] == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert cluster_doc["managedNodeGroups"][0]["instanceType"] == "m7i.xlarge"
    assert "gpu-0: 4 GPU, 1 EFA allocatable" in msgs

    # second up: only probes, nothing created, nothing installed
    world2 = World()
    world2.releases, world2.eksctl_efa_plugin, world2.gpu_nodes = dict(world.releases), True, 2
    second = eks.up(_ctx(cfg, world2, tmp_path, clients=_clients(), messages=(m2 := [])))
    assert world2.mutating == []
    assert not second.changed and second.created == []
    assert second.reused == ["cluster", "nodegroup/system", "nodegroup/gpu-workers"]
    assert sorted(second.addons.unchanged) == ["kuberay-operator", "nvidia-device-plugin"]
    assert m2[-1] == "nothing to do: everything already matches the config"


def test_insufficient_capacity_in_first_az_moves_to_the_next(aws, tmp_path, tools_present):
    cfg = _cfg()
    world, msgs = World(no_capacity_azs={"us-west-2a"}), []
    result = eks.up(_ctx(cfg, world, tmp_path, messages=msgs))
    assert result.gpu_az == "us-west-2b"
    assert result.skipped_azs == {"us-west-2a": "InsufficientInstanceCapacity"}
    creates = [l for l in world.lines if l.startswith("eksctl create nodegroup")]
    assert len(creates) == 2
    assert "no capacity for 2 × g6.12xlarge in us-west-2a; moving to the next AZ" in msgs
    assert "deleted stack eksctl-rayft-nodegroup-gpu-workers" in msgs  # our own failed stack, no question asked
    assert not any(m.startswith("? ") for m in msgs)
    c = _clients()
    ng = c("eks", REGION).describe_nodegroup(clusterName="rayft", nodegroupName="gpu-workers")["nodegroup"]
    sub = c("ec2", REGION).describe_subnets(SubnetIds=ng["subnets"])["Subnets"][0]
    assert ng["status"] == "ACTIVE" and sub["AvailabilityZone"] == "us-west-2b"


def test_no_capacity_anywhere_leaves_no_failed_stack(aws, tmp_path, tools_present):
    world = World(no_capacity_azs={"us-west-2a", "us-west-2b", "us-west-2c"})
    with pytest.raises(eks.LifecycleError, match="no capacity for 2 × g6.12xlarge in any candidate AZ"):
        eks.up(_ctx(_cfg(), world, tmp_path))
    assert eks_probes.stack_status(_clients()("cloudformation", REGION), "eksctl-rayft-nodegroup-gpu-workers") == eks_probes.NOT_FOUND


def _cluster_only(tmp_path):
    """A cluster with its system group, made by a first eksctl run, and nothing else."""
    world = World()
    ctx = _ctx(_cfg(), world, tmp_path)
    eks.ensure_cluster(ctx, lambda: ["us-west-2a", "us-west-2b"], eks.UpResult())
    _clients()("cloudformation", REGION).create_stack(StackName="eksctl-rayft-nodegroup-gpu-workers", TemplateBody=TRIVIAL_TEMPLATE)
    _set_stack("eksctl-rayft-nodegroup-gpu-workers", "ROLLBACK_COMPLETE", "InsufficientInstanceCapacity (a previous attempt)")


def test_rollback_complete_nodegroup_stack_is_explained_and_removed_on_confirmation(aws, tmp_path, tools_present):
    _cluster_only(tmp_path)
    world, msgs = World(), []
    result = eks.up(_ctx(_cfg(), world, tmp_path, messages=msgs))
    assert "? Delete stack eksctl-rayft-nodegroup-gpu-workers (ROLLBACK_COMPLETE) now?" in msgs
    explained = next(m for m in msgs if m.startswith("CloudFormation stack eksctl-rayft-nodegroup-gpu-workers is ROLLBACK_COMPLETE"))
    assert "InsufficientInstanceCapacity (a previous attempt)" in explained
    assert result.created == ["nodegroup/gpu-workers"] and result.reused == ["cluster", "nodegroup/system"]
    assert world.mutating[0].startswith("eksctl create nodegroup")


def test_rollback_complete_stack_kept_when_not_confirmed(aws, tmp_path, tools_present):
    _cluster_only(tmp_path)
    world = World()
    with pytest.raises(eks.LifecycleError) as ei:
        eks.up(_ctx(_cfg(), world, tmp_path, confirm=lambda q: False))
    assert "aws cloudformation delete-stack --stack-name eksctl-rayft-nodegroup-gpu-workers --region us-west-2" in str(ei.value)
    assert world.mutating == []
    assert eks_probes.stack_status(_clients()("cloudformation", REGION), "eksctl-rayft-nodegroup-gpu-workers") == "ROLLBACK_COMPLETE"


def test_quota_of_zero_stops_up_before_anything_is_created(aws, tmp_path, tools_present):
    world = World()
    with pytest.raises(eks.LifecycleError) as ei:
        eks.up(_ctx(_cfg(), world, tmp_path, clients=_quota_factory(0.0)))
    assert (
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA --desired-value 96 --region us-west-2"
    ) in str(ei.value)
    assert world.calls == []
    assert eks_probes.cluster_status(_clients()("eks", REGION), "rayft") == eks_probes.NOT_FOUND


def test_missing_tools_and_credentials_are_reported_before_anything_starts(aws, tmp_path, monkeypatch):
    monkeypatch.setattr(eks, "missing_tools", lambda tools=(): ["eksctl", "helm"])
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    world = World()
    with pytest.raises(eks.LifecycleError) as ei:
        eks.up(_ctx(_cfg(), world, tmp_path, clients=cap.boto3_clients()))
    msg = str(ei.value)
    assert "missing tools: eksctl, helm" in msg and "AWS credentials not usable" in msg
    assert world.calls == []


def test_down_reverses_up_and_reports_tagged_leftovers(aws, tmp_path, tools_present):
    cfg = _cfg()
    world = World()
    eks.up(_ctx(cfg, world, tmp_path))
    c = _clients()
    ec2 = c("ec2", REGION)
    stray = ec2.run_instances(
        ImageId="ami-12c6146b",
        MinCount=1,
        MaxCount=1,
        InstanceType="g6.12xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "rayft.io/cluster", "Value": "rayft"}]}],
    )
    stray_id = stray["Instances"][0]["InstanceId"]
    ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType="g6.12xlarge")  # someone else's
    world.calls.clear()
    cr_calls: list[dict] = []
    reservation = {"CapacityReservationId": "cr-0tagged", "InstanceType": "g6.12xlarge", "State": "active"}
    clients = _with_capacity_reservations(_quota_factory(192.0), [reservation], cr_calls)
    left, errors = eks_down.down(_ctx(cfg, world, tmp_path, clients=clients))
    assert world.mutating == [
        "helm uninstall kuberay-operator --namespace kuberay-operator --wait",
        "helm uninstall nvidia-device-plugin --namespace kube-system --wait",
        "eksctl delete nodegroup --cluster rayft --region us-west-2 --name gpu-workers --wait",
        "eksctl delete nodegroup --cluster rayft --region us-west-2 --name system --wait",
        "eksctl delete cluster --name rayft --region us-west-2 --wait",
    ]
    assert (
        [t for k, t in eks_plan.plan_down(cfg) if k == "run" and t.startswith(("helm uninstall", "eksctl delete"))]
        == [
            "helm uninstall kuberay-operator --namespace kuberay-operator --wait",
            "helm uninstall aws-efa-k8s-device-plugin --namespace kube-system --wait",  # only when Helm has it
            *world.mutating[1:],
        ]
    )
    assert eks_probes.cluster_status(c("eks", REGION), "rayft") == eks_probes.NOT_FOUND
    for stack in ("eksctl-rayft-cluster", "eksctl-rayft-nodegroup-system", "eksctl-rayft-nodegroup-gpu-workers"):
        assert eks_probes.stack_status(c("cloudformation", REGION), stack) == eks_probes.NOT_FOUND
    assert [(x.kind, x.id, x.detail) for x in left] == [
        ("instance", stray_id, "g6.12xlarge"),
        ("capacity-reservation", "cr-0tagged", "g6.12xlarge"),
    ]
    assert errors == []
    # asked by each ownership tag, only for reservations that bill
    assert cr_calls[0]["Filters"] == [
        {"Name": "tag:rayft.io/cluster", "Values": ["rayft"]},
        {"Name": "state", "Values": ["active", "pending"]},
    ]
    assert len(cr_calls) == 4


def test_a_leftover_check_that_cannot_run_is_reported_not_skipped(aws, tmp_path, tools_present):
    ec2 = boto3.session.Session().client("ec2", region_name=REGION)

    def refuse(**kw):
        raise cap.ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "DescribeCapacityReservations")

    ec2.meta.events.register("before-call.ec2.DescribeCapacityReservations", refuse)
    base = _quota_factory(192.0)
    left, errors = eks_down.leftovers(_ctx(_cfg(), World(), tmp_path, clients=lambda s, r: ec2 if s == "ec2" else base(s, r)))
    assert left == []
    assert errors == [
        "capacity-reservation: ClientError: An error occurred (UnauthorizedOperation) when calling "
        "the DescribeCapacityReservations operation: no"
    ]


def test_placement_group_created_once_and_deleted(tmp_path, monkeypatch):
    """moto 5.2.5 has no placement-group API, so this path runs against a Stubber."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url="http://127.0.0.1:9")
    stub = Stubber(ec2)
    flt = {"Filters": [{"Name": "group-name", "Values": ["rayft-rayft-gpu-workers"]}]}
    stub.add_response("describe_placement_groups", {"PlacementGroups": []}, flt)
    stub.add_response(
        "create_placement_group",
        {},
        {
            "GroupName": "rayft-rayft-gpu-workers",
            "Strategy": "cluster",
            "TagSpecifications": [{"ResourceType": "placement-group", "Tags": [{"Key": "rayft.io/cluster", "Value": "rayft"}]}],
        },
    )
    stub.add_response(
        "describe_placement_groups", {"PlacementGroups": [{"GroupName": "rayft-rayft-gpu-workers", "State": "available"}]}, flt
    )
    stub.add_response("delete_placement_group", {}, {"GroupName": "rayft-rayft-gpu-workers"})
    stub.activate()
    cfg = _cfg(placement_group=True)
    ctx = _ctx(cfg, World.__new__(World), tmp_path, clients=lambda s, r: ec2)
    first, second = eks.UpResult(), eks.UpResult()
    eks.ensure_placement_group(ctx, first)
    eks.ensure_placement_group(ctx, second)
    eks_down.delete_placement_group(ctx)
    stub.assert_no_pending_responses()
    assert first.created == ["placement-group/rayft-rayft-gpu-workers"] and second.reused == ["placement-group/rayft-rayft-gpu-workers"]
    gpu = eks_render.render_gpu_nodegroup_config(
        cfg.model_copy(update={"aws": cfg.aws.model_copy(update={"capacity_reservation_id": "cr-0abc"})}), "us-west-2a", "subnet-1"
    )
    ng = gpu["managedNodeGroups"][0]
    assert ng["placement"] == {"groupName": "rayft-rayft-gpu-workers"}
    assert ng["capacityReservation"] == {"capacityReservationTarget": {"capacityReservationID": "cr-0abc"}}
    assert ng["subnets"] == ["subnet-1"]


def test_down_of_nothing_is_quiet(aws, tmp_path, tools_present):
    world, msgs = World(), []
    left, _ = eks_down.down(_ctx(_cfg(), world, tmp_path, messages=msgs))
    assert world.calls == [] and left == []
    assert "cluster rayft: not found" in msgs


def test_status_reports_nodes_rayclusters_and_cost(aws, tmp_path, tools_present):
    from rayft.cluster.instances import get_instance

    cfg = _cfg()
    world = World()
    eks.up(_ctx(cfg, world, tmp_path))
    st = eks.status(_ctx(cfg, world, tmp_path))
    assert st.cluster == "ACTIVE" and st.nodegroups == {"system": "ACTIVE", "gpu-workers": "ACTIVE"}
    assert [(n["name"], n["gpus"], n["efa"]) for n in st.nodes] == [("sys-0", 0, 0), ("gpu-0", 4, 1), ("gpu-1", 4, 1)]
    assert st.rayclusters == [{"namespace": "default", "name": "rayft", "state": "ready"}]
    assert st.hourly_usd == pytest.approx(2 * get_instance("g6.12xlarge").on_demand_usd_per_hour)
    assert st.unpriced == ["m7i.xlarge"]


def test_plan_cli_prints_the_sample_sequence_without_side_effects(aws, tmp_path):
    from rayft.cli import app

    f = tmp_path / "job.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "data": {"train_files": ["x.jsonl"]},
                "cluster": {
                    "name": "eks-cluster",
                    "instance_type": "g6.12xlarge",
                    "num_nodes": 2,
                    "efa": True,
                    "aws": {"region": "us-east-2", "availability_zones": ["us-east-2a", "us-east-2b"]},
                },
            }
        )
    )
    res = CliRunner().invoke(app, ["cluster", "plan", str(f), "--workdir", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output
    out = res.stdout
    order = [
        "sts:GetCallerIdentity",
        "service-quotas:GetServiceQuota(ServiceCode=ec2, QuotaCode=L-DB2E81BA)",
        f"eksctl create cluster --config-file {tmp_path}/w/eksctl-cluster.yaml --install-nvidia-plugin=false",
        "eksctl utils write-kubeconfig --cluster eks-cluster --region us-east-2",
        f"eksctl create nodegroup --config-file {tmp_path}/w/eksctl-gpu-nodegroup.yaml --include=gpu-workers --install-nvidia-plugin=false",
        "helm upgrade --install nvidia-device-plugin nvidia-device-plugin --repo https://nvidia.github.io/k8s-device-plugin --version 0.20.0",
        "helm upgrade --install aws-efa-k8s-device-plugin aws-efa-k8s-device-plugin --repo https://aws.github.io/eks-charts --version v0.5.32",
        "helm upgrade --install kuberay-operator kuberay-operator --repo https://ray-project.github.io/kuberay-helm/ --version 1.7.0",
        "kubectl get nodes --selector role=gpu-worker --output json",
        "## down (reverse order",
        "helm uninstall kuberay-operator --namespace kuberay-operator --wait",
        "eksctl delete nodegroup --cluster eks-cluster --region us-east-2 --name gpu-workers --wait",
    ]
    at = 0
    for s in order:  # each one after the one before
        at = out.index(s, at)
    assert out.index("eksctl delete cluster --name eks-cluster --region us-east-2 --wait", at) > at
    assert "efaEnabled: true" in out and "- us-east-2a" in out
    assert not (tmp_path / "w").exists()  # nothing written
    assert _clients()("eks", "us-east-2").list_clusters()["clusters"] == []


# --------------------------------------------------------------------------- review fixes


def test_instance_type_without_efa_stops_up_in_preflight_before_anything_is_created(aws, tmp_path, tools_present):
    cfg = ClusterConfig.model_validate(
        {
            "name": "rayft",
            "instance_type": "g6.4xlarge",
            "num_nodes": 2,
            "aws": {"region": REGION, "availability_zones": ["us-west-2a", "us-west-2b"]},
        }
    )
    world, aws_calls = World(), []
    with pytest.raises(eks.LifecycleError) as ei:
        eks.up(_ctx(cfg, world, tmp_path, clients=_recording(_quota_factory(192.0), aws_calls)))
    assert "cluster.efa: g6.4xlarge does not support EFA; set cluster.efa: false" in str(ei.value)
    assert world.calls == []  # no eksctl, no helm
    assert set(aws_calls) == {"sts:GetCallerIdentity", "ec2:DescribeInstanceTypes"}  # only the preflight's reads
    assert eks_probes.cluster_status(_clients()("eks", REGION), "rayft") == eks_probes.NOT_FOUND
    # and the plan shows that check in the preflight step
    plan_text = eks_plan.render_plan(eks_plan.plan(cfg))
    assert plan_text.index("ec2:DescribeInstanceTypes(InstanceTypes=[g6.4xlarge])  # exists, has GPUs, supports EFA") < plan_text.index(
        "## 2."
    )


def test_preflight_reports_every_problem_at_once(aws, tmp_path, monkeypatch):
    monkeypatch.setattr(eks, "missing_tools", lambda tools=(): ["helm"])
    cfg = ClusterConfig.model_validate({"instance_type": "m7i.xlarge", "aws": {"region": REGION}})
    with pytest.raises(eks.LifecycleError) as ei:
        eks.preflight(_ctx(cfg, World(), tmp_path), instance=True)
    msg = str(ei.value)
    assert "missing tools: helm" in msg and "m7i.xlarge has no GPUs" in msg and "does not support EFA" in msg
    # down/status do not look at the instance type
    monkeypatch.setattr(eks, "missing_tools", lambda tools=(): [])
    assert eks.preflight(_ctx(cfg, World(), tmp_path)).shape is None


def _foreign_cluster(tags=None):
    """A cluster made outside rayft (no rayft.io/cluster tag), as `up` would find and reuse it."""
    _clients()("eks", REGION).create_cluster(
        name="rayft", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []}, tags=tags or {"team": "ml"}
    )


def test_down_refuses_a_cluster_rayft_did_not_create(aws, tmp_path, tools_present):
    _foreign_cluster()
    world = World()
    with pytest.raises(eks.LifecycleError) as ei:
        eks_down.down(_ctx(_cfg(), world, tmp_path))
    msg = str(ei.value)
    assert "cluster rayft in us-west-2 has no rayft.io/cluster tag" in msg and "--delete-untagged" in msg
    assert "Nothing was changed" in msg
    assert world.calls == []
    assert eks_probes.cluster_status(_clients()("eks", REGION), "rayft") == "ACTIVE"


def test_down_refuses_a_cluster_tagged_for_another_rayft_cluster(aws, tmp_path, tools_present):
    _foreign_cluster({"rayft.io/cluster": "someone-else"})
    with pytest.raises(eks.LifecycleError, match="has tag rayft.io/cluster=someone-else"):
        eks_down.down(_ctx(_cfg(), World(), tmp_path))


def test_down_deletes_an_untagged_cluster_only_when_told(aws, tmp_path, tools_present):
    _foreign_cluster()
    world, msgs = World(), []
    eks_down.down(_ctx(_cfg(), world, tmp_path, messages=msgs), allow_untagged=True)
    assert "warning: cluster rayft has no rayft.io/cluster tag; deleting it anyway (--delete-untagged)" in msgs
    assert "eksctl delete cluster --name rayft --region us-west-2 --wait" in world.mutating
    assert eks_probes.cluster_status(_clients()("eks", REGION), "rayft") == eks_probes.NOT_FOUND


def test_down_cli_refuses_untagged_and_names_the_flag(aws, tmp_path, tools_present):
    from rayft.cli import app

    _foreign_cluster()
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({"data": {"train_files": ["x.jsonl"]}, "cluster": {"aws": {"region": REGION}}}))
    res = CliRunner().invoke(app, ["cluster", "down", str(f), "--yes"])
    assert res.exit_code == 1
    assert "--delete-untagged" in " ".join(res.output.split())
    assert eks_probes.cluster_status(_clients()("eks", REGION), "rayft") == "ACTIVE"


def test_a_tagged_cluster_is_recognised_by_its_stack_tags_too(aws):
    c = _clients()
    c("eks", REGION).create_cluster(name="c2", roleArn=f"arn:aws:iam::{ACCOUNT}:role/r", resourcesVpcConfig={"subnetIds": []})
    assert eks_probes.cluster_owner(c("eks", REGION), c("cloudformation", REGION), "c2") is None
    c("cloudformation", REGION).create_stack(
        StackName="eksctl-c2-cluster", TemplateBody=TRIVIAL_TEMPLATE, Tags=[{"Key": "rayft.io/cluster", "Value": "c2"}]
    )
    assert eks_probes.cluster_owner(c("eks", REGION), c("cloudformation", REGION), "c2") == "c2"


def _ds(name, labels=None, pod_label=None, image="registry.example/other:1"):
    tmpl = {"metadata": {"labels": {"name": pod_label}} if pod_label else {}, "spec": {"containers": [{"name": "c", "image": image}]}}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {"template": tmpl}}


def test_device_plugins_outside_helm_are_recognised_by_name_label_or_image():
    from rayft.cluster import addons

    efa, nvidia = addons.EKSCTL_EFA, addons.EKSCTL_NVIDIA
    eksctl_efa = _ds(
        "aws-efa-k8s-device-plugin-daemonset",
        pod_label="aws-efa-k8s-device-plugin",
        image="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.3.3",
    )
    assert addons.foreign_daemonset([eksctl_efa], efa) is eksctl_efa
    assert addons.foreign_daemonset([eksctl_efa], nvidia) is None
    assert efa.matches(_ds("aws-efa-k8s-device-plugin-daemonset"))  # by eksctl's name alone
    assert efa.matches(_ds("aws-efa-k8s-device-plugin"))  # by the chart's name
    assert efa.matches(_ds("efa-device-plugin-daemonset", pod_label="aws-efa-k8s-device-plugin"))  # renamed, same pods
    assert efa.matches(_ds("my-efa", image="602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin@sha256:ab"))
    assert not efa.matches(_ds("aws-node", image="602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon-k8s-cni:v1.19.0"))
    assert nvidia.matches(
        _ds("nvidia-device-plugin-daemonset", pod_label="nvidia-device-plugin-ds", image="nvcr.io/nvidia/k8s-device-plugin:v0.19.0")
    )
    assert nvidia.matches(_ds("gpu-operator-device-plugin", image="nvcr.io/nvidia/k8s-device-plugin:v0.17.1"))
    helm = _ds("aws-efa-k8s-device-plugin", labels={"app.kubernetes.io/managed-by": "Helm"})
    assert addons.foreign_daemonset([helm], efa) is None  # ours, from an earlier `up`


def test_eksctls_efa_plugin_is_found_and_waited_for_by_its_real_name(aws):
    from rayft.cluster import addons

    cfg = ClusterConfig.model_validate({"instance_type": "g6.12xlarge", "aws": {"region": REGION}})
    world, msgs = World(), []
    world.eksctl_efa_plugin, world.gpu_nodes = True, 2
    out = addons.install_addons(world, cfg, say=msgs.append)
    assert "aws-efa-k8s-device-plugin" not in world.releases and "aws-efa-k8s-device-plugin" not in out.installed
    assert out.device_plugin_daemonsets == ["nvidia-device-plugin", "aws-efa-k8s-device-plugin-daemonset"]
    ready = addons.check_ready(world, out.device_plugin_daemonsets, 2, 4, True)
    assert ready.ready, ready.problems
    assert world.lines.count("kubectl get daemonsets --namespace kube-system --output json") == 1


def test_cluster_commands_import_in_either_order():
    """rayft.cli imports the cluster commands; importing them first must work too (no circular-import error)."""
    for first in ("rayft.commands.cluster", "rayft.cli"):
        code = f"import {first}; from rayft.cli import app; import typer.main; print(sorted(typer.main.get_command(app).commands))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "'capacity'" in out.stdout and "'cluster'" in out.stdout


def test_capacity_cli_reports_a_cleanup_failure_noted_on_ctrl_c(aws, monkeypatch, tmp_path):
    from rayft.cli import app

    def interrupted(*a, **kw):
        e = KeyboardInterrupt()
        e.add_note(
            "and then: could not cancel probe capacity reservation cr-1 (x); it is billed until cancelled:\n"
            "  aws ec2 cancel-capacity-reservation --capacity-reservation-id cr-1 --region us-west-2"
        )
        raise e

    monkeypatch.setattr(cap, "find_capacity", interrupted)
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({"data": {"train_files": ["x.jsonl"]}, "cluster": {"aws": {"region": REGION}}}))
    res = CliRunner().invoke(app, ["capacity", str(f), "--probe", "--yes"])
    assert res.exit_code == 130
    assert "aws ec2 cancel-capacity-reservation --capacity-reservation-id cr-1 --region us-west-2" in res.output

"""The instance catalog: shipped figures, their sources, and the EC2 DescribeInstanceTypes path."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from rayft.cluster.instances import (
    InstanceType,
    NotAGpuInstanceError,
    UnknownInstanceTypeError,
    catalog,
    describe_instance_type,
    get_instance,
    instance_from_ec2,
)

REQUIRED = [
    "g5.12xlarge",
    "g5.48xlarge",
    "g6.12xlarge",
    "g6e.12xlarge",
    "g6e.48xlarge",
    "p4d.24xlarge",
    "p5.48xlarge",
    "p5e.48xlarge",
    "p5en.48xlarge",
    "p6-b200.48xlarge",
]
FIGURES = [
    "gpu_count",
    "gpu_model",
    "gpu_memory_mib",
    "vcpus",
    "memory_mib",
    "max_efa_interfaces",
    "gpudirect_rdma",
    "nvlink",
    "on_demand_usd_per_hour",
]


@pytest.fixture
def aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture
def ec2(aws_env):
    boto3 = pytest.importorskip("boto3")
    moto = pytest.importorskip("moto")
    with moto.mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


def test_catalog_has_the_required_types():
    assert set(REQUIRED) <= set(catalog())


@pytest.mark.parametrize("name", REQUIRED)
def test_every_figure_has_a_source_and_a_date(name):
    inst = get_instance(name)
    for f in FIGURES:
        src = inst.source_of(f)
        assert src.source.strip(), f"{name}.{f}: empty source"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", src.date), f"{name}.{f}: bad date {src.date!r}"


@pytest.mark.parametrize(
    "name, gpus, model, vcpus, mem_gib, efa, gdr, nvlink",
    [
        ("g6.12xlarge", 4, "L4", 48, 192, 1, False, False),
        ("g5.12xlarge", 4, "A10G", 48, 192, 1, False, False),
        ("g6e.48xlarge", 8, "L40S", 192, 1536, 4, False, False),
        ("p4d.24xlarge", 8, "A100", 96, 1152, 4, True, True),
        ("p5.48xlarge", 8, "H100", 192, 2048, 32, True, True),
        ("p5en.48xlarge", 8, "H200", 192, 2048, 16, True, True),
        ("p6-b200.48xlarge", 8, "B200", 192, 2048, 8, True, True),
    ],
)
def test_known_figures(name, gpus, model, vcpus, mem_gib, efa, gdr, nvlink):
    i = get_instance(name)
    assert (i.gpu_count, i.gpu_model, i.vcpus, i.memory_gib, i.max_efa_interfaces) == (gpus, model, vcpus, mem_gib, efa)
    assert (i.gpudirect_rdma, i.nvlink) == (gdr, nvlink)
    assert i.origin == "catalog"


def test_gpu_memory_and_price_units():
    p5 = get_instance("p5.48xlarge")
    assert p5.gpu_memory_mib == 81920 and p5.gpu_memory_gib == 80.0
    assert get_instance("g6.12xlarge").on_demand_usd_per_hour == pytest.approx(4.6016)
    assert get_instance("p5e.48xlarge").on_demand_usd_per_hour is None  # not sold On-Demand: no invented price


def test_single_gpu_types_have_no_efa():
    g6 = get_instance("g6.xlarge")
    assert g6.max_efa_interfaces == 0 and not g6.efa_supported


def test_unknown_type_is_a_clear_keyerror():
    with pytest.raises(UnknownInstanceTypeError) as ei:
        get_instance("g6.13xlarge")
    msg = str(ei.value)
    assert "'g6.13xlarge'" in msg and "p5.48xlarge" in msg
    assert isinstance(ei.value, KeyError)


def test_instance_model_rejects_bad_figures():
    with pytest.raises(ValueError):
        InstanceType(
            name="x",
            gpu_count=0,
            gpu_model="L4",
            gpu_memory_mib=1,
            vcpus=1,
            memory_mib=1,
            max_efa_interfaces=0,
            gpudirect_rdma=False,
            nvlink=False,
        )


def test_catalog_agrees_with_the_describe_instance_types_snapshot():
    """The shipped figures equal moto's bundled DescribeInstanceTypes capture (their stated source)."""
    moto = pytest.importorskip("moto")
    snap = Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz"
    if not snap.exists():
        pytest.skip(f"moto has no instance type snapshot at {snap}")
    data = json.loads(gzip.open(snap).read())
    for name, inst in catalog().items():
        from_ec2 = instance_from_ec2(data[name], "2026-11-30")
        for f in ("gpu_count", "gpu_model", "gpu_memory_mib", "vcpus", "memory_mib", "max_efa_interfaces"):
            assert getattr(from_ec2, f) == getattr(inst, f), f"{name}.{f}"


def test_describe_uses_ec2(ec2):
    p5 = describe_instance_type("p5.48xlarge", ec2)
    assert p5.origin == "ec2"
    assert (p5.gpu_count, p5.gpu_model, p5.max_efa_interfaces) == (8, "H100", 32)
    assert p5.nvlink and p5.gpudirect_rdma  # taken from the catalog: EC2 does not report them
    assert p5.source_of("vcpus").source.startswith("EC2 DescribeInstanceTypes")


def test_describe_a_type_outside_the_catalog_infers_topology(ec2):
    g6 = describe_instance_type("g6.4xlarge", ec2)
    assert (g6.gpu_count, g6.gpu_model, g6.vcpus, g6.max_efa_interfaces) == (1, "L4", 16, 0)
    assert not g6.nvlink and not g6.gpudirect_rdma and g6.on_demand_usd_per_hour is None
    assert "inferred" in g6.source_of("nvlink").source


def test_describe_unknown_and_cpu_types(ec2):
    with pytest.raises(UnknownInstanceTypeError, match="zz9.large"):
        describe_instance_type("zz9.large", ec2)
    with pytest.raises(NotAGpuInstanceError, match="m7i.xlarge"):
        describe_instance_type("m7i.xlarge", ec2)


def test_describe_falls_back_to_the_catalog_when_ec2_is_unreachable():
    from botocore.exceptions import EndpointConnectionError

    class Offline:
        def describe_instance_types(self, **kw):
            raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")

    inst = describe_instance_type("g6e.12xlarge", Offline())
    assert inst.origin == "catalog" and inst.gpu_count == 4


def test_describe_without_credentials_uses_the_catalog(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    inst = describe_instance_type("p5en.48xlarge")
    assert inst.origin == "catalog" and inst.max_efa_interfaces == 16


def test_one_describe_instance_types_parser_shared_with_capacity(ec2):
    from rayft.cluster import capacity, instances

    assert capacity.describe_shape is instances.describe_shape and capacity.Shape is instances.Shape
    g6 = instances.describe_shape(ec2, "g6.12xlarge")
    assert (g6.vcpus, g6.gpus, g6.efa_supported, g6.max_efa_interfaces, g6.memory_mib) == (48, 4, True, 1, 196608)
    # a CPU type parses too (capacity needs its vCPUs); instance_from_ec2 still refuses it
    m7i = instances.describe_shape(ec2, "m7i.xlarge")
    assert (m7i.vcpus, m7i.gpus, m7i.efa_supported, m7i.max_efa_interfaces) == (4, 0, False, 0)


def test_shape_reports_no_efa_interfaces_when_efa_is_unsupported():
    from rayft.cluster.instances import shape_from_ec2

    item = {
        "InstanceType": "x1.large",
        "VCpuInfo": {"DefaultVCpus": 2},
        "NetworkInfo": {"EfaSupported": False, "EfaInfo": {"MaximumEfaInterfaces": 1}},
    }
    s = shape_from_ec2(item)
    assert (s.efa_supported, s.max_efa_interfaces, s.gpus, s.memory_mib) == (False, 0, 0, 0)


def test_the_given_region_wins_over_the_sessions(aws_env, monkeypatch):
    pytest.importorskip("boto3")
    from rayft.cluster import instances

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert instances._default_ec2_client("eu-north-1").meta.region_name == "eu-north-1"
    assert instances._default_ec2_client(None).meta.region_name == "us-east-1"

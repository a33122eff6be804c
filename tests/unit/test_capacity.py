"""Capacity finder: quota families and codes, vCPU arithmetic, the reservation probe and its cleanup.

moto 5.2.5 implements neither EC2 Service Quotas (its service-quotas backend only knows the `vpc`
service code) nor CreateCapacityReservation / CancelCapacityReservation (NotImplementedError), so
these paths are tested here with botocore's Stubber; offerings, running-instance usage and the
"quota unavailable" path run against the moto server in tests/integration/test_aws_moto.py.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import ANY, Stubber

from rayft.cluster import capacity as cap


@pytest.fixture
def clients(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    ec2 = boto3.client("ec2", region_name="us-west-2")
    sq = boto3.client("service-quotas", region_name="us-west-2")
    stubs = {"ec2": Stubber(ec2), "service-quotas": Stubber(sq)}
    objs = {"ec2": ec2, "service-quotas": sq}
    for s in stubs.values():
        s.activate()
    yield (lambda service, region: objs[service]), stubs
    for s in stubs.values():
        s.deactivate()


def _offerings(stub, azs, itype="g6.12xlarge"):
    stub.add_response(
        "describe_instance_type_offerings",
        {"InstanceTypeOfferings": [{"InstanceType": itype, "LocationType": "availability-zone", "Location": z} for z in azs]},
        {"LocationType": "availability-zone", "Filters": [{"Name": "instance-type", "Values": [itype]}]},
    )


def _shape(stub, itype="g6.12xlarge", vcpus=48):
    stub.add_response(
        "describe_instance_types",
        {
            "InstanceTypes": [
                {
                    "InstanceType": itype,
                    "VCpuInfo": {"DefaultVCpus": vcpus},
                    "GpuInfo": {"Gpus": [{"Name": "L4", "Manufacturer": "NVIDIA", "Count": 4}]},
                    "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 1}},
                }
            ]
        },
        {"InstanceTypes": [itype]},
    )


def _quota(stub, code, value):
    stub.add_response(
        "get_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "QuotaName": "q", "Value": value}},
        {"ServiceCode": "ec2", "QuotaCode": code},
    )


def _instances(stub, instances):
    stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": instances}]},
        {"Filters": [{"Name": "instance-state-name", "Values": ["pending", "running"]}]},
    )


def _inst(itype, cores, threads=2, spot=False):
    d = {"InstanceId": f"i-{itype.replace('.', '')}", "InstanceType": itype, "CpuOptions": {"CoreCount": cores, "ThreadsPerCore": threads}}
    if spot:
        d["InstanceLifecycle"] = "spot"
    return d


def test_quota_families_and_codes():
    assert cap.instance_family("g6e.12xlarge") == "g"
    assert cap.instance_family("p5en.48xlarge") == "p"
    assert cap.instance_family("trn1n.32xlarge") == "trn"
    g = cap.quota_family("g6.12xlarge")
    assert (g.on_demand_code, g.spot_code) == ("L-DB2E81BA", "L-3819A6DF")
    assert cap.quota_family("vt1.3xlarge") is g
    p = cap.quota_family("p5.48xlarge")
    assert (p.on_demand_code, p.spot_code) == ("L-417A185B", "L-7212CCBC")
    assert cap.quota_family("m7i.xlarge").on_demand_code == "L-1216C47A"
    assert g.on_demand_name == "Running On-Demand G and VT instances"
    assert p.spot_name == "All P Spot Instance Requests"


def test_quota_increase_command_is_exact():
    assert cap.quota_increase_command("us-east-2", "L-DB2E81BA", 96) == (
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA --desired-value 96 --region us-east-2"
    )


def test_vcpu_arithmetic_counts_only_the_family_and_lifecycle(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    _offerings(ec2, ["us-west-2a", "us-west-2b"])
    _shape(ec2)
    _quota(stubs["service-quotas"], "L-DB2E81BA", 200.0)
    # counted: g5.12xlarge (24 cores × 2) + vt1.3xlarge (6 × 2); not: p4d, m5, a spot g5
    _instances(
        ec2,
        [
            _inst("g5.12xlarge", 24),
            _inst("vt1.3xlarge", 6),
            _inst("p4d.24xlarge", 48),
            _inst("m5.large", 1),
            _inst("g5.xlarge", 2, spot=True),
        ],
    )
    rep = cap.find_capacity(factory, "g6.12xlarge", 2, ["us-west-2"])
    assert rep.need_vcpus == 96
    c = rep.ranked()[0]
    assert (c.used_vcpus, c.quota.value, c.headroom) == (60, 200.0, 140.0)
    assert c.quota_ok is True and c.verdict == "quota ok"
    assert rep.quota_commands == []
    for s in stubs.values():
        s.assert_no_pending_responses()


def test_short_quota_prints_the_increase_for_usage_plus_need(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    _offerings(ec2, ["us-west-2a"], itype="p5.48xlarge")
    _shape(ec2, itype="p5.48xlarge", vcpus=192)
    _quota(stubs["service-quotas"], "L-417A185B", 192.0)
    _instances(ec2, [_inst("p4d.24xlarge", 48)])  # 96 vCPUs in use
    rep = cap.find_capacity(factory, "p5.48xlarge", 2, ["us-west-2"])
    c = rep.ranked()[0]
    assert (c.need_vcpus, c.used_vcpus, c.headroom) == (384, 96, 96.0)
    assert c.verdict == "quota short" and not c.usable
    assert rep.quota_commands == [
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-417A185B "
        "--desired-value 480 --region us-west-2"
    ]


def test_quota_of_zero(clients):
    factory, stubs = clients
    _offerings(stubs["ec2"], ["us-west-2a", "us-west-2b"])
    _shape(stubs["ec2"])
    _quota(stubs["service-quotas"], "L-DB2E81BA", 0.0)
    _instances(stubs["ec2"], [])
    rep = cap.find_capacity(factory, "g6.12xlarge", 2, ["us-west-2"])
    assert [c.verdict for c in rep.ranked()] == ["quota short", "quota short"]
    assert rep.usable() == []
    assert rep.quota_commands == [
        "aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA --desired-value 96 --region us-west-2"
    ]


def test_spot_uses_the_spot_quota_and_spot_usage(clients):
    factory, stubs = clients
    _offerings(stubs["ec2"], ["us-west-2a"])
    _shape(stubs["ec2"])
    _quota(stubs["service-quotas"], "L-3819A6DF", 64.0)
    _instances(stubs["ec2"], [_inst("g5.12xlarge", 24), _inst("g5.xlarge", 2, spot=True)])
    rep = cap.find_capacity(factory, "g6.12xlarge", 1, ["us-west-2"], capacity_type="spot")
    c = rep.ranked()[0]
    assert (c.quota.code, c.used_vcpus, c.headroom, c.quota_ok) == ("L-3819A6DF", 4, 60.0, True)


def test_applied_quota_missing_falls_back_to_the_aws_default(clients):
    factory, stubs = clients
    sq = stubs["service-quotas"]
    sq.add_client_error("get_service_quota", "NoSuchResourceException", "never changed")
    sq.add_response(
        "get_aws_default_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": 64.0}},
        {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"},
    )
    q = cap.get_quota(factory("service-quotas", "us-west-2"), "L-DB2E81BA", "x")
    assert (q.value, q.source) == (64.0, "AWS default")


def _create(stub, az, rid=None, error=None):
    params = {
        "InstanceType": "g6.12xlarge",
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": az,
        "InstanceCount": 2,
        "InstanceMatchCriteria": "targeted",
        "EndDateType": "unlimited",
        "ClientToken": ANY,
        "TagSpecifications": ANY,
    }
    if error:
        stub.add_client_error("create_capacity_reservation", error, "no", expected_params=params)
    else:
        stub.add_response("create_capacity_reservation", {"CapacityReservation": {"CapacityReservationId": rid}}, params)


def test_probe_moves_past_insufficient_capacity_and_cancels(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    _offerings(ec2, ["us-west-2a", "us-west-2b", "us-west-2c"])
    _shape(ec2)
    _quota(stubs["service-quotas"], "L-DB2E81BA", 192.0)
    _instances(ec2, [])
    _create(ec2, "us-west-2a", error="InsufficientInstanceCapacity")
    _create(ec2, "us-west-2b", rid="cr-0b")
    ec2.add_response("cancel_capacity_reservation", {"Return": True}, {"CapacityReservationId": "cr-0b"})
    rep = cap.find_capacity(factory, "g6.12xlarge", 2, ["us-west-2"], probe=True)
    by_az = {c.az: c for c in rep.candidates}
    assert by_az["us-west-2a"].probe == "no capacity" and not by_az["us-west-2a"].usable
    assert by_az["us-west-2b"].probe == "AVAILABLE"
    assert by_az["us-west-2c"].probe is None  # probing stops at the first AZ with capacity
    assert [c.az for c in rep.usable()] == ["us-west-2b", "us-west-2c"]
    assert rep.ranked()[0].verdict == "capacity confirmed"
    ec2.assert_no_pending_responses()  # the reservation was cancelled


def test_probe_tags_the_reservation_with_a_unique_token(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    seen = {}

    def grab(params, **kw):
        seen.update(params)

    factory("ec2", "us-west-2").meta.events.register("provide-client-params.ec2.CreateCapacityReservation", grab)
    _create(ec2, "us-west-2a", rid="cr-1")
    ec2.add_response("cancel_capacity_reservation", {"Return": True}, {"CapacityReservationId": "cr-1"})
    assert (
        cap.probe_capacity(factory("ec2", "us-west-2"), "us-west-2", "g6.12xlarge", "us-west-2a", 2, {"rayft.io/cluster": "c"})
        == "AVAILABLE"
    )
    tags = {t["Key"]: t["Value"] for t in seen["TagSpecifications"][0]["Tags"]}
    assert tags["rayft.io/cluster"] == "c" and tags[cap.TAG_PROBE] == seen["ClientToken"] and len(seen["ClientToken"]) == 32


def test_ctrl_c_during_create_still_cancels_the_reservation(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    client = factory("ec2", "us-west-2")

    def interrupt(**kw):
        raise KeyboardInterrupt  # lands after AWS created it, before we saw its id

    client.meta.events.register("after-call.ec2.CreateCapacityReservation", interrupt)
    _create(ec2, "us-west-2a", rid="cr-lost")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": [{"CapacityReservationId": "cr-lost"}]}, {"Filters": ANY})
    ec2.add_response("cancel_capacity_reservation", {"Return": True}, {"CapacityReservationId": "cr-lost"})
    with pytest.raises(KeyboardInterrupt):
        cap.probe_capacity(client, "us-west-2", "g6.12xlarge", "us-west-2a", 2)
    ec2.assert_no_pending_responses()


def test_cancel_that_keeps_failing_names_the_manual_command(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    _create(ec2, "us-west-2a", rid="cr-stuck")
    for _ in range(3):
        ec2.add_client_error("cancel_capacity_reservation", "RequestLimitExceeded", "slow down")
    with pytest.raises(cap.ReservationLeak) as ei:
        cap.probe_capacity(factory("ec2", "us-west-2"), "us-west-2", "g6.12xlarge", "us-west-2a", 2)
    assert "aws ec2 cancel-capacity-reservation --capacity-reservation-id cr-stuck --region us-west-2" in str(ei.value)


def test_probe_maps_quota_errors(clients):
    factory, stubs = clients
    _create(stubs["ec2"], "us-west-2a", error="VcpuLimitExceeded")
    assert cap.probe_capacity(factory("ec2", "us-west-2"), "us-west-2", "g6.12xlarge", "us-west-2a", 2) == "quota"


def _interrupt_create(client, exc=KeyboardInterrupt):
    def interrupt(**kw):
        raise exc  # lands after AWS created it, before we saw its id

    client.meta.events.register("after-call.ec2.CreateCapacityReservation", interrupt)


def test_ctrl_c_survives_a_failed_lookup_and_says_how_to_finish_by_hand(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    client = factory("ec2", "us-west-2")
    _interrupt_create(client)
    _create(ec2, "us-west-2a", rid="cr-lost")
    ec2.add_client_error("describe_capacity_reservations", "RequestLimitExceeded", "slow down", expected_params={"Filters": ANY})
    with pytest.raises(KeyboardInterrupt) as ei:  # the original, not the lookup's ClientError
        cap.probe_capacity(client, "us-west-2", "g6.12xlarge", "us-west-2a", 2)
    [note] = ei.value.__notes__
    assert "RequestLimitExceeded" in note and f"Name=tag:{cap.TAG_PROBE},Values=" in note
    assert "aws ec2 describe-capacity-reservations --region us-west-2" in note
    assert "aws ec2 cancel-capacity-reservation --capacity-reservation-id <id> --region us-west-2" in note
    ec2.assert_no_pending_responses()


def test_ctrl_c_survives_a_failed_cancel_and_names_the_reservation(clients):
    factory, stubs = clients
    ec2 = stubs["ec2"]
    client = factory("ec2", "us-west-2")
    _interrupt_create(client)
    _create(ec2, "us-west-2a", rid="cr-lost")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": [{"CapacityReservationId": "cr-lost"}]}, {"Filters": ANY})
    for _ in range(3):
        ec2.add_client_error("cancel_capacity_reservation", "RequestLimitExceeded", "slow down")
    with pytest.raises(KeyboardInterrupt) as ei:
        cap.probe_capacity(client, "us-west-2", "g6.12xlarge", "us-west-2a", 2)
    [note] = ei.value.__notes__
    assert "aws ec2 cancel-capacity-reservation --capacity-reservation-id cr-lost --region us-west-2" in note


def test_any_other_interruption_propagates_unchanged_after_cleanup(clients):
    from botocore.exceptions import ReadTimeoutError

    factory, stubs = clients
    ec2 = stubs["ec2"]
    client = factory("ec2", "us-west-2")
    _interrupt_create(client, ReadTimeoutError(endpoint_url="https://ec2.us-west-2.amazonaws.com"))
    _create(ec2, "us-west-2a", rid="cr-maybe")
    ec2.add_response("describe_capacity_reservations", {"CapacityReservations": [{"CapacityReservationId": "cr-maybe"}]}, {"Filters": ANY})
    ec2.add_response("cancel_capacity_reservation", {"Return": True}, {"CapacityReservationId": "cr-maybe"})
    with pytest.raises(ReadTimeoutError) as ei:
        cap.probe_capacity(client, "us-west-2", "g6.12xlarge", "us-west-2a", 2)
    assert not getattr(ei.value, "__notes__", None)  # cleanup worked: nothing to add
    ec2.assert_no_pending_responses()

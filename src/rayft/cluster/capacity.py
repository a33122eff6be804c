"""Where N × a GPU instance type can be launched: offerings, vCPU quota headroom, live capacity.

Three separate facts decide it, and AWS reports each one separately:

1. the type is **offered** in the AZ (``DescribeInstanceTypeOfferings``);
2. the family's **vCPU quota** (Service Quotas, e.g. L-DB2E81BA "Running On-Demand G and VT
   instances") minus the vCPUs of pending/running instances of that family covers
   N × the type's vCPUs;
3. there is **capacity** right now. No read-only API answers this; the optional probe creates a
   targeted On-Demand Capacity Reservation for N instances and cancels it at once. Cancellation is
   guaranteed: on error, on Ctrl-C (even one landing mid-call: the reservation carries a unique tag
   and is looked up by it), with SIGINT deferred while cancelling.

Quotas are in vCPUs, never instances. :func:`find_capacity` returns a ranked
:class:`CapacityReport`; when a quota is short it carries the exact
``aws service-quotas request-service-quota-increase`` command.
"""

from __future__ import annotations

import math
import re
import shlex
import signal
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from botocore.exceptions import BotoCoreError, ClientError

# The one DescribeInstanceTypes parser lives in instances.py; capacity uses (and re-exports) it.
from rayft.cluster.instances import Shape, describe_shape  # noqa: F401 - re-exported

TAG_CLUSTER = "rayft.io/cluster"
TAG_PROBE = "rayft.io/capacity-probe"

ClientFactory = Callable[[str, str], Any]  # (service, region) -> boto3 client


def boto3_clients() -> ClientFactory:
    """A cached (service, region) → boto3 client factory (honours AWS_ENDPOINT_URL, profiles, …)."""
    import boto3

    cache: dict[tuple[str, str], Any] = {}
    session = boto3.session.Session()

    def get(service: str, region: str) -> Any:
        key = (service, region)
        if key not in cache:
            cache[key] = session.client(service, region_name=region)
        return cache[key]

    return get


# --------------------------------------------------------------------------- quotas


@dataclass(frozen=True)
class QuotaFamily:
    """One EC2 vCPU quota family: the instance families it covers and its two quota codes."""

    label: str
    pattern: str  # regex on the instance family (the letters before the generation digit)
    on_demand_code: str
    spot_code: str

    @property
    def on_demand_name(self) -> str:
        return f"Running On-Demand {self.label} instances"

    @property
    def spot_name(self) -> str:
        return f"All {self.label} Spot Instance Requests"

    def covers(self, instance_type: str) -> bool:
        return re.fullmatch(self.pattern, instance_family(instance_type)) is not None


QUOTA_FAMILIES: tuple[QuotaFamily, ...] = (
    QuotaFamily("G and VT", r"g|gr|vt", "L-DB2E81BA", "L-3819A6DF"),
    QuotaFamily("P", r"p", "L-417A185B", "L-7212CCBC"),
    QuotaFamily("Trn", r"trn", "L-2C3B7624", "L-5480EFD2"),
    QuotaFamily("Inf", r"inf", "L-1945791B", "L-B5D1601B"),
    QuotaFamily("Standard (A, C, D, H, I, M, R, T, Z)", r"a|c|d|h|i|m|r|t|z", "L-1216C47A", "L-34B43A08"),
)


def instance_family(instance_type: str) -> str:
    """``g6e.12xlarge`` → ``g``; ``trn1n.32xlarge`` → ``trn``; ``p5en.48xlarge`` → ``p``."""
    m = re.match(r"([a-z]+?)\d", instance_type)
    if not m:
        raise ValueError(f"not an EC2 instance type: {instance_type!r}")
    return m.group(1)


def quota_family(instance_type: str) -> QuotaFamily:
    """The EC2 vCPU quota family ``instance_type`` counts against.

    Raises:
        ValueError: not an instance type, or a family with no known quota.
    """
    for fam in QUOTA_FAMILIES:
        if fam.covers(instance_type):
            return fam
    raise ValueError(f"no known EC2 vCPU quota family for {instance_type!r}")


@dataclass(frozen=True)
class Quota:
    """A quota's value in vCPUs; ``value`` is None when it could not be read (``note`` says why)."""

    code: str
    name: str
    value: float | None
    source: str  # "applied", "AWS default" or "unavailable"
    note: str = ""


def get_quota(sq: Any, code: str, name: str) -> Quota:
    """The applied value of an EC2 quota, else its AWS default, else unavailable (never raises)."""
    try:
        q = sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        return Quota(code, name, float(q["Value"]), "applied")
    except (ClientError, BotoCoreError, NotImplementedError) as e:
        first = _err_text(e)
    try:
        q = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        return Quota(code, name, float(q["Value"]), "AWS default")
    except (ClientError, BotoCoreError, NotImplementedError) as e:
        return Quota(code, name, None, "unavailable", f"{first}; default: {_err_text(e)}")


def _err_text(e: BaseException) -> str:
    if isinstance(e, ClientError):
        return f"{e.response.get('Error', {}).get('Code', 'Error')}: {e.response.get('Error', {}).get('Message', '')}".strip()
    return f"{type(e).__name__}: {e}"


def vcpus_in_use(ec2: Any, fam: QuotaFamily, *, spot: bool) -> int:
    """vCPUs of pending/running instances that count against ``fam``'s on-demand (or spot) quota."""
    total = 0
    default_vcpus: dict[str, int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                itype = inst["InstanceType"]
                if not fam.covers(itype):
                    continue
                if (inst.get("InstanceLifecycle") == "spot") != spot:
                    continue
                cpu = inst.get("CpuOptions") or {}
                if "CoreCount" in cpu:
                    total += int(cpu["CoreCount"]) * int(cpu.get("ThreadsPerCore", 1))
                else:  # no CpuOptions in the answer: the type's default vCPUs
                    if itype not in default_vcpus:
                        default_vcpus[itype] = describe_shape(ec2, itype).vcpus
                    total += default_vcpus[itype]
    return total


def quota_increase_command(region: str, code: str, desired_vcpus: int) -> str:
    """The exact AWS CLI command that asks for a quota of ``desired_vcpus``."""
    return shlex.join(
        [
            "aws",
            "service-quotas",
            "request-service-quota-increase",
            "--service-code",
            "ec2",
            "--quota-code",
            code,
            "--desired-value",
            str(desired_vcpus),
            "--region",
            region,
        ]
    )


# --------------------------------------------------------------------------- offerings


def offered_azs(ec2: Any, instance_type: str) -> list[str]:
    """AZs of the client's region that offer ``instance_type``, sorted."""
    out: set[str] = set()
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    for page in pages:
        out.update(o["Location"] for o in page.get("InstanceTypeOfferings", []))
    return sorted(out)


# --------------------------------------------------------------------------- the definitive probe


class ReservationLeak(RuntimeError):
    """A probe reservation that could not be cancelled; the message has the command to do it by hand."""


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C until the block ends (main thread only), then raise it.

    When the block itself raises, that exception propagates and a held Ctrl-C is dropped (it must
    not hide, e.g., a :class:`ReservationLeak` that carries the manual cancel command).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if got:
        raise KeyboardInterrupt


def _cancel(ec2: Any, region: str, rid: str, attempts: int = 3) -> None:
    """Cancel reservation ``rid`` (already gone counts as done), retrying ``attempts`` times.

    Raises:
        ReservationLeak: every attempt failed; the message has the manual cancel command.
    """
    last = ""
    for _ in range(attempts):
        try:
            ec2.cancel_capacity_reservation(CapacityReservationId=rid)
            return
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("InvalidCapacityReservationId.NotFound",):
                return
            last = _err_text(e)
        except BotoCoreError as e:
            last = _err_text(e)
    raise ReservationLeak(
        f"could not cancel probe capacity reservation {rid} ({last}); it is billed until cancelled:\n"
        f"  aws ec2 cancel-capacity-reservation --capacity-reservation-id {rid} --region {region}"
    )


def _reservations_tagged(ec2: Any, token: str) -> list[str]:
    resp = ec2.describe_capacity_reservations(
        Filters=[
            {"Name": f"tag:{TAG_PROBE}", "Values": [token]},
            {"Name": "state", "Values": ["pending", "active", "assessing", "scheduled"]},
        ]
    )
    return [r["CapacityReservationId"] for r in resp.get("CapacityReservations", [])]


def _release_probe(ec2: Any, region: str, token: str, rid: str | None, original: BaseException | None) -> None:
    """Cancel the probe reservation (``rid``, or whatever carries the probe tag ``token``).

    With ``original`` (the exception already on its way out), a failure here never replaces it:
    it is attached to ``original`` as a note, with the commands to finish by hand. Without one,
    the failure is raised.
    """
    try:
        with _sigint_deferred():
            for found in [rid] if rid is not None else _reservations_tagged(ec2, token):
                _cancel(ec2, region, found)
    except BaseException as cleanup:  # noqa: BLE001 - reported on the original, or re-raised
        if original is None:
            raise
        if isinstance(cleanup, ReservationLeak):
            note = f"and then: {cleanup}"
        else:
            note = (
                f"and then the probe reservation tagged {TAG_PROBE}={token} could not be looked up "
                f"({_err_text(cleanup)}); if it was created it is billed until cancelled:\n"
                f"  aws ec2 describe-capacity-reservations --region {region} "
                f"--filters Name=tag:{TAG_PROBE},Values={token} --query 'CapacityReservations[].CapacityReservationId'\n"
                f"  aws ec2 cancel-capacity-reservation --capacity-reservation-id <id> --region {region}"
            )
        original.add_note(note)


def probe_capacity(ec2: Any, region: str, instance_type: str, az: str, count: int, tags: dict[str, str] | None = None) -> str:
    """Create a targeted On-Demand Capacity Reservation for ``count`` × ``instance_type`` in ``az``, cancel it.

    Returns ``"AVAILABLE"``, ``"no capacity"`` (InsufficientInstanceCapacity), ``"quota"`` or
    ``"error: <code>"``. The reservation never outlives this call: it is cancelled in ``finally``;
    when the create call was interrupted before its answer arrived, the reservation is found by
    its unique probe tag and cancelled.

    Raises:
        ReservationLeak: the reservation was created but could not be cancelled (the message has
            the command to cancel it by hand).
        KeyboardInterrupt, or whatever else interrupted the create call: always the original
            exception, even when cleaning up after it failed too; that failure is attached as a
            note (``__notes__``) with the commands to finish by hand.
    """
    token = uuid.uuid4().hex
    rid: str | None = None
    maybe_created = True
    original: BaseException | None = None
    all_tags = {**(tags or {}), TAG_PROBE: token}
    try:
        resp = ec2.create_capacity_reservation(
            InstanceType=instance_type,
            InstancePlatform="Linux/UNIX",
            AvailabilityZone=az,
            InstanceCount=count,
            InstanceMatchCriteria="targeted",
            EndDateType="unlimited",
            ClientToken=token,
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items()]}],
        )
        rid = resp["CapacityReservation"]["CapacityReservationId"]
        return "AVAILABLE"
    except ClientError as e:
        maybe_created = False  # AWS answered with an error: nothing was created
        code = e.response.get("Error", {}).get("Code", "")
        if code == "InsufficientInstanceCapacity":
            return "no capacity"
        if code in ("InstanceLimitExceeded", "VcpuLimitExceeded", "ReservationCapacityExceeded"):
            return "quota"
        return f"error: {code or e}"
    except BaseException as e:  # Ctrl-C, a timeout, anything: the reservation may exist
        original = e
        raise
    finally:
        if maybe_created:
            _release_probe(ec2, region, token, rid, original)


# --------------------------------------------------------------------------- the search


@dataclass
class Candidate:
    """One region/AZ and what is known about launching there."""

    region: str
    az: str
    offered: bool
    quota: Quota | None = None
    used_vcpus: int = 0
    need_vcpus: int = 0
    probe: str | None = None
    preference: int = 0  # position in the configured AZ list (lower is preferred)

    @property
    def headroom(self) -> float | None:
        if self.quota is None or self.quota.value is None:
            return None
        return self.quota.value - self.used_vcpus

    @property
    def quota_ok(self) -> bool | None:
        h = self.headroom
        return None if h is None else h >= self.need_vcpus

    @property
    def usable(self) -> bool:
        """Worth trying: offered, quota not known to be short, probe (if any) not negative."""
        return self.offered and self.quota_ok is not False and self.probe in (None, "AVAILABLE", "skipped")

    @property
    def verdict(self) -> str:
        if not self.offered:
            return "not offered"
        if self.quota_ok is False:
            return "quota short"
        if self.probe == "AVAILABLE":
            return "capacity confirmed"
        if self.probe not in (None, "skipped"):
            return self.probe
        return "quota ok" if self.quota_ok else "quota unknown"

    def rank_key(self) -> tuple:
        tier = {"capacity confirmed": 0, "quota ok": 1, "quota unknown": 2}.get(self.verdict, 3)
        if not self.offered:
            tier = 5
        return (tier, self.preference, self.region, self.az)


@dataclass
class CapacityReport:
    """The result of :func:`find_capacity`: the type's shape, every candidate, quota commands, notes."""

    instance_type: str
    count: int
    capacity_type: str
    shape: Shape | None
    candidates: list[Candidate] = field(default_factory=list)
    quota_commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def need_vcpus(self) -> int:
        """vCPUs the request needs: the type's default vCPUs × ``count`` (0 when the type is offered nowhere)."""
        return (self.shape.vcpus if self.shape else 0) * self.count

    def ranked(self) -> list[Candidate]:
        """Candidates best first (confirmed capacity, quota ok, quota unknown, short, not offered)."""
        return sorted(self.candidates, key=Candidate.rank_key)

    def usable(self, region: str | None = None) -> list[Candidate]:
        """Ranked candidates worth trying (optionally only in ``region``)."""
        return [c for c in self.ranked() if c.usable and (region is None or c.region == region)]


def find_capacity(
    clients: ClientFactory,
    instance_type: str,
    count: int,
    regions: list[str],
    *,
    availability_zones: list[str] | None = None,
    capacity_type: str = "on-demand",
    probe: bool = False,
    tags: dict[str, str] | None = None,
    say: Callable[[str], None] = lambda s: None,
) -> CapacityReport:
    """Check offerings, quota headroom (vCPUs) and, with ``probe``, live capacity in every candidate AZ.

    ``clients``: (service, region) → boto3 client; ``count``: instances wanted; ``regions``: searched
    in order. ``availability_zones``: restrict to these (in preference order); empty: every AZ
    offering the type. ``capacity_type``: ``on-demand`` or ``spot`` (picks the quota code). With
    ``probe`` (On-Demand only) the AZs are probed in rank order and probing stops at the first AZ
    with capacity, so an InsufficientInstanceCapacity in the first AZ moves on to the next;
    ``tags`` go on the probe reservations; ``say`` reports progress.

    Quotas, usage and need are all in vCPUs (need = the type's default vCPUs × ``count``); a quota
    that cannot be read is "unknown", never 0 (see :attr:`CapacityReport.notes`).

    Raises:
        ValueError: ``instance_type`` is not an EC2 type or belongs to no known quota family.
        botocore.exceptions.ClientError, BotoCoreError: an offerings/usage/shape call failed.
        ReservationLeak: (``probe``) a probe reservation could not be cancelled.
    """
    spot = capacity_type == "spot"
    fam = quota_family(instance_type)
    code, qname = (fam.spot_code, fam.spot_name) if spot else (fam.on_demand_code, fam.on_demand_name)
    report = CapacityReport(instance_type, count, capacity_type, None)
    wanted = list(availability_zones or [])
    for region in regions:
        ec2 = clients("ec2", region)
        offered = offered_azs(ec2, instance_type)
        if report.shape is None and offered:
            report.shape = describe_shape(ec2, instance_type)
        azs = [z for z in wanted if z.startswith(region)] or offered
        if not offered:
            report.candidates.append(Candidate(region, "-", False))
            continue
        need = report.shape.vcpus * count if report.shape else 0
        quota = get_quota(clients("service-quotas", region), code, qname)
        if quota.value is None:
            report.notes.append(f"{region}: could not read quota {code} ({quota.note}); headroom unknown")
        used = vcpus_in_use(ec2, fam, spot=spot)
        for i, az in enumerate(azs):
            report.candidates.append(
                Candidate(region, az, az in offered, quota, used, need, preference=wanted.index(az) if az in wanted else i)
            )
        if quota.value is not None and quota.value - used < need:
            desired = int(math.ceil(used + need))
            report.quota_commands.append(quota_increase_command(region, code, desired))
    if probe:
        if spot:
            report.notes.append("--probe uses On-Demand Capacity Reservations; it says nothing about Spot capacity (skipped)")
        else:
            for c in report.ranked():
                if not c.offered:
                    continue
                if c.quota_ok is False:
                    c.probe = "skipped"
                    continue
                say(f"probing {c.region}/{c.az}: reserve {count} × {instance_type}, cancel at once")
                c.probe = probe_capacity(clients("ec2", c.region), c.region, instance_type, c.az, count, tags)
                if c.probe == "AVAILABLE":
                    break
    return report


def render_report(report: CapacityReport) -> list[list[str]]:
    """Table rows (header first) of the ranked candidates."""
    rows = [["rank", "region", "AZ", "quota", "used/limit vCPU", "headroom", "need", "probe", "verdict"]]
    for i, c in enumerate(report.ranked(), 1):
        q = c.quota
        limit = "?" if q is None or q.value is None else f"{q.value:g}"
        rows.append(
            [
                str(i),
                c.region,
                c.az,
                q.code if q else "-",
                f"{c.used_vcpus}/{limit}" if q else "-",
                "?" if c.headroom is None else f"{c.headroom:g}",
                str(c.need_vcpus) if c.offered else "-",
                c.probe or "-",
                c.verdict,
            ]
        )
    return rows

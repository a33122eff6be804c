"""A run's NCCL transport checked at its end (``ray.verify_transport``), and its Ray job recorded.

:class:`TransportCheck` is entered by the driver once Ray is up and left when the run ends:

* entering, it records the run's Ray job in the run directory (:func:`rayft.nccl.fetch.record_job`,
  what ``rayft doctor --run RUN_DIR`` reads to find the workers' logs) and makes the folder of the
  flight recorder's dumps (``train.nccl_flight_recorder``);
* leaving a run that finished, with ``ray.verify_transport`` set, it reads every Ray Train
  worker's NCCL log (Ray's log API on a cluster; the session's log files on an embedded Ray, which
  has no dashboard), judges each worker group (:func:`rayft.nccl.doctor.judge`), writes the
  verdicts to ``rayft_transport.json`` and fails the run unless every rank used the expected
  transport with no failure or environment fault.

Errors: :class:`rayft.train.errors.TrainError`, saying what to do next.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from rayft.config import RayftConfig
from rayft.train.errors import TrainError
from rayft.train.ray_cluster import FLIGHT_RECORDER_DIR, ray_address

__all__ = ["TRANSPORT_RECORD", "TransportCheck", "record_ray_job", "verify_ray_job"]

TRANSPORT_RECORD = "rayft_transport.json"  # in the run directory: the end-of-run verdicts


def record_ray_job(run_dir: str) -> Path | None:
    """Record the Ray job this driver runs in ``run_dir`` (a local run directory; None for a URI)."""
    import ray

    from rayft.nccl.fetch import record_job

    if "://" in run_dir:
        return None
    try:  # where an embedded Ray keeps its workers' logs (Ray has no public accessor for it)
        logs_dir = ray._private.worker._global_node.get_logs_dir_path()
    except AttributeError:
        logs_dir = None
    return record_job(run_dir, ray.get_runtime_context().get_job_id(), None, logs_dir, ray.util.get_node_ip_address())


def verify_ray_job(expect: str, run_dir: str, embedded: bool, instance_type: str | None = None, say: Callable[[str], None] = print) -> list:
    """Judge the NCCL logs of this driver's Ray job's workers against ``expect``; returns the
    :class:`rayft.nccl.doctor.Report` of each worker group.

    Raises:
        TrainError: the logs cannot be read, hold no NCCL line, or some rank failed the check.
    """
    import ray

    from rayft.nccl.doctor import judge
    from rayft.nccl.errors import DoctorError
    from rayft.nccl.fetch import fetch_job, fetch_logs_dir

    ctx = ray.get_runtime_context()
    job_id = ctx.get_job_id()
    what = f"ray.verify_transport={expect}"
    try:
        if embedded:
            logs = fetch_logs_dir(ray._private.worker._global_node.get_logs_dir_path(), job_id, ray.util.get_node_ip_address())
        else:
            logs = fetch_job(job_id, ctx.gcs_address)
    except DoctorError as e:
        raise TrainError(f"{what}: {e}; or unset ray.verify_transport to skip the check") from None
    reports = [(a.name, judge(a.text, expect, instance_type)) for a in logs.attempts]
    if "://" not in run_dir:
        rows = [{"attempt": name, "exit_code": r.exit_code, **_brief(r)} for name, r in reports]
        Path(run_dir, TRANSPORT_RECORD).write_text(json.dumps(rows, indent=2, default=str) + "\n")
    bad: list[str] = []
    for name, r in reports:
        where = f"{name}: " if len(reports) > 1 else ""
        if not r.verdicts and not r.failures:
            raise TrainError(
                f"{what}: the workers' logs hold no NCCL line (a gloo run on CPU workers, or NCCL_DEBUG set below INFO): "
                "the check needs NCCL; unset ray.verify_transport for CPU runs"
            )
        lines = list(r.problems) + [f"{f.who}: {f.line} (cause: {f.cause})" for f in r.failures]
        lines += [str(t) for t in r.timeouts] + ([f"{f.text} (ranks {f.ranks})" for f in r.faults] if r.fail_on_faults else [])
        for line in lines:
            say(f"transport check: {where}{line}")
        if r.exit_code:
            bad.append(lines[0] if lines else f"{where}exit {r.exit_code}")
        else:
            say(f"transport check ({what}): {where}all {len(r.verdicts)} ranks passed")
    if bad:
        raise TrainError(f"{what}: the run's NCCL transport failed the check: {bad[0]} (all of it: rayft doctor --run {run_dir})")
    return [r for _, r in reports]


def _brief(r) -> dict:
    return {
        "verdicts": [
            {"rank": v.rank, "host": v.host, "pid": v.pid, "inter_node": v.inter_node.value, "intra_node": v.intra_node.value, "gdr": v.gdr}
            for v in r.verdicts
        ],
        "problems": r.problems,
        "failures": [asdict(f) for f in r.failures],
        "faults": [asdict(f) for f in r.faults],
    }


class TransportCheck:
    """The driver's context for the run (see the module): record on entry, verify on a finished run's exit."""

    def __init__(self, cfg: RayftConfig, run_dir: str, say: Callable[[str], None] = print):
        self.cfg, self.run_dir, self.say = cfg, run_dir, say

    def __enter__(self) -> TransportCheck:
        if "://" not in self.run_dir:
            if self.cfg.train.nccl_flight_recorder:
                Path(self.run_dir, FLIGHT_RECORDER_DIR).mkdir(parents=True, exist_ok=True)
            record_ray_job(self.run_dir)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        expect = self.cfg.ray.verify_transport
        if exc_type is None and expect:
            embedded = not ray_address(self.cfg)  # as connect_ray decides
            instance = self.cfg.cluster.instance_type if self.cfg.cluster is not None else None
            verify_ray_job(expect, self.run_dir, embedded, instance, self.say)
        return False

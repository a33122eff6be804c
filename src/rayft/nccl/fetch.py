"""A Ray job's Train-worker logs, fetched through Ray's state and log API, as text the doctor reads.

NCCL prints into each worker process's own output, which Ray keeps on the worker's node
(``worker-<worker id>-<job id>-<pid>.out`` and ``.err`` under the session's ``logs/``), not in
``kubectl logs`` nor in the driver's output (unless ``ray.log_to_driver``, and then folded by Ray's
deduplication). :func:`fetch_job`:

1. finds the job in the state API's job list, by submission id (``raysubmit_...``, or
   ``rayft submit``'s ``rayft-...``) or Ray job id (``02000000``);
2. lists its actors: the Ray Train workers (class ``RayTrainWorker``), grouped by placement group
   (one group per worker-group attempt: a restarted group is another NCCL job), and Ray Train's
   controller (class ``TrainController``), whose log says which worker is which rank;
3. fetches each one's ``.out`` and ``.err`` through the log API and joins them into one text per
   attempt, every line prefixed as the driver prints it (``(RayTrainWorker pid=N, ip=...)``).

The dashboard is reached at a URL (``http://HOST:8265``) with the cluster's token sent as
``Authorization: Bearer`` (resolved like ``rayft submit``'s: :func:`rayft.cluster.submit.resolve_token`),
or, with no URL, at the dashboard of the Ray this process is connected to, with Ray's own auth
(a job's driver). Note: Ray's ``ray.util.state.get_log`` sends only the process's own auth header,
so the log files are fetched with the same request through the state client, which carries the token.

A run directory records its Ray job (:func:`record_job`, written by ``rayft train``), so that
:func:`fetch_run` finds the logs from the directory alone; an embedded local Ray has no dashboard,
so its logs are read from the session's log directory, when that is on this machine.

Errors: :class:`DoctorError`, saying what to do next.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayft.nccl.errors import DoctorError

__all__ = ["RUN_RECORD", "Attempt", "JobLogs", "WorkerLog", "fetch_job", "fetch_logs_dir", "fetch_run", "read_records", "record_job"]

RUN_RECORD = "rayft_ray_jobs.json"  # in the run directory: the Ray jobs that ran it, newest last
WORKER_CLASS = "RayTrainWorker"
CONTROLLER_CLASS = "TrainController"
_RAY_MARKER = re.compile(r"^:(?:job_id|actor_name|task_name):")  # Ray's own marker lines in worker logs
_JOB_ID = re.compile(r"^[0-9a-f]{8}$")


@dataclass
class WorkerLog:
    """One process's output: a Ray Train worker's, or Ray Train's controller's."""

    actor_class: str
    pid: int
    ip: str | None
    actor_id: str | None = None
    node_id: str | None = None
    text: str = ""  # its .out, then its .err


@dataclass
class Attempt:
    """One worker-group attempt of a job (one placement group): one NCCL job."""

    name: str
    workers: list[WorkerLog]
    controller: WorkerLog | None = None

    @property
    def text(self) -> str:
        """Every line of the controller and the workers, prefixed as Ray's driver prints them."""
        out: list[str] = []
        for w in ([self.controller] if self.controller else []) + self.workers:
            prefix = f"({w.actor_class} pid={w.pid}" + (f", ip={w.ip})" if w.ip else ")")
            out += [f"{prefix} {line}" for line in w.text.splitlines() if line.strip() and not _RAY_MARKER.match(line)]
        return "\n".join(out) + "\n"


@dataclass
class JobLogs:
    """What :func:`fetch_job` found: the job's ids, its attempts, and notes on what is missing."""

    job_id: str
    submission_id: str | None
    attempts: list[Attempt]
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# The run directory's record of its Ray jobs.


def record_job(run_dir: str | Path, job_id: str, submission_id: str | None, logs_dir: str | None, node_ip: str | None) -> Path:
    """Append this Ray job to ``run_dir``'s :data:`RUN_RECORD` (a resumed run has several) and
    return the file's path. ``logs_dir``: the driver node's Ray session log directory, read when
    the job ran on an embedded Ray without a dashboard."""
    path = Path(run_dir) / RUN_RECORD
    jobs = read_records(run_dir) if path.exists() else []
    entry = {
        "job_id": job_id,
        "submission_id": submission_id,
        "logs_dir": logs_dir,
        "node_ip": node_ip,
        "recorded": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    jobs = [j for j in jobs if j.get("job_id") != job_id] + [entry]
    path.write_text(json.dumps({"jobs": jobs}, indent=2) + "\n")
    return path


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The Ray jobs recorded in ``run_dir``, oldest first.

    Raises:
        DoctorError: no record (a run of an older rayft, or a directory that is not a run), or an
            unreadable one.
    """
    path = Path(run_dir) / RUN_RECORD
    try:
        data = json.loads(path.read_text())
        jobs = data["jobs"]
        if not isinstance(jobs, list) or not all(isinstance(j, dict) and j.get("job_id") for j in jobs):
            raise ValueError("no job ids")
    except FileNotFoundError:
        raise DoctorError(
            f"{path} not found: {run_dir} is not a run directory of `rayft train` (or of one older than the record); "
            "give the job instead: rayft doctor --job RAY_JOB_ID --address http://HOST:8265"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DoctorError(f"cannot read {path} ({e}): give the job instead with --job RAY_JOB_ID") from None
    return jobs


# --------------------------------------------------------------------------------------------
# The state and log API.


def _client(address: str | None, token: str | None):
    from ray.util.state import StateApiClient

    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return StateApiClient(address=address, headers=headers)
    except Exception as e:  # ConnectionError, ValueError (no dashboard), auth errors
        raise DoctorError(f"cannot reach Ray's dashboard{f' at {address}' if address else ''}: {_said(e)}") from None


def _said(e: BaseException) -> str:
    text = (str(e).strip() or type(e).__name__).splitlines()[0]
    if "401" in text or "Authentication required" in text or "Missing authentication token" in text:
        return f"{text} — the cluster needs a token: set RAY_AUTH_TOKEN or pass --token-file"
    if "403" in text or "Authentication failed" in text or "Invalid authentication token" in text:
        return f"{text} — the token was refused (wrong cluster or rotated token?)"
    return text


def _list(client, resource, filters: list[tuple[str, str, str]] | None = None, detail: bool = False) -> list[Any]:
    from ray.util.state.common import ListApiOptions

    try:
        return client.list(resource, options=ListApiOptions(filters=filters, detail=detail, limit=10_000), raise_on_missing_output=False)
    except Exception as e:
        raise DoctorError(f"Ray's state API failed listing {resource.value}: {_said(e)}") from None


def _log(client, actor_id: str, suffix: str) -> str:
    """An actor's ``.out`` or ``.err``, whole (the request ``ray.util.state.get_log`` makes)."""
    query = urllib.parse.urlencode({"actor_id": actor_id, "suffix": suffix, "lines": -1, "media_type": "file", "timeout": 60})
    try:
        r = client._do_request("GET", f"/api/v0/logs/file?{query}", timeout=120)
    except Exception as e:
        raise DoctorError(f"Ray's log API failed for actor {actor_id}: {_said(e)}") from None
    if r.status_code == 404 or (r.status_code != 200 and "not found" in r.text.lower()):
        return ""
    if r.status_code != 200:
        raise DoctorError(f"Ray's log API answered {r.status_code} for actor {actor_id}'s .{suffix}: {r.text.strip()[:200]}")
    return r.content.decode("utf-8", errors="replace")


def _find_job(client, job: str) -> tuple[str, str | None]:
    from ray.util.state.common import StateResource

    for j in _list(client, StateResource.JOBS):
        if job in (j.job_id, j.submission_id):
            return j.job_id, j.submission_id
    if _JOB_ID.match(job):  # a job that is not in the job list (a driver not run through the Jobs API)
        return job, None
    raise DoctorError(
        f"no Ray job {job!r} on this cluster: give a submission id (`ray job list` shows them; `rayft submit` prints one) "
        "or a Ray job id such as 02000000"
    )


def fetch_job(job: str, address: str | None = None, token: str | None = None) -> JobLogs:
    """The Train workers' logs of Ray job ``job`` (submission id or job id), one :class:`Attempt`
    per worker group, through the dashboard at ``address`` (None: the one this process's Ray
    belongs to) with ``token``.

    Raises:
        DoctorError: the dashboard cannot be reached or refuses the token, the job does not exist,
            or it ran no Ray Train worker.
    """
    from ray.util.state.common import StateResource

    client = _client(address, token)
    job_id, submission_id = _find_job(client, job)
    actors = _list(client, StateResource.ACTORS, filters=[("job_id", "=", job_id)], detail=True)
    nodes = {n.node_id: n.node_ip for n in _list(client, StateResource.NODES)}
    workers = [a for a in actors if a.class_name == WORKER_CLASS and a.pid]
    if not workers:
        raise DoctorError(
            f"Ray job {job_id} ran no Ray Train worker ({WORKER_CLASS} actor): is it a `rayft train` job, and did its "
            "workers start? (`ray list actors --filter job_id={job_id}`)"
        )
    controllers = [a for a in actors if a.class_name == CONTROLLER_CLASS and a.pid]

    def fetch(a) -> WorkerLog:
        text = _log(client, a.actor_id, "out") + _log(client, a.actor_id, "err")
        return WorkerLog(a.class_name, int(a.pid), nodes.get(a.node_id), a.actor_id, a.node_id, text)

    with ThreadPoolExecutor(max_workers=8) as pool:
        logs = list(pool.map(fetch, controllers + workers))
    by_id = {w.actor_id: w for w in logs}
    controller = by_id[controllers[-1].actor_id] if controllers else None
    groups: dict[str, list[WorkerLog]] = {}
    for a in workers:
        groups.setdefault(a.placement_group_id or "?", []).append(by_id[a.actor_id])
    attempts = [
        Attempt(f"job {job_id}" + (f" attempt {i}" if len(groups) > 1 else ""), ws, controller)
        for i, ws in enumerate(groups.values(), start=1)
    ]
    notes = []
    if len(groups) > 1:
        notes.append(f"the worker group ran {len(groups)} times (restarts after failures): each attempt is judged on its own")
    empty = [w for w in logs if w.actor_class == WORKER_CLASS and not w.text.strip()]
    if empty:
        notes.append(f"{len(empty)} workers' logs are gone (their node left the cluster?)")
    return JobLogs(job_id, submission_id, attempts, notes)


# --------------------------------------------------------------------------------------------
# A run directory: through the state API, else the session's log files on this machine.


def _from_logs_dir(logs_dir: Path, job_id: str, node_ip: str | None) -> list[WorkerLog]:
    """Ray Train processes of ``job_id`` from the session's files ``worker-<id>-<job id>-<pid>.out|.err``."""
    stems = sorted({p.with_suffix("") for p in logs_dir.glob(f"worker-*-{job_id}-*") if p.suffix in (".out", ".err")})
    found: list[WorkerLog] = []
    for stem in stems:
        text = "".join(p.read_text(errors="replace") for p in (stem.with_suffix(".out"), stem.with_suffix(".err")) if p.exists())
        cls = next((c for c in (WORKER_CLASS, CONTROLLER_CLASS) if f":actor_name:{c}\n" in text[:4000]), None)
        if cls:
            found.append(WorkerLog(cls, int(stem.name.rsplit("-", 1)[1]), node_ip, text=text))
    return found


def fetch_run(run_dir: str | Path, address: str | None = None, token: str | None = None, job: str | None = None) -> JobLogs:
    """The Train workers' logs of the newest Ray job recorded in ``run_dir`` (or of its job
    ``job``): through the dashboard at ``address`` (a URL, or the cluster's GCS address) when
    given, else from the Ray session's log files the record names, when they are on this machine
    (an embedded local Ray, which has no dashboard).

    Raises:
        DoctorError: no record in ``run_dir``, or the logs can be reached neither way.
    """
    jobs = read_records(run_dir)
    entry = next((j for j in jobs if job in (j["job_id"], j.get("submission_id"))), None) if job else jobs[-1]
    if entry is None:
        raise DoctorError(f"{run_dir} records no Ray job {job!r}; it records {', '.join(j['job_id'] for j in jobs)}")
    job_id = entry["job_id"]
    if address is not None:
        return fetch_job(entry.get("submission_id") or job_id, address, token)
    try:
        return fetch_logs_dir(entry.get("logs_dir"), job_id, entry.get("node_ip"), entry.get("submission_id"))
    except DoctorError as e:
        raise DoctorError(f"{e}: pass the cluster's dashboard, --address http://HOST:8265 (or set RAY_ADDRESS)") from None


def fetch_logs_dir(logs_dir: str | Path | None, job_id: str, node_ip: str | None = None, submission_id: str | None = None) -> JobLogs:
    """The Train workers' logs of ``job_id`` read from a Ray session's log directory on this
    machine (the workers of this node only): for an embedded local Ray, which has no dashboard.

    Raises:
        DoctorError: no such directory here, or no Ray Train worker of the job in it.
    """
    d = Path(logs_dir) if logs_dir else None
    found = _from_logs_dir(d, job_id, node_ip) if d is not None and d.is_dir() else []
    workers = [w for w in found if w.actor_class == WORKER_CLASS]
    if not workers:
        where = f"no Ray Train worker of it in {d}" if d is not None and d.is_dir() else f"its log directory {d} is not on this machine"
        raise DoctorError(f"cannot read Ray job {job_id}'s worker logs ({where})")
    controller = next((w for w in found if w.actor_class == CONTROLLER_CLASS), None)
    note = f"read from the Ray session's log files in {d} (the workers of this node)"
    return JobLogs(job_id, submission_id, [Attempt(f"job {job_id}", workers, controller)], [note])

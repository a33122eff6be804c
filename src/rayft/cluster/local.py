"""A real multi-node Ray cluster on this machine, with token authentication: `rayft cluster local up|down`.

One head (``--num-gpus 0``) and N worker nodes, each its own ``ray start`` process tree with its own
``--temp-dir`` (Ray allows one per node), all advertising 127.0.0.1 and with the dashboard bound to
127.0.0.1. Every port is chosen free up front, so several nodes (and other Ray instances) coexist on
one host. ``ray start`` runs through :mod:`rayft.cluster.loopback`, which keeps 127.0.0.1 as the
node IP, so that every Ray process of the cluster listens on 127.0.0.1 only (docs/network.md).

Token auth: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH=<state>/auth_token`` (mode 0600) are
set in the environment of every ``ray start``; the token file is generated once and reused.

``down`` never runs ``ray stop``: that command kills every Ray process of the host, including other
people's clusters and embedded test sessions. It ends only this cluster's processes: those whose
command line names one of its temp dirs or whose environment points at its token file (the job
drivers too), SIGTERM first, SIGKILL after a grace period, and reports anything left.

State (``state.json``, ``auth_token``, the nodes' temp dirs) lives in :func:`default_state_dir`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from rayft.cluster.loopback import loopback_env

HOST = "127.0.0.1"
TOKEN_FILE = "auth_token"
STATE_FILE = "state.json"
# Ports `up` chooses for every node (each also a `ray start --<name with dashes>-port` flag).
NODE_PORTS = ("dashboard_agent_listen", "dashboard_agent_grpc", "metrics_export", "runtime_env_agent")
# A Unix socket path (e.g. <temp>/session_<40 chars>/sockets/plasma_store) must stay under ~107 bytes.
_MAX_TEMP_ROOT = 40


class LocalClusterError(RuntimeError):
    """A node did not start, or the cluster did not come up; the message carries Ray's output."""


@dataclass
class LocalCluster:
    state_dir: str
    gcs_address: str
    dashboard_url: str
    token_file: str
    temp_root: str
    nodes: list[dict] = field(default_factory=list)  # {"name", "temp_dir", "num_cpus", "ports": {name: port}}
    started_at: float = 0.0

    @property
    def token(self) -> str:
        return Path(self.token_file).read_text(encoding="utf-8").strip()


def default_state_dir() -> Path:
    """``$RAYFT_LOCAL_CLUSTER_DIR``, else ``$XDG_CACHE_HOME/rayft/local-cluster`` (``~/.cache/...``)."""
    env = os.environ.get("RAYFT_LOCAL_CLUSTER_DIR")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rayft" / "local-cluster"


def ray_start_command() -> list[str]:
    """``ray start`` of this interpreter's Ray (same version as the client), keeping 127.0.0.1 (:mod:`rayft.cluster.loopback`)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise LocalClusterError("Ray is not installed in this Python environment (pip install 'ray[default]')")
    return [sys.executable, "-m", "rayft.cluster.loopback", "start"]


def _temp_root(state_dir: Path) -> Path:
    root = state_dir / "n"
    if len(str(root)) <= _MAX_TEMP_ROOT:
        return root
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"rayft-lc-{digest}"


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
            p = s.getsockname()[1]
            if p not in ports:
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def ensure_token(state_dir: Path) -> Path:
    """The cluster's token file (created once: 32 random bytes as hex, mode 0600, dir 0700)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    path = state_dir / TOKEN_FILE
    if not path.exists() or not path.read_text(encoding="utf-8").strip():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def _node_env(token_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):  # an inherited token would override the file
        env.pop(k, None)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file), RAY_USAGE_STATS_ENABLED="0")
    loopback_env(env)  # every process of the node, job drivers included, keeps 127.0.0.1 as the node IP
    # Jobs run `python ...`: make that this environment's interpreter (a venv need not be on PATH).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def load_state(state_dir: Path | None = None) -> LocalCluster | None:
    state_dir = Path(state_dir or default_state_dir())
    try:
        return LocalCluster(**json.loads((state_dir / STATE_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


# --------------------------------------------------------------------------- processes


def _proc_ids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()] if os.path.isdir("/proc") else []


def _read0(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            return [x.decode(errors="replace") for x in f.read().split(b"\0") if x]
    except OSError:
        return []


_RAY_CHILD_ENV = ("RAY_RAYLET_PID=", "RAY_JOB_ID=", "RAY_NODE_ID=", "RAY_JOB_CONFIG_JSON_ENV_VAR=")


def _ppid(pid: int) -> int | None:
    stat = _read0(f"/proc/{pid}/stat")
    try:
        return int(stat[0].rsplit(")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def cluster_pids(cluster: LocalCluster) -> dict[int, str]:
    """{pid: command line} of every process of this cluster (Linux /proc; psutil elsewhere).

    A process belongs to the cluster when its command line names one of the cluster's temp dirs or
    its GCS address, when it descends from such a process, or when it is an orphaned Ray worker or
    job driver of it (environment: this cluster's RAY_AUTH_TOKEN_PATH plus a variable that only the
    raylet sets). A shell that merely exported RAY_AUTH_TOKEN_PATH is never matched.
    """
    marks = [cluster.temp_root, f"={cluster.gcs_address}", f" {cluster.gcs_address}"]
    env_mark = f"RAY_AUTH_TOKEN_PATH={cluster.token_file}"
    me = {os.getpid(), os.getppid()}
    found: dict[int, str] = {}
    pids = _proc_ids()
    if pids:
        lines: dict[int, str] = {}
        parent: dict[int, int | None] = {}
        for pid in pids:
            cmd = _read0(f"/proc/{pid}/cmdline")
            if cmd:  # else a kernel thread or gone
                lines[pid] = " ".join(cmd)
                parent[pid] = _ppid(pid)
        for pid, line in lines.items():
            if any(m in line for m in marks):
                found[pid] = line
                continue
            env = _read0(f"/proc/{pid}/environ")
            if env_mark in env and any(e.startswith(_RAY_CHILD_ENV) for e in env):
                found[pid] = line
        for pid, line in lines.items():  # descendants of what matched
            seen, q = set(), parent.get(pid)
            while q and q not in seen and q not in found:
                seen.add(q)
                q = parent.get(q)
            if q in found:
                found[pid] = line
        return {p: c for p, c in found.items() if p not in me}
    try:  # pragma: no cover (non-Linux: command-line marks only)
        import psutil
    except ImportError:  # pragma: no cover
        return found
    for p in psutil.process_iter(["pid", "cmdline"]):  # pragma: no cover
        line = " ".join(p.info["cmdline"] or [])
        if p.pid not in me and any(m in line for m in marks):
            found[p.pid] = line
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as gone
    stat = _read0(f"/proc/{pid}/stat")
    return not (stat and ") Z " in stat[0])


def _http_ok(url: str, token: str | None, timeout: float = 2.0) -> int | None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


def alive_nodes(cluster: LocalCluster) -> int | None:
    """Number of ALIVE nodes by the dashboard's state API, or None when the dashboard does not answer."""
    req = urllib.request.Request(f"{cluster.dashboard_url}/api/v0/nodes?limit=1000", headers={"Authorization": f"Bearer {cluster.token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            data = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    rows = ((data.get("data") or {}).get("result") or {}).get("result") or []
    return sum(1 for n in rows if n.get("state") == "ALIVE")


def is_running(cluster: LocalCluster) -> bool:
    return _http_ok(f"{cluster.dashboard_url}/api/version", cluster.token) == 200


# --------------------------------------------------------------------------- up / down


def _ray_start(args: list[str], env: dict[str, str], say: Callable[[str], None]) -> None:
    cmd = [*ray_start_command(), *args]
    say("$ " + " ".join(cmd))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise LocalClusterError(f"`ray start` failed (exit {r.returncode}):\n{tail}")


def up(
    workers: int = 2,
    cpus_per_worker: float = 1,
    head_cpus: int = 0,
    state_dir: Path | str | None = None,
    say: Callable[[str], None] = print,
    timeout_s: float = 90,
) -> tuple[LocalCluster, bool]:
    """Start the head and ``workers`` worker nodes; returns (cluster, created).

    Idempotent: when the recorded cluster answers, returns it with ``created=False`` and changes
    nothing. A recorded cluster that no longer answers is cleaned up (its processes ended) first.

    Raises:
        LocalClusterError: a ``ray start`` failed or the nodes did not all join within ``timeout_s``
            (whatever was started is stopped again).
    """
    if workers < 0:
        raise LocalClusterError("--workers must be >= 0")
    state_dir = Path(state_dir or default_state_dir()).expanduser()
    old = load_state(state_dir)
    if old is not None:
        if is_running(old):
            return old, False
        say(f"recorded cluster at {old.dashboard_url} does not answer; cleaning it up")
        down(state_dir, say=say)
    token_file = ensure_token(state_dir)
    temp_root = _temp_root(state_dir)
    temp_root.mkdir(parents=True, exist_ok=True)
    gcs, dash, client, dash_metrics, autoscaler_metrics, *_ = ports = _free_ports(5 + 4 * (workers + 1))
    node_ports = [dict(zip(NODE_PORTS, ports[5 + 4 * i : 9 + 4 * i])) for i in range(workers + 1)]
    head_ports = {**node_ports[0], "ray_client_server": client, "dashboard_metrics": dash_metrics, "autoscaler_metrics": autoscaler_metrics}
    cluster = LocalCluster(
        state_dir=str(state_dir),
        gcs_address=f"{HOST}:{gcs}",
        dashboard_url=f"http://{HOST}:{dash}",
        token_file=str(token_file),
        temp_root=str(temp_root),
        started_at=time.time(),
    )
    env = _node_env(token_file)
    common = ["--node-ip-address", HOST, "--num-gpus", "0", "--disable-usage-stats"]

    def per_node(i: int) -> list[str]:
        return [arg for name, port in node_ports[i].items() for arg in (f"--{name.replace('_', '-')}-port", str(port))]

    # record first, so that `down` can clean up a half-started cluster
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(cluster), indent=2))
    try:
        head_dir = temp_root / "head"
        _ray_start(
            [
                "--head",
                "--port",
                str(gcs),
                "--dashboard-host",
                HOST,
                "--dashboard-port",
                str(dash),
                "--include-dashboard",
                "true",
                "--ray-client-server-port",
                str(client),
                "--num-cpus",
                str(head_cpus),
                "--temp-dir",
                str(head_dir),
                *common,
                *per_node(0),
            ],
            # the dashboard's and the autoscaler's own /metrics servers (Ray's defaults: 44227, 44217)
            {**env, "DASHBOARD_METRIC_PORT": str(dash_metrics), "AUTOSCALER_METRIC_PORT": str(autoscaler_metrics)},
            say,
        )
        cluster.nodes.append({"name": "head", "temp_dir": str(head_dir), "num_cpus": head_cpus, "ports": head_ports})
        for i in range(1, workers + 1):
            wdir = temp_root / f"w{i}"
            _ray_start(
                ["--address", cluster.gcs_address, "--num-cpus", _num(cpus_per_worker), "--temp-dir", str(wdir), *common, *per_node(i)],
                env,
                say,
            )
            cluster.nodes.append({"name": f"worker-{i}", "temp_dir": str(wdir), "num_cpus": cpus_per_worker, "ports": node_ports[i]})
        (state_dir / STATE_FILE).write_text(json.dumps(asdict(cluster), indent=2))
        deadline = time.monotonic() + timeout_s
        n = None
        while time.monotonic() < deadline:
            n = alive_nodes(cluster)
            if n == workers + 1:
                break
            time.sleep(1)
        else:
            raise LocalClusterError(
                f"the cluster did not come up within {timeout_s:.0f}s: "
                f"{'dashboard not answering' if n is None else f'{n} of {workers + 1} nodes alive'} "
                f"(logs: {temp_root}/*/session_latest/logs)"
            )
    except BaseException as e:
        try:
            down(state_dir, say=lambda s: None)
        except Exception as cleanup:  # pragma: no cover
            e.add_note(f"cleanup failed too: {cleanup}")
        raise
    return cluster, True


def _num(x: float) -> str:
    if float(x) != int(x):
        raise LocalClusterError(f"ray start needs a whole number of CPUs per node, got {x}")
    return str(int(x))


def down(state_dir: Path | str | None = None, say: Callable[[str], None] = print, grace_s: float = 10) -> tuple[bool, dict[int, str]]:
    """Stop every process of the recorded cluster. Returns (there was a cluster, {pid: cmd} still alive).

    The state file is removed when nothing is left (the token file is kept for the next ``up``).
    """
    state_dir = Path(state_dir or default_state_dir()).expanduser()
    cluster = load_state(state_dir)
    if cluster is None:
        return False, {}
    procs = cluster_pids(cluster)

    # Ray's own order (`ray stop`): raylets first, then the agents/dashboard/drivers, GCS last;
    # SIGTERM each bucket and wait for it, SIGKILL what ignored the signal.
    def bucket(cmd: str) -> int:
        exe = Path(cmd.split()[0]).name if cmd else ""
        return 0 if exe == "raylet" else 2 if exe == "gcs_server" else 1

    stubborn: list[int] = []
    for b in (0, 1, 2):
        group = [p for p in procs if bucket(procs[p]) == b]
        for pid in group:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in group):
            time.sleep(0.2)
        stubborn += [p for p in group if _alive(p)]
    if stubborn:
        names = sorted({Path(procs[p].split()[0]).name for p in stubborn})
        say(f"{len(stubborn)} process(es) ignored SIGTERM for {grace_s:.0f}s ({', '.join(names)}); sending SIGKILL")
    for pid in stubborn:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    time.sleep(0.5)
    # anything that appeared meanwhile (a worker spawned during shutdown) or survived SIGKILL
    late = cluster_pids(cluster)
    for pid in late:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    left = {p: c for p, c in cluster_pids(cluster).items() if _alive(p)}
    say(f"stopped {len(procs)} process(es) of the local cluster at {cluster.dashboard_url}")
    if not left:
        (state_dir / STATE_FILE).unlink(missing_ok=True)
    return True, left

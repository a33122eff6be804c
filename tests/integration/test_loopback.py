"""Ray on 127.0.0.1 only, for both Rays rayft starts: the embedded Ray of `rayft train` (through
connect_ray, in a child process) and `rayft cluster local up --workers 1` (through the CLI: a head
and one worker node, the smallest shape with both kinds of `ray start`; the lane's shared one, before
any job has run on it).

Each test lists every TCP socket the started processes listen on (psutil), and checks it against
the table of docs/network.md, which it reads: every listener's role (by process and port) is a row
for that Ray, its address is loopback (or the row's address), a request without a token is refused
(HTTP 401, gRPC UNAUTHENTICATED) or, for the /metrics rows, answered; and every row for that Ray is
there. Every request goes to 127.0.0.1; nothing is sent to any other address.
"""

import ipaddress
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from conftest import env_without_ray_address

from rayft.cluster import local

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "network.md"

pytestmark = pytest.mark.integration
USES_LOCAL_CLUSTER = True  # the shared `rayft cluster local` (tests/conftest.py), checked fresh before the job modules use it


# --------------------------------------------------------------------------- the table


def documented() -> dict[str, dict]:
    """docs/network.md's table: {role: {"processes", "started_by", "fixed_train_port", "address", "protocol", "token"}}."""
    rows = {}
    lines = DOC.read_text().split("| Role |", 1)[1].splitlines()[2:]
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        role, processes, started_by, port, address, protocol, token = cells
        fixed = re.search(r"train: (\d+)", port)
        rows[re.findall(r"`([^`]+)`", role)[0]] = {
            "processes": set(re.findall(r"`([^`]+)`", processes)),
            "started_by": {s.strip() for s in started_by.split(",")},
            "fixed_train_port": int(fixed.group(1)) if fixed else None,
            "address": re.findall(r"`([^`]+)`", address)[0],
            "protocol": protocol.split()[0],
            "token": token.split()[0],
        }
    return rows


def test_the_table_is_read():
    rows = documented()
    assert {"gcs", "raylet", "core-worker", "metrics", "runtime-env-agent", "dashboard"} <= set(rows)
    assert all(r["protocol"] in ("gRPC", "HTTP", "c10d") and r["token"] in ("yes", "no") for r in rows.values())
    assert rows["agent-http"]["fixed_train_port"] == 52365 and rows["gcs"]["fixed_train_port"] is None


# --------------------------------------------------------------------------- listeners


def process_kind(p: psutil.Process, driver_pid: int | None = None) -> str:
    """The table's name for a Ray process, from its command line (Ray renames its Python processes)."""
    if p.pid == driver_pid:
        return "driver"
    cmd = " ".join(p.cmdline())
    exe = Path(p.cmdline()[0]).name if p.cmdline() else ""
    for kind, mark in [
        ("gcs_server", exe == "gcs_server"),
        ("raylet", exe == "raylet"),
        ("dashboard-agent", cmd.startswith("ray::DashboardAgent")),
        ("runtime-env-agent", cmd.startswith("ray::RuntimeEnvAgent")),
        ("dashboard", "dashboard/dashboard.py" in cmd),
        ("monitor", "autoscaler/_private/monitor.py" in cmd),
        ("ray-client-server", "ray.util.client.server" in cmd),
        ("worker", cmd.startswith("ray::") or "default_worker.py" in cmd),
    ]:
        if mark:
            return kind
    return cmd[:120]


def listeners(pids, driver_pid=None) -> list[tuple[str, str, int]]:
    """(process kind, address, port) of every listening TCP socket of these processes."""
    found = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            kind = process_kind(p, driver_pid)
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((kind, c.laddr.ip, c.laddr.port))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return sorted(found)


def is_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped:
        a = a.ipv4_mapped  # a dual-stack socket bound to 127.0.0.1
    return a.is_loopback


def off_loopback(found, table, setup):
    """Listeners on another address than loopback that no row for this Ray names (process and address)."""
    allowed = {(proc, r["address"]) for r in table.values() if setup in r["started_by"] for proc in r["processes"]}
    return [(k, ip, port) for k, ip, port in found if not is_loopback(ip) and (k, ip) not in allowed]


def listened_elsewhere(port: int | None) -> bool:
    """Whether some process on this host listens on ``port`` (the caller knows its own do not)."""
    return port is not None and any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.net_connections(kind="inet"))


def http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


# one read-only-ish method of each gRPC service Ray listens with; the first one the server has answers
GRPC_METHODS = [
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.ObjectManagerService/Pull",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
    "/ray.rpc.ReporterService/HealthCheck",
    "/ray.rpc.RayletDriver/ClusterInfo",
]


def grpc_status_without_token(port: int) -> str:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        for method in GRPC_METHODS:
            call = ch.unary_unary(method, request_serializer=lambda _: b"", response_deserializer=lambda b: b)
            try:
                call(None, timeout=10)
                return "OK"
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    return e.code().name
    return "UNIMPLEMENTED"


def check(found, roles_of, table, setup, held_at_start=frozenset()):
    """The table's facts for every listener; returns {role: [port, ...]} seen. ``held_at_start``: see
    :func:`missing_roles`."""
    assert found, "no listening socket found: the process list is wrong"
    bad = off_loopback(found, table, setup)
    assert not bad, f"listening on a non-loopback address, not named in docs/network.md: {bad}"
    seen: dict[str, list[int]] = {}
    for kind, ip, port in found:
        role = roles_of(kind, port)
        row = table.get(role)
        assert row is not None and setup in row["started_by"], f"{kind} listens on {ip}:{port} as {role!r}: no row for {setup}"
        assert kind in row["processes"], (kind, role, row)
        seen.setdefault(role, []).append(port)
        if row["protocol"] == "HTTP":
            got = http_status(port, "/metrics" if row["token"] == "no" else "/api/jobs/")
            assert got == (200 if row["token"] == "no" else 401), f"{role} {ip}:{port} without a token: HTTP {got}"
            if role == "agent-http":  # its health paths are public
                assert http_status(port, "/api/healthz") not in (None, 401, 403)
        else:
            got = grpc_status_without_token(port)
            assert got == "UNAUTHENTICATED", f"{role} {ip}:{port} without a token: gRPC {got}"
    missing = missing_roles(table, setup, seen, held_at_start)
    assert not missing, f"docs/network.md lists {missing} for {setup}, but nothing listens as that"
    held = {r for r, row in table.items() if setup in row["started_by"]} - set(seen)
    if held:
        print(f"not started, their fixed ports held by other processes on this host: {sorted(held)}")
    return seen


def metrics_only_on_loopback(found, port):
    """/metrics (session name, process RSS/CPU, no token): served on 127.0.0.1 and nowhere else."""
    on_port = [ip for _, ip, p in found if p == port]
    assert on_port and all(is_loopback(ip) for ip in on_port), (port, on_port)
    assert http_status(port, "/metrics") == 200


# --------------------------------------------------------------------------- embedded Ray

# A driver: connect_ray with a minimal config, one task (so that a worker process exists), the
# facts the test needs on stdout; then it waits for a line on stdin and shuts Ray down.
DRIVER = r"""
import json, os, sys
import ray
from rayft.config import RayftConfig
from rayft.train.ray_cluster import connect_ray

cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": json.loads(sys.argv[1])})
where = connect_ray(cfg)

@ray.remote(num_cpus=1)
def node_ip():
    return ray.util.get_node_ip_address()

print(json.dumps({"where": where, "task_ip": ray.get(node_ip.remote()), "driver_ip": ray.util.get_node_ip_address(),
                  "nodes": [n for n in ray.nodes() if n["Alive"]], "gcs": ray.get_runtime_context().gcs_address,
                  "auth_mode": os.environ.get("RAY_AUTH_MODE")}, default=str), flush=True)
sys.stdin.readline()
ray.shutdown()
"""


def start_driver(ray_cfg: dict, env: dict, cwd) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(ray_cfg)],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        stop_tree(proc)
        pytest.fail(f"the driver did not start: {proc.stderr.read()[-3000:]}")
    return proc, json.loads(line)


def end_driver(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]


def stop_tree(proc: subprocess.Popen) -> None:
    """End the driver and whatever it started that is still there (its own processes only)."""
    try:
        me = psutil.Process(proc.pid)
        tree = [*me.children(recursive=True), me]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)


def wait_for_roles(list_now, roles_of, wanted) -> list:
    """Listeners, once every wanted role is there (the agents and /metrics servers come up a little late), or after 60 s.

    ``wanted``: a set of roles, or a callable of the roles seen that returns those still missing."""
    missing = wanted if callable(wanted) else (lambda seen: wanted - seen)
    deadline, found = time.monotonic() + 60, list_now()
    while time.monotonic() < deadline and missing({roles_of(k, p) for k, _, p in found}):
        time.sleep(1)
        found = list_now()
    print("\n".join(f"{k:20} {ip:>18}:{p}" for k, ip, p in found))
    return found


def missing_roles(table, setup, seen, held_at_start=frozenset()) -> set:
    """Rows for this Ray with nothing listening as them, but for a fixed port of the embedded Ray
    (Ray's defaults) that another process on this host holds, now or when this Ray started
    (``held_at_start``: ports): Ray does not start that server then. (The other test process's
    embedded Ray can give the port back meanwhile: seen 2026-12-03.)"""
    missing = {r for r, row in table.items() if setup in row["started_by"]} - set(seen)

    def held(port):
        return port is not None and (port in held_at_start or listened_elsewhere(port))

    return {r for r in missing if not (setup == "train" and held(table[r]["fixed_train_port"]))}


def clean_env() -> dict:
    return {k: v for k, v in env_without_ray_address().items() if not k.startswith("RAY_ENABLE_WINDOWS")}


def test_embedded_ray_listens_on_loopback_only(tmp_path):
    table = documented()
    home = tmp_path / "home"
    home.mkdir()
    env = {**clean_env(), "HOME": str(home)}  # Ray's default token file goes here: this test's own
    fixed = {row["fixed_train_port"] for row in table.values() if "train" in row["started_by"]}
    held_at_start = {port for port in fixed if listened_elsewhere(port)}  # another Ray's, on this host
    proc, info = start_driver({"num_cpus": 1}, env, tmp_path)
    try:
        assert info["where"] == "embedded local Ray"
        (node,) = info["nodes"]
        known = {
            int(info["gcs"].rsplit(":", 1)[1]): "gcs",
            node["NodeManagerPort"]: "raylet",
            node["ObjectManagerPort"]: "object-manager",
            node["MetricsAgentPort"]: "agent-grpc",
            node["DashboardAgentListenPort"]: "agent-http",
            node["MetricsExportPort"]: "metrics",
            node["RuntimeEnvAgentPort"]: "runtime-env-agent",
        }
        by_kind = {"driver": "core-worker", "worker": "core-worker", "dashboard": "dashboard-metrics", "monitor": "autoscaler-metrics"}

        def roles_of(kind, port):
            return known.get(port) or by_kind.get(kind, kind)

        def list_now():
            return listeners([proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))], driver_pid=proc.pid)

        found = wait_for_roles(list_now, roles_of, lambda seen: missing_roles(table, "train", seen, held_at_start))
        bad = off_loopback(found, table, "train")
        assert not bad, f"listening on a non-loopback address, not named in docs/network.md: {bad}"
        metrics_only_on_loopback(found, node["MetricsExportPort"])
        check(found, roles_of, table, "train", held_at_start)
        # the driver, the GCS and a task's worker all on 127.0.0.1; token auth on, the token file 0600
        assert node["NodeManagerAddress"] == info["driver_ip"] == info["task_ip"] == "127.0.0.1"
        assert info["gcs"].startswith("127.0.0.1:") and info["auth_mode"] == "token"
        token = home / ".ray" / "auth_token"
        assert oct(token.stat().st_mode & 0o777) == "0o600" and len(token.read_text()) == 64
        end_driver(proc)
    finally:
        stop_tree(proc)


# --------------------------------------------------------------------------- rayft cluster local


LOCAL_PORTS = {  # state.json's nodes[].ports -> role
    "dashboard_agent_listen": "agent-http",
    "dashboard_agent_grpc": "agent-grpc",
    "metrics_export": "metrics",
    "runtime_env_agent": "runtime-env-agent",
    "ray_client_server": "client-server",
    "dashboard_metrics": "dashboard-metrics",
    "autoscaler_metrics": "autoscaler-metrics",
}


def test_local_cluster_listens_on_loopback_only(local_cluster, tmp_path):
    """On the lane's shared `rayft cluster local up --workers 1 --cpus-per-worker 1` (tests/conftest.py),
    fresh: this module runs before the modules that submit jobs to it (conftest.LANES), and no driver
    has joined it before this test's own."""
    table = documented()
    c, shared_env = local_cluster
    env = {**clean_env(), "RAYFT_LOCAL_CLUSTER_DIR": shared_env["RAYFT_LOCAL_CLUSTER_DIR"]}
    proc = None
    try:
        assert local.alive_nodes(c) == 2

        # nothing of the cluster listens off loopback (checked before any driver joins)
        kinds = {"gcs_server", "raylet", "dashboard-agent", "runtime-env-agent", "dashboard", "monitor", "ray-client-server"}
        found = wait_for_roles(lambda: listeners(local.cluster_pids(c)), lambda k, p: k, kinds)
        bad = off_loopback(found, table, "local")
        assert not bad, f"listening on a non-loopback address, not named in docs/network.md: {bad}"

        # a driver joins at the GCS address from a plain shell (connect_ray keeps 127.0.0.1 by itself)
        # and runs a task on the worker node: the cluster's processes with it, driver included
        auth = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": c.token_file}
        proc, info = start_driver({"address": c.gcs_address}, auth, tmp_path)
        assert info["where"] == c.gcs_address and len(info["nodes"]) == 2
        assert info["driver_ip"] == info["task_ip"] == "127.0.0.1"
        known = {int(c.gcs_address.rsplit(":", 1)[1]): "gcs", int(c.dashboard_url.rsplit(":", 1)[1]): "dashboard"}
        known.update({port: LOCAL_PORTS[name] for n in c.nodes for name, port in n["ports"].items()})
        for n in info["nodes"]:  # Ray picks the raylets' own two ports: the GCS's node table has them
            assert n["NodeManagerAddress"] == "127.0.0.1"
            known.update({n["NodeManagerPort"]: "raylet", n["ObjectManagerPort"]: "object-manager"})
        by_kind = {"driver": "core-worker", "worker": "core-worker"}

        def roles_of(kind, port):
            return known.get(port) or by_kind.get(kind, kind)

        def list_now():
            pids = [*local.cluster_pids(c), proc.pid]
            return listeners(pids, driver_pid=proc.pid)

        found = wait_for_roles(list_now, roles_of, lambda seen: missing_roles(table, "local", seen))
        assert not off_loopback(found, table, "local"), off_loopback(found, table, "local")
        for n in c.nodes:
            metrics_only_on_loopback(found, n["ports"]["metrics_export"])
        seen = check(found, roles_of, table, "local")
        assert len(seen["gcs"]) == 1 and len(seen["raylet"]) == len(seen["object-manager"]) == len(seen["metrics"]) == 2
        end_driver(proc)

        # Ray's own CLI on the GCS address needs RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (docs/network.md)
        r = subprocess.run(
            [str(Path(sys.executable).parent / "ray"), "status", "--address", c.gcs_address],
            env={**auth, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and "Active:" in r.stdout, r.stdout + r.stderr[-3000:]
    finally:
        if proc is not None:
            stop_tree(proc)


# --------------------------------------------------------------------------- a training run's own listener


def test_torch_rendezvous_store_is_as_documented():
    """The one non-loopback row: PyTorch's TCPStore server (created by Ray Train's torch backend in
    the rank-0 worker) listens on the address docs/network.md names whatever host it is given, and
    serves a client without any credential."""
    import datetime

    from torch.distributed import TCPStore

    row = documented()["torch-store"]
    assert row["started_by"] == {"run"} and row["token"] == "no" and not is_loopback(row["address"])
    server = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    mine = [(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert (row["address"], server.port) in mine, mine
    client = TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=30))
    client.set("k", "v")
    assert server.get("k") == b"v"

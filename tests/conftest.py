"""Shared test helpers: where ../shared is, the offline Qwen2.5 tokenizer (built once), the
embedded local Ray that the integration modules of one pytest process share (started once), and the
order the modules run in.

``ray_local``: the embedded Ray of `rayft train` (connect_ray: every Ray service on 127.0.0.1
only), 2 logical CPUs. Starting one costs seconds of CI on 2 cores, so every module of a process that asks
for it uses the same one, started by the first such module; the unit modules stop it first
(release_shared_rays: a unit test must not find Ray up); a module that needs another Ray in this
process (a multi-node ``Cluster``) stops it too with ``embedded_ray.stop()``. ``local_cluster``: one
`rayft cluster local` (a head and one worker node, token auth) shared the same way by the loopback
module and the modules that submit jobs (:class:`SharedLocalCluster`).

The integration modules are collected first, in :data:`ORDER`, then the unit tests. ``make test``
runs pytest-xdist with 2 processes and the schedule of :func:`pytest_xdist_make_scheduler`: each
of two lanes of integration modules (:data:`LANES`) goes whole to one process (each module's
fixtures, each a Ray run or a cluster, run once; the two modules that submit jobs to the local
multi-process cluster in one lane: side by side each took twice as long), then each unit test on its own,
handed out in collection order. Before it (2026-12-02), with
``--dist loadgroup`` and no group marked, xdist handed out every test on its own: an integration
module's tests landed on both processes and each ran the module's fixtures, so the fault-tolerance
module's uninterrupted run and its two `rayft train` processes (each with its own embedded Ray) ran
twice at once, six embedded Rays on 2 cores; its two SIGTERM runs then missed 480 s and 600 s
deadlines (pytest 2,102 s).
"""

import os
from pathlib import Path

import pytest

# Ray Train's timing for test runs on one host, in this process and every process it starts (the
# `rayft train` and `rayft cluster local` processes inherit it): the controller polls its workers
# every 0.2 s instead of 2 s, so a run ends (and a lost worker is seen) ~3 s sooner; and no
# preemption watcher (an actor per run that polls for node draining: nothing drains a test host).
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# The planner's model sizes are counted in every test, not read from a memo (tests/unit/test_dims_memo.py
# tests the memo in its own directories).
os.environ.setdefault("RAYFT_DIMS_MEMO", "off")
# The input-hash memo (rayft.data.cache.HashMemo) of test runs stays out of the user's ~/.cache.
os.environ.setdefault("RAYFT_HASH_MEMO", os.path.join(__import__("tempfile").gettempdir(), f"rayft-test-hash-memo-{os.getpid()}.json"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def env_without_ray_address() -> dict[str, str]:
    """This process's environment without RAY_ADDRESS or RAY_AUTH_*: for a `rayft` process that must
    start or find its own Ray, not join one this environment names."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH_"))}


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test with a clear message when shared/ is absent."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"needs {p} (the project's ../shared folder), which is absent here")
    return p


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from rayft.data.tokenizer import load_tokenizer

    return load_tokenizer("qwen2.5")


#: The integration modules in two lanes, one per xdist process (:func:`pytest_xdist_make_scheduler`);
#: the unit tests then go to whichever process is free, so both end together (2026-12-03 evening, 2 cores:
#: lane 0's modules ~550 s, lane 1's ~470 s, the whole suite 665 s); :data:`ORDER`: the order they
#: are collected in (a module not listed runs after them, a unit of its own).
LANES = (
    # the fault-tolerance module (three runs at once on one Ray) with the single-run modules
    (
        "test_fault_tolerance.py",
        "test_train_ray.py",
        "test_data_ray.py",
        "test_aws_moto.py",
        "test_ray_start_retry.py",
        "test_ray_start_background.py",
        "test_token_store_s3.py",
    ),
    # the modules of the shared `rayft cluster local` (local_cluster: a multi-process Ray): the loopback module
    # first (it checks the fresh cluster's listeners, before any job), then the two whose jobs run on it; then
    # the modules with a Ray of their own, then those of the embedded one (ray_local: started once for the two)
    (
        "test_loopback.py",
        "test_submit.py",
        "test_doctor_job.py",
        "test_shared_storage.py",
        "test_bench_train_ray.py",
        "test_bench_collectives.py",
    ),
)
ORDER = [m for lane in LANES for m in lane]
#: Unit modules with module-scoped fixtures worth building once (an `mlflow server`, model exports,
#: subprocess imports): each goes whole to one process instead of its fixtures running on both.
WHOLE_UNIT_MODULES = (
    "test_eval_harness.py",
    "test_families.py",
    "test_generation.py",
    "test_memory_plan.py",
    "test_packing_efficiency.py",
    "test_step.py",
    "test_tracking.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Integration modules first, in :data:`ORDER`; then the unit tests (each module keeps its tests' order)."""

    def rank(it) -> tuple[int, int]:
        path = Path(it.path)
        if path.parent.name != "integration":
            return (1, 0)
        return (0, ORDER.index(path.name) if path.name in ORDER else len(ORDER))

    items.sort(key=rank)  # stable


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (the GPU host's) must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """xdist's schedule (``-n N``, xdist's default ``--dist load``): each lane of :data:`LANES` is one
    unit of work, kept on one process (an integration module not in a lane: a unit of its own); a
    unit test is a unit of its own, but for the modules of :data:`WHOLE_UNIT_MODULES`, one unit each. Units are handed out in collection order (no reordering by
    size): with 2 processes, one lane each, then the unit tests to whichever is free. Another
    ``--dist`` given on the command line is left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationModulesWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if "/integration/" not in f"/{path}":
                return path if path.rsplit("/", 1)[-1] in WHOLE_UNIT_MODULES else nodeid
            name = path.rsplit("/", 1)[-1]
            return next((f"lane-{i}" for i, lane in enumerate(LANES) if name in lane), path)

    config.option.loadscopereorder = False
    return IntegrationModulesWhole(config, log)


class EmbeddedRay:
    """The one embedded local Ray of this test session (see the module's docstring)."""

    def __init__(self):
        self.cpus: int | None = None  # the logical CPUs of the running Ray; None: not up

    def start(self, num_cpus: int = 2) -> None:
        """Start it with ``num_cpus`` logical CPUs, or keep it if it is up with as many (else restart it)."""
        if self.cpus == num_cpus:
            return
        self.stop()
        import ray

        from rayft.config import RayftConfig
        from rayft.train.ray_cluster import connect_ray

        assert not ray.is_initialized(), "a test left its own Ray running"
        cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"num_cpus": num_cpus}})
        assert connect_ray(cfg) == "embedded local Ray"
        self.cpus = num_cpus

    def stop(self) -> None:
        if self.cpus is not None:
            import ray

            ray.shutdown()
            self.cpus = None


@pytest.fixture(scope="session")
def embedded_ray():
    e = EmbeddedRay()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def ray_local(embedded_ray):
    """The embedded Ray of `rayft train` (connect_ray: every Ray service on 127.0.0.1 only), 2 logical CPUs,
    shared by the modules that use it (stopped at the end of the session)."""
    embedded_ray.start()
    return embedded_ray


class SharedLocalCluster:
    """One `rayft cluster local up --workers 1 --cpus-per-worker 1` (a head with no CPU and one
    1-CPU worker node, token auth, through the CLI as a user starts it) for the modules of one
    pytest process that need a multi-node cluster (``local_cluster``): the loopback, submit and
    doctor-job modules, one after the other in one lane, each with ``USES_LOCAL_CLUSTER = True``. A
    start costs seconds of both cores of the CI machine, and an idle node ~4% of a core: the first
    module without the flag stops it (``release_shared_rays``). The loopback module uses it first
    (:data:`LANES`): it checks the fresh cluster's listeners against docs/network.md, which must be
    before any job (after the other modules' jobs a dashboard agent also listened on a port the
    table does not name: 127.0.0.1, 2026-12-03; not investigated further)."""

    def __init__(self):
        self.state: Path | None = None
        self.env: dict[str, str] = {}

    def start(self):
        """``(the cluster's state, the environment to run rayft with)``; starts it on the first call."""
        import subprocess
        import sys
        import tempfile

        from rayft.cluster import local

        if self.state is None:
            state = Path(tempfile.mkdtemp(prefix="rlc-", dir="/tmp"))  # short: Ray's socket paths must stay < 108 bytes
            env = env_without_ray_address()
            env["RAYFT_LOCAL_CLUSTER_DIR"] = str(state)
            self.state, self.env = state, env
            cmd = [sys.executable, "-m", "rayft.cli", "cluster", "local", "up", "--workers", "1", "--cpus-per-worker", "1"]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
        c = local.load_state(self.state)
        assert c is not None, f"no cluster recorded in {self.state}"
        return c, self.env

    def stop(self) -> None:
        """`rayft cluster local down` (:func:`down_local_cluster`)."""
        if self.state is not None:
            state, self.state = self.state, None
            down_local_cluster(state, self.env)


def down_local_cluster(state: Path, env: dict[str, str]) -> None:
    """`rayft cluster local down` of the cluster recorded in ``state`` (run with ``env``); every
    process it leaves is killed, then reported (AssertionError); ``state`` is removed."""
    import shutil
    import subprocess
    import sys

    from rayft.cluster import local

    c = local.load_state(state)
    cmd = [sys.executable, "-m", "rayft.cli", "cluster", "local", "down"]
    d = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    left = local.cluster_pids(c) if c else {}
    for pid in left:  # never leave Ray processes behind, even when `down` is broken
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    shutil.rmtree(state, ignore_errors=True)
    assert d.returncode == 0 and not left, f"down left processes {left}: {d.stdout}{d.stderr}"


@pytest.fixture(scope="session")
def shared_local_cluster():
    holder = SharedLocalCluster()
    yield holder
    holder.stop()


@pytest.fixture(scope="module")
def local_cluster(shared_local_cluster):
    """``(LocalCluster, env)`` of this process's :class:`SharedLocalCluster` (started on first use)."""
    return shared_local_cluster.start()


@pytest.fixture(scope="module", autouse=True)
def release_shared_rays(request, embedded_ray, shared_local_cluster):
    """Unit tests run without Ray up in their process: an integration module before them in the same
    pytest process may have left the shared embedded Ray or local cluster up. A module without
    ``USES_LOCAL_CLUSTER = True`` stops the shared local cluster."""
    if Path(request.path).parent.name == "unit":
        embedded_ray.stop()
    if not getattr(request.module, "USES_LOCAL_CLUSTER", False):
        shared_local_cluster.stop()


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A one-rank gloo process group for the module (a file store: no TCP port to collide with another test process)."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()

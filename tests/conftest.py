"""Shared test helpers: where ../shared is, the offline Qwen2.5 tokenizer (built once), and the
embedded local Ray that the integration modules share (started once).

``ray_local``: the embedded Ray of `rayft train` (connect_ray: every Ray service on 127.0.0.1
only), 2 CPUs. Starting one costs seconds of CI on 2 cores, so every module that asks for it uses
the same one: it is started (and checked to be the embedded default) when the first such module
starts and stopped when the last of them in a row ends. Collection puts those modules after the other modules
of their folder, so they run in a row and the Ray starts once; a module that needs another Ray in
this process (a multi-node ``Cluster``) stops it first with ``embedded_ray.stop()``.
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
# The input-hash memo (rayft.data.cache.HashMemo) of test runs stays out of the user's ~/.cache.
os.environ.setdefault("RAYFT_HASH_MEMO", os.path.join(__import__("tempfile").gettempdir(), f"rayft-test-hash-memo-{os.getpid()}.json"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


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


def ray_local_modules(items) -> set[Path]:
    """The test modules with a test on the shared embedded Ray."""
    return {Path(it.path) for it in items if "ray_local" in getattr(it, "fixturenames", ())}


def pytest_collection_modifyitems(session, config, items):
    """Within each folder, the modules on the shared embedded Ray run last (in their own order)."""
    folders: dict[Path, int] = {}
    for it in items:
        folders.setdefault(Path(it.path).parent, len(folders))
    on_ray = ray_local_modules(items)
    items.sort(key=lambda it: (folders[Path(it.path).parent], Path(it.path) in on_ray))  # stable: each group keeps its order


class EmbeddedRay:
    """The one embedded local Ray of this test session (see the module's docstring)."""

    def __init__(self):
        self.up = False

    def start(self) -> None:
        if self.up:
            return
        import ray

        from rayft.config import RayftConfig
        from rayft.train.ray_cluster import connect_ray

        assert not ray.is_initialized(), "a test left its own Ray running"
        cfg = RayftConfig.model_validate({"data": {"train_files": ["unused.jsonl"]}, "ray": {"num_cpus": 2}})
        assert connect_ray(cfg) == "embedded local Ray"
        self.up = True

    def stop(self) -> None:
        if self.up:
            import ray

            ray.shutdown()
            self.up = False


@pytest.fixture(scope="session")
def embedded_ray():
    e = EmbeddedRay()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def ray_local(request, embedded_ray):
    """The embedded Ray of `rayft train` (connect_ray: every Ray service on 127.0.0.1 only), 2 CPUs,
    shared by the modules that use it: kept up for the next module only when that one uses it too."""
    embedded_ray.start()
    yield embedded_ray
    items = request.session.items
    last = max(i for i, it in enumerate(items) if Path(it.path) == Path(request.path))
    if last + 1 >= len(items) or Path(items[last + 1].path) not in ray_local_modules(items):
        embedded_ray.stop()

"""Reaching Ray and checking what it has: the connection, workers against resources, shared
checkpoint storage across nodes, and the workers' environment."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import re
import secrets
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rayft.cluster.loopback import LOOPBACK, is_loopback_address, keep_localhost
from rayft.config import RayftConfig
from rayft.train.errors import TrainError

#: what :func:`connect_ray` returns when it started a Ray of its own in this process
EMBEDDED = "embedded local Ray"
#: what :func:`connect_ray` returns for a Ray this process had initialised before it was called
EXISTING = "existing"
#: set once :func:`connect_ray` has started an embedded Ray in this process (:func:`end_embedded_ray_for_the_exit`)
EMBEDDED_STARTED = threading.Event()


def ray_address(cfg: RayftConfig) -> str | None:
    """The cluster the run joins: ``ray.address``, else ``RAY_ADDRESS``; None for an embedded local Ray."""
    return cfg.ray.address or os.environ.get("RAY_ADDRESS")


def connect_ray(cfg: RayftConfig) -> str:
    """Join the cluster at ray.address / RAY_ADDRESS, else start an embedded local Ray. Returns which."""
    import ray

    address = ray_address(cfg)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    kwargs: dict[str, Any] = dict(
        logging_level="ERROR",
        log_to_driver=cfg.ray.log_to_driver,
        include_dashboard=False,
        configure_logging=True,
    )
    if ray.is_initialized():
        return EXISTING
    if address:
        if address.startswith(("http://", "https://")):
            raise TrainError(
                f"Ray address {address} is a dashboard (job submission) URL: use `rayft submit` with it, or give "
                "the cluster's GCS address (host:6379, or `auto` on a cluster node) to `rayft train`"
            )
        # a cluster on this host's loopback (`rayft cluster local`): Ray would turn 127.0.0.1 into the host's address
        with keep_localhost() if is_loopback_address(address) else contextlib.nullcontext():
            ray.init(address=address, **kwargs)
        return address
    # "local": never attach to a `ray start` cluster by accident. Every Ray service listens on
    # 127.0.0.1 only; Ray turns token auth on by itself unless RAY_AUTH_MODE says otherwise (docs/network.md).
    ensure_default_token()

    def start() -> None:
        with keep_localhost(), without_preemption_watcher():
            ray.init(address="local", num_cpus=cfg.ray.num_cpus, _node_ip_address=LOOPBACK, **kwargs)

    before = child_pids()
    try:
        start()
    except Exception as e:
        # Ray waits a fixed 30 s for its raylet to register (ray._private.node); a host whose cores
        # are busy can miss that. Its processes are left running: stop them, then start once more.
        if "timed out during startup" not in str(e):
            raise
        stopped = stop_failed_ray_start(before)
        ray.shutdown()
        print(
            f"[rayft] the embedded Ray did not start within Ray's 30 s (a busy host?): stopped the {stopped} "
            "process(es) it had started; starting it once more",
            file=sys.stderr,
            flush=True,
        )
        start()
    EMBEDDED_STARTED.set()
    return EMBEDDED


def end_embedded_ray_for_the_exit() -> bool:
    """Where this process started an embedded Ray (:data:`EMBEDDED_STARTED`) that is still up, make
    ready to end the process without Ray's shutdown and return True: take that shutdown out of the
    ``atexit`` handlers, run every other one now (the run lock's, temporary directories', logging's
    flush; they do not run again), and SIGKILL what Ray's own processes started
    (:func:`stop_what_ray_started`). The caller then ends the process at once, without the
    interpreter's teardown (``os._exit``: :func:`rayft.commands.train.exit_now`). Else False: the
    process exits as usual. For the ``rayft`` command's exit after a command that succeeded
    (:func:`rayft.cli.run`): never from a library call or a notebook, whose process goes on.

    Why: ``ray.shutdown()`` at exit stops each process Ray started and waits for it: 1.4-1.6 s on the
    2-core development machine after a ``TorchTrainer`` run, and the process's whole exit took
    2.2 s on the GPU host (bench/NOTES.md §47-§48). An embedded Ray keeps nothing that must outlive
    the run. Ray starts its GCS, raylet and log monitor with ``PR_SET_PDEATHSIG`` (SIGKILL when the
    thread that started them ends, which the exit does); the raylet's agents and workers are not
    tied to it (its dashboard agent, holding port 52365, lived ~80 s on), hence the SIGKILL. Why not
    a plain exit without Ray's shutdown: the interpreter's teardown under Ray's live core worker
    segfaulted 1 exit in 8."""
    import ray

    if not (EMBEDDED_STARTED.is_set() and ray.is_initialized()):
        return False
    atexit.unregister(ray.shutdown)
    atexit._run_exitfuncs()  # CPython's own: the handlers as a normal exit runs them, last registered first
    stop_what_ray_started()
    return True


def stop_what_ray_started() -> int:
    """SIGKILL, without waiting, every process that the embedded Ray's own processes of this
    process (:func:`ray_start_processes`: the GCS, raylet, log monitor) started: the raylet's agents
    and workers. Returns how many were signalled."""
    import psutil

    doomed = started_by(ray_start_processes(set()))
    for p in doomed:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(doomed)


def started_by(processes: list) -> list:
    """What ``processes`` (``psutil.Process`` objects) started, all the way down; one that ended
    meanwhile adds nothing."""
    import psutil

    found = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            found += p.children(recursive=True)
    return found


def child_pids() -> set[int]:
    """The pids of this process's children now."""
    import psutil  # Ray ships it (ray/thirdparty_files), on sys.path once ray is imported

    return {p.pid for p in psutil.Process().children()}


def ray_start_processes(before: set[int]) -> list:
    """This process's direct children started since ``before`` (:func:`child_pids`) whose command
    line names a Ray session directory of this process (``/session_<date>_<pid>``): the GCS, raylet,
    log monitor, ... of an embedded Ray started meanwhile (``psutil.Process`` objects)."""
    import psutil

    mark = re.compile(rf"/session_[^/\s]*_{os.getpid()}(?:[/\s]|$)")
    found = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            if mark.search(" ".join(child.cmdline())):
                found.append(child)
        except psutil.Error:  # ended meanwhile
            pass
    return found


def stop_failed_ray_start(before: set[int], timeout_s: float = 10.0) -> int:
    """Stop what a failed embedded Ray start of this process left running: the
    :func:`ray_start_processes` since ``before`` (taken just before the start) with their own
    children (the raylet's agents). Older children (another Ray this process runs, ``rayft train``
    processes a test started) are left alone. Returns how many processes were stopped (SIGTERM,
    then SIGKILL after ``timeout_s``)."""
    import psutil

    roots = ray_start_processes(before)
    doomed = roots + started_by(roots)
    for p in doomed:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(doomed, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(doomed)


def ensure_default_token() -> Path | None:
    """Ray's default token file, ``~/.ray/auth_token``, created with mode 0600 when the embedded Ray will need one.

    A new local Ray turns token auth on when ``RAY_AUTH_MODE`` is unset and, without ``RAY_AUTH_TOKEN``
    or ``RAY_AUTH_TOKEN_PATH``, writes a token there itself with the process umask (0644 typically).
    Returns the file when this call created it; an existing file is left as it is.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if (mode is not None and mode.lower() != "token") or os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: its file is the token
        return None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def resolve_workers(cfg: RayftConfig) -> tuple[int, bool]:
    """(number of workers, use GPUs) from the config and the cluster's resources.

    ``num_workers: auto`` is every GPU in the cluster, or one CPU worker when there is none.

    Raises:
        TrainError: more GPUs (or CPUs) requested than the cluster has — at once, never a silent wait.
    """
    import ray

    res = ray.cluster_resources()
    gpus, cpus = int(res.get("GPU", 0)), res.get("CPU", 0)
    use_gpu = gpus > 0 if cfg.train.use_gpu == "auto" else bool(cfg.train.use_gpu)
    n = cfg.train.num_workers
    if n == "auto":
        n = gpus if use_gpu else 1
    if use_gpu and n > gpus:
        raise TrainError(f"train.num_workers={n} needs {n} GPUs but the Ray cluster has {gpus}; lower train.num_workers or add GPU nodes")
    free_gpus = int(ray.available_resources().get("GPU", 0))
    if use_gpu and n > free_gpus:
        print(f"warning: {n} GPUs needed, {free_gpus} free now (others are in use): the run waits until they are released")
    need_cpu = n * cfg.train.cpus_per_worker
    if need_cpu > cpus:
        raise TrainError(
            f"{n} workers × train.cpus_per_worker={cfg.train.cpus_per_worker} need {need_cpu:g} CPUs but the Ray cluster has {cpus:g}"
        )
    return n, use_gpu


def nodes_missing_storage(storage_path: str) -> list[str]:
    """Addresses of live Ray nodes that cannot see ``storage_path`` (a local path).

    A marker with a random token is written from one node and read back on every other node, so a
    node-local directory that merely exists everywhere is told apart from a shared file system. The
    driver writes and removes the marker itself when it runs on a node of the cluster (a job's driver
    on the head, or ``rayft train`` on a node), so the check is one round of tasks, one per other
    node: each task starts a worker process there. Returns ``[]`` for URIs (``s3://``) and
    single-node clusters.
    """
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if "://" in storage_path or len(nodes) <= 1:
        return []
    token = uuid.uuid4().hex
    marker = os.path.join(os.path.abspath(storage_path), f".rayft-shared-{token}")

    def probe(path: str, action: str) -> bool:
        if action == "write":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(token)
            return True
        if action == "remove":
            os.remove(path)
            return True
        try:
            with open(path) as f:
                return f.read() == token
        except OSError:
            return False

    remote_probe = ray.remote(num_cpus=0)(probe)

    def on(node):
        return remote_probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))

    here = ray.get_runtime_context().get_node_id()
    # a Ray Client driver (ray://) runs off the cluster, though its runtime context names the head's node
    local = None if ray.util.client.ray.is_connected() else next((n for n in nodes if n["NodeID"] == here), None)
    first = local or nodes[0]
    rest = [n for n in nodes if n is not first]

    def at_first(action: str) -> None:
        if local:
            probe(marker, action)
        else:
            ray.get(on(first).remote(marker, action))

    at_first("write")
    try:
        seen = ray.get([on(n).remote(marker, "read") for n in rest])
    finally:
        at_first("remove")
    return [n["NodeManagerAddress"] for n, ok in zip(rest, seen) if not ok]


def shared_store_root(cfg: RayftConfig, root: str, run_dir: str, connect, say) -> str:
    """Where the token store goes on this run's Ray cluster: ``root`` (``data.cache_dir``) when it
    is an ``s3://`` URI, when Ray is the embedded single-node one, or when every node sees it;
    else (a node-local directory on a multi-node cluster) the run directory's ``tokenized/``, on
    the checkpoint storage every node sees, with a note saying so (``say``). ``connect`` reaches
    Ray (a cluster named by ray.address / RAY_ADDRESS) first.

    Raises:
        TrainError: the checkpoint storage is node-local too (as :func:`check_worker_environment`
            says it, before any file is read).
    """
    import ray

    if "://" in root or not (ray_address(cfg) or ray.is_initialized()):
        return root
    connect()
    blind = nodes_missing_storage(root)
    if not blind:
        return root
    refuse_node_local_checkpoints(cfg)
    new = f"{run_dir.rstrip('/')}/tokenized"
    say(
        f"data: data.cache_dir={cfg.data.cache_dir} is node-local (Ray nodes {', '.join(blind)} cannot see it): the token store "
        f"goes under the run directory, {new}; set data.cache_dir to a shared path or an s3:// URI to reuse it across runs"
    )
    return new


def refuse_node_local_checkpoints(cfg: RayftConfig) -> None:
    """Raises TrainError when some Ray node cannot see ``checkpoint.storage_path``."""
    blind = nodes_missing_storage(cfg.checkpoint.storage_path)
    if blind:
        raise TrainError(
            f"checkpoint.storage_path={cfg.checkpoint.storage_path} is node-local: Ray nodes {', '.join(blind)} cannot "
            "see it, so checkpoints could not be resumed there. Use a file system mounted on every node "
            "(e.g. FSx for Lustre at /fsx) or an s3://bucket/prefix URI."
        )


@contextlib.contextmanager
def without_preemption_watcher():
    """``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0`` while the block starts an embedded Ray (its processes
    keep it; this process gets its own value back): Ray Train's preemption watcher, an actor per run
    polling for node drains, has nothing to watch on one host that no autoscaler drains, so each run
    starts one process fewer. A user's own setting stands."""
    key = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    before = os.environ.get(key)
    os.environ.setdefault(key, "0")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def worker_env_vars(cfg: RayftConfig | None = None, run_dir: str | None = None, use_gpu: bool = False) -> dict[str, str]:
    """Environment variables the Ray Train workers get on top of their node's.

    ``TOKENIZERS_PARALLELISM=false``, plus every ``NCCL_*`` variable set in the driver's
    environment: on an embedded local Ray the workers inherit them anyway, on a remote cluster
    this is how ``NCCL_DEBUG=INFO rayft train ...`` (or ``NCCL_NET=Socket``) reaches the workers.
    With ``cfg``: for GPU workers (``use_gpu``) whose saves stage into pinned buffers
    (:func:`stages_pinned_buffers`), PyTorch's host allocator set to pin by registering
    (:func:`pinned_register_conf`); ``NCCL_DEBUG=INFO`` unless set, when ``ray.verify_transport`` reads the NCCL logs
    at the end; PyTorch's flight recorder (:func:`flight_recorder_env`) with
    ``train.nccl_flight_recorder``, its dumps in ``run_dir``'s :data:`FLIGHT_RECORDER_DIR`.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if cfg is not None and use_gpu and stages_pinned_buffers(cfg):
        env |= pinned_register_conf(os.environ)
    if cfg is not None and cfg.ray.verify_transport:
        env.setdefault("NCCL_DEBUG", "INFO")
    if cfg is not None and cfg.train.nccl_flight_recorder and run_dir:
        env |= flight_recorder_env(os.path.join(run_dir, FLIGHT_RECORDER_DIR))
    return env


#: PyTorch's pinned host allocator: plain pages faulted in by 8 threads, then registered with
#: cudaHostRegister, instead of cudaHostAlloc (one thread, holding the CUDA driver's lock throughout).
PINNED_REGISTER = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def stages_pinned_buffers(cfg: RayftConfig) -> bool:
    """GPU workers of this run stage async saves into reused pinned buffers (periodic async saves;
    not with ``parallel.cpu_offload``, whose pinned parameters the allocator setting was not measured on)."""
    return cfg.checkpoint.periodic_async and not cfg.parallel.cpu_offload


def pinned_register_conf(environ: Mapping[str, str]) -> dict[str, str]:
    """The allocator setting with :data:`PINNED_REGISTER` appended to what ``environ`` already has
    there: ``PYTORCH_CUDA_ALLOC_CONF`` where set (CUDA reads it first), else ``PYTORCH_ALLOC_CONF``
    where set, else a new ``PYTORCH_CUDA_ALLOC_CONF``; {} when it already chooses how to pin
    (``pinned_use_cuda_host_register``). ``environ`` is the driver's, which stands for the workers'
    (embedded Ray, or pods of one image): a value set only on the worker nodes is replaced, so set
    it where the driver runs too.

    Why: the async saves' staging buffers are pinned on a thread while the steps run
    (:mod:`rayft.train.staging_buffers`). With PyTorch's default, 18.5 GB (the 1.5B preset on one
    GPU) took 10.4 s and slowed the GPU work meanwhile 7.7× (its longest stall 1.2 s); registering
    took 3.3 s at 1.06× (bench/results/2026-12-02-staging-alloc-1xh200.json).
    """
    name = (
        "PYTORCH_ALLOC_CONF" if "PYTORCH_ALLOC_CONF" in environ and "PYTORCH_CUDA_ALLOC_CONF" not in environ else "PYTORCH_CUDA_ALLOC_CONF"
    )
    current = environ.get(name, "")
    if "pinned_use_cuda_host_register" in current:
        return {}
    return {name: f"{current},{PINNED_REGISTER}" if current else PINNED_REGISTER}


FLIGHT_RECORDER_DIR = "flight_recorder"  # in the run directory: rank_<N>, one dump per rank


def flight_recorder_env(dump_dir: str, torch_version: str | None = None) -> dict[str, str]:
    """PyTorch's NCCL flight recorder, for every worker: a ring buffer of each rank's last 2000
    collectives, written to ``dump_dir/rank_<N>`` when c10d's watchdog times a collective out.

    torch 2.9 and later read TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE (and warn of the
    older TORCH_NCCL_TRACE_BUFFER_SIZE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE, which earlier versions
    read); TORCH_NCCL_DUMP_ON_TIMEOUT has one name. ``torch_version`` (default: this process's
    torch, which the workers share on an embedded Ray or in one image) picks the names.
    """
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch_version).groups())
    new = (major, minor) >= (2, 9)
    prefix = os.path.join(dump_dir, "rank_")
    return {
        "TORCH_FR_BUFFER_SIZE" if new else "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE" if new else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }


def check_worker_environment(cfg: RayftConfig, use_gpu: bool) -> None:
    """What the workers will need, checked from the driver before they start: a GPU memory cap
    and liger kernels only for GPU workers, torchao for ``train.float8`` (the driver's environment stands for the
    workers': embedded Ray, or the same image), a run directory on a file system for
    ``train.nccl_flight_recorder``'s dumps, and checkpoint storage every node can see.

    Raises:
        TrainError: naming the setting and what to do.
    """
    if cfg.train.gpu_memory_limit_gib is not None and not use_gpu:
        raise TrainError(
            f"train.gpu_memory_limit_gib={cfg.train.gpu_memory_limit_gib:g} caps GPU workers' memory, "
            "but this run's workers are CPU workers (no GPU in the Ray cluster, or train.use_gpu: false)"
        )
    if cfg.train.liger_kernels and not use_gpu:
        raise TrainError(
            "train.liger_kernels are CUDA (Triton) kernels, but this run's workers are CPU workers "
            "(no GPU in the Ray cluster, or train.use_gpu: false)"
        )
    if cfg.train.float8:  # the driver's environment stands for the workers' (embedded Ray, or the same image)
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            raise TrainError("train.float8 needs the torchao package (in a clone: pip install -e '.[fp8]')") from None
    if cfg.train.nccl_flight_recorder and "://" in cfg.checkpoint.storage_path:
        raise TrainError(
            f"train.nccl_flight_recorder writes each rank's dump into the run directory, but checkpoint.storage_path="
            f"{cfg.checkpoint.storage_path} is not a file system: use one every node mounts (e.g. /fsx), or turn the recorder off"
        )
    refuse_node_local_checkpoints(cfg)


def worker_gpus(cfg: RayftConfig, n_workers: int, embedded: bool):
    """The GPUs the workers will get (:class:`rayft.train.memory_plan.GpuTarget`, capped by
    ``train.gpu_memory_limit_gib``): the config's ``cluster:`` instance type, else the Ray cluster's
    ``accelerator_type:<GPU>`` resource (``A100-80G`` read as an 80 GB A100), else, for an embedded
    Ray only, this host's GPU 0; None when none of these says."""
    import ray

    from rayft.train.memory_plan import GpuTarget, capped, cluster_gpus, gpu_of_accelerator_type, host_share

    target = cluster_gpus(cfg)
    if target is None:
        for key in ray.cluster_resources():
            t = gpu_of_accelerator_type(key)
            if t is not None:
                target = GpuTarget(n_workers, t.gpu_model, t.gpu_memory_mib * 2**20, f"Ray's {key} ({t.name})", host_share(t))
                break
    if target is None and embedded:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            target = GpuTarget(n_workers, props.name, props.total_memory, "this host's GPU 0")
    if target is None:
        return None
    return capped(dataclasses.replace(target, count=n_workers), cfg)


def choose_single_worker(cfg: RayftConfig, n_workers: int, embedded: bool, say) -> None:
    """One GPU worker with ``parallel.single_worker: auto``: FSDP2 instead of compute copies where
    their plan does not fit the worker's GPU (:func:`rayft.train.memory_plan.choose_single_worker`);
    the choice is written into ``cfg`` (the workers', and the run directory's, config) and said.
    Whatever ``train.fit_check`` says, and on a resume too: the same GPU takes the same choice."""
    from rayft.train import memory_plan

    if n_workers != 1 or cfg.parallel.single_worker != "auto":
        return
    target = worker_gpus(cfg, n_workers, embedded)
    if target is not None:
        memory_plan.choose_single_worker(cfg, target, say)


def check_gpu_memory(cfg: RayftConfig, n_workers: int, embedded: bool, say) -> None:
    """Judge the config on the workers' GPUs before they start (``train.fit_check``;
    :func:`rayft.train.memory_plan.fit_problem`): a refusal raises, a warning goes to ``say``.

    Raises:
        TrainError: the allocated peak alone exceeds a GPU's memory and ``train.fit_check`` is ``refuse``.
    """
    from rayft.train.memory_plan import fit_problem

    target = worker_gpus(cfg, n_workers, embedded)
    problem = fit_problem(cfg, target) if target is not None else None
    if problem is None:
        return
    level, why = problem
    if level == "refuse" and cfg.train.fit_check == "refuse":
        raise TrainError(f"{why} ({target.source}). `rayft fit` shows the parts; --force (or train.fit_check: warn) trains anyway")
    say(f"warning: {why} ({target.source})")

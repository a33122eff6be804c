"""The embedded local Ray started on a thread while the driver imports Ray Train and reads its data.

``ray.init`` for an embedded Ray spends its 3-4 s waiting: it starts the GCS, the raylet and their
Python agents as processes and waits until each has registered, with ~0.1 s of CPU in the driver
(measured on the 2-core development machine; bench/NOTES.md §35). The driver's own work before it
needs Ray (importing Ray Train, loading the tokenizer, reading or tokenizing the data) does not use
Ray, so the start runs beside it. It begins after the hub check, whose ``HF_HUB_OFFLINE`` Ray's
processes must copy, and inside the driver's signal handling and run lock.

Importing one package from two threads at once is not safe with these libraries: a thread can see
a package that the other is still importing, without its submodules as attributes (a run failed
that way in §31). :meth:`EmbeddedRayStart.begin` therefore imports, on the caller's thread and
before the start, every module that ``ray.init`` would import on first use (:data:`RAY_INIT_IMPORTS`;
``tests/integration/test_ray_start_background.py`` checks that the thread then imports nothing).
That check sees the modules a start imports on this kind of host: where another accelerator's
package is installed (Habana's, say), Ray's detection would import it from the thread.

A thread other than the main one cannot set Python signal handlers, so Ray's Python SIGTERM handler
is not set, as the driver wants. Ray's C++ core worker still installs its failure handler for
SIGTERM as it connects; that handler prints a stack dump for the signal before it calls Python's
own. The driver used to replace it at once, from the main thread, after ``ray.init``; the main
thread is now busy with the data, possibly for minutes. So the start's thread puts back,
process-wide, each signal disposition that changed during the start (:class:`SignalDispositions`),
and a pod's SIGTERM during the data stops the run as before, without a dump that reads like a crash.

The thread must outlive the Ray it started: Ray ties the life of each process it starts to its
parent with Linux's ``PR_SET_PDEATHSIG``, which fires when the parent *thread* ends, not the process
(a first try here lost its GCS as the thread returned). So the thread stays parked until the process
ends; Ray's shutdown at exit stops the processes first.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import threading

from rayft.config import RayftConfig
from rayft.train.ray_cluster import connect_ray, ray_address

#: Modules ``ray.init(address="local")`` imports that ``import ray`` does not (Ray 2.60; each
#: brings its own submodules): the gRPC and aiohttp clients, the metrics exporters, the usage
#: records, the autoscaler's helpers, NVML for the GPU count.
RAY_INIT_IMPORTS = (
    "grpc.aio",
    "aiohttp.web",
    "aiohttp_cors",
    "opencensus",
    "opentelemetry.sdk.metrics",
    "opentelemetry.exporter.prometheus",
    "prometheus_client",
    "colorful",
    "click",
    "http.server",
    "wsgiref.simple_server",
    "ray._common.usage.usage_lib",
    "ray._private.runtime_env.uv_runtime_env_hook",
    "ray._private.thirdparty.pynvml",
    "ray.autoscaler._private.util",
    "ray.autoscaler.v2.utils",
    "ray.dashboard.optional_deps",
)


class EmbeddedRayStart:
    """One start of the embedded local Ray (:func:`rayft.train.ray_cluster.connect_ray`) on a thread.

    Use :meth:`begin`; then :meth:`wait` where the driver needs Ray, and :meth:`settle` on every
    way out of the run (a failure before the wait must not leave a start half done: Ray's shutdown
    at exit stops only what a finished start registered).
    """

    def __init__(self, cfg: RayftConfig) -> None:
        self.cfg = cfg
        self.where: str | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()  # the start ended, either way
        self.thread = threading.Thread(target=self._start, name="rayft-ray-start", daemon=True)

    @classmethod
    def begin(cls, cfg: RayftConfig) -> EmbeddedRayStart | None:
        """Start the embedded Ray on a thread and return its handle; None where the run joins a
        cluster (``ray.address`` or ``RAY_ADDRESS``: :func:`connect_ray` connects when asked) or this
        process's Ray is up already, and where one of Ray's own :data:`RAY_INIT_IMPORTS` cannot be
        imported (a Ray whose modules moved: the start is left to :func:`connect_ray` where the driver
        needs Ray; :func:`preimport`). Imports them first, on this thread, and sets ``RAY_TRAIN_V2_ENABLED`` as
        :func:`connect_ray` does (unless set). The signal dispositions the start's thread finds are
        the ones it puts back: install the process's handlers before, keep them until :meth:`settle`."""
        import ray

        if ray_address(cfg) or ray.is_initialized():
            return None
        # read when ray.train is imported, which the driver does while the start runs
        os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
        for name in RAY_INIT_IMPORTS:
            if not preimport(name):  # another Ray's modules: connect_ray starts it where the driver waits, as before
                return None
        start = cls(cfg)
        start.thread.start()
        return start

    def _start(self) -> None:
        try:
            dispositions = SignalDispositions.now()
            try:
                self.where = connect_ray(self.cfg)
            finally:
                dispositions.restore_changed()
        except BaseException as e:  # handed to the waiting thread
            self.error = e
        finally:
            self.done.set()
        threading.Event().wait()  # parked for the process's life: Ray's processes end with this thread (see above)

    def wait(self) -> str:
        """Wait for the start (no time limit: it ends, or ``connect_ray`` raises); return
        :func:`connect_ray`'s answer.

        Raises:
            Exception: the start's own error (a Ray that did not start), as ``connect_ray`` raises it.
        """
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.where is not None
        return self.where

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the start to end, however it ends (its error is the
        waiter's to report); returns whether it ended."""
        return self.done.wait(timeout_s)


def preimport(name: str) -> bool:
    """Import ``name`` (one of :data:`RAY_INIT_IMPORTS`) on this thread; False where Ray's own
    modules are not where this Ray version keeps them.

    A third-party package that is not installed counts as imported: Ray's optional dependencies
    (``aiohttp_cors``, ``opencensus``, ... of ``ray[default]``) are absent where Ray was installed
    without its extras, and ``ray.init`` then looks for them and finds nothing: its thread loads no
    module. Returning False there kept every start on the GPU host's bare Ray after the data
    (bench/NOTES.md §38).
    """
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        return (e.name or name).split(".")[0] != "ray"
    except ImportError:
        return False
    return True


class SignalDispositions:
    """The process's dispositions of SIGTERM and SIGINT (what the C library's ``sigaction`` reads),
    saved to be put back from any thread: Python's ``signal.signal`` works on the main thread only.
    Each is kept as the bytes of a ``struct sigaction``, copied back as they were read."""

    #: more than any C library's ``struct sigaction`` (glibc on x86-64: 152 bytes)
    STRUCT_BYTES = 1024
    #: the handler's address, the struct's first field in glibc, musl and the BSDs
    HANDLER_BYTES = ctypes.sizeof(ctypes.c_void_p)

    def __init__(self, saved: dict[int, ctypes.Array]) -> None:
        self.saved = saved

    @classmethod
    def now(cls) -> SignalDispositions:
        """The dispositions as they are; none where the C library cannot be reached (then
        :meth:`restore_changed` does nothing)."""
        try:
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return cls({})
        saved = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            buf = ctypes.create_string_buffer(cls.STRUCT_BYTES)
            if libc.sigaction(int(signum), None, buf) == 0:
                saved[int(signum)] = buf
        return cls(saved)

    def restore_changed(self) -> None:
        """Put back each saved disposition whose handler changed since it was read (Ray's); leave
        the others as they are."""
        if not self.saved:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        for signum, buf in self.saved.items():
            now = ctypes.create_string_buffer(self.STRUCT_BYTES)
            if libc.sigaction(signum, None, now) == 0 and now.raw[: self.HANDLER_BYTES] != buf.raw[: self.HANDLER_BYTES]:
                libc.sigaction(signum, buf, None)


def start_autoscaling_coordinator() -> bool:
    """Create Ray Data's autoscaling coordinator now, on an embedded Ray, rather than when Ray
    Train's controller first asks it for the workers' resources.

    Ray Train's controller registers each run's resources with that coordinator (a named detached
    actor, created on first use) and waits for the answer before it starts its workers, so the
    coordinator's process start and imports lay on the workers' path: 1.36 s of the quickstart's
    start on 2 cores (bench/NOTES.md §36). Created here, while the driver checks its resources and
    the controller's own process starts, it is up when asked. Returns whether it was asked for:
    False where this Ray has no such coordinator (its module moved) or the call failed, and then
    nothing changes.
    """
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import get_or_create_autoscaling_coordinator

        get_or_create_autoscaling_coordinator()  # the actor's handle; its process starts meanwhile
    except Exception:  # a private part of Ray, used for speed only: Ray Train creates it when it needs it
        return False
    return True

"""One run per run directory: a lock file that says who holds it.

``RUN_DIR/.rayft.lock`` holds JSON: ``host``, ``pid``, ``started`` (ISO time), ``run_id`` and
``heartbeat`` (unix seconds). Two kinds of hold:

* **OS lock** (local and shared POSIX file systems): ``fcntl.flock`` on the lock file, held by the
  driver for the whole run; the kernel (or the file server) releases it when the process dies, so
  a lock file whose flock can be taken is stale by definition.
* **Lease** (where flock is refused, e.g. some network file systems, and on object storage through
  pyarrow's file systems): the holder rewrites the file every :data:`HEARTBEAT_S` seconds; a lease
  whose heartbeat is older than :data:`LEASE_S`, or whose holder is a dead process on this host, is
  stale. Object stores have no compare-and-swap here, so two drivers starting within the same
  second can both take a lease: the second one to write wins and the first notices at its next
  heartbeat (``lost``: the driver then stops its run with an error rather than write into a
  directory it does not hold). On a local file system the lease is created with ``O_EXCL``.

A stale lock is taken over with a note naming its old holder. Errors are
:class:`~rayft.train.errors.TrainError`.
"""

from __future__ import annotations

import atexit
import datetime as dt
import errno
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Callable

from rayft.train.errors import TrainError

LOCK_FILE = ".rayft.lock"
HEARTBEAT_S = 15.0
LEASE_S = 60.0

#: the file Ray Train's controller writes into the run directory as it starts (it checks the storage
#: is writable; ray.train.v2._internal.constants.VALIDATE_STORAGE_MARKER_FILENAME, Ray 2.60)
RAY_TRAIN_STORAGE_MARKER = ".validate_storage_marker"


def remove_if_only_marker(run_dir: str) -> None:
    """Remove ``run_dir`` when it is empty or holds nothing but :data:`RAY_TRAIN_STORAGE_MARKER`
    (a run that failed before it wrote anything; its Ray Train controller may have started); else
    leave it. Never raises."""
    try:
        if os.listdir(run_dir) == [RAY_TRAIN_STORAGE_MARKER]:
            os.unlink(os.path.join(run_dir, RAY_TRAIN_STORAGE_MARKER))
        os.rmdir(run_dir)
    except OSError:
        pass


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run directory: ``host``, ``pid``, ``started`` (ISO 8601), ``run_id``,
    ``heartbeat`` (unix seconds of the last renewal; leases only)."""

    host: str
    pid: int
    started: str
    run_id: str
    heartbeat: float = 0.0

    @staticmethod
    def me() -> LockHolder:
        return LockHolder(
            socket.gethostname(),
            os.getpid(),
            dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            uuid.uuid4().hex[:12],
            time.time(),
        )

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.started} (run id {self.run_id})"

    def is_dead_here(self) -> bool:
        """The holder is a process of this host that no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def parse_holder(text: str) -> LockHolder | None:
    """The holder recorded in a lock file's text, or None when it is unreadable (a torn write)."""
    try:
        d = json.loads(text)
        return LockHolder(str(d["host"]), int(d["pid"]), str(d["started"]), str(d["run_id"]), float(d.get("heartbeat", 0.0)))
    except (ValueError, KeyError, TypeError):
        return None


class RunLock:
    """The lock of one run directory, held from :meth:`acquire` to :meth:`release` (also a
    context manager). ``say(text)`` prints notes (a stale lock taken over)."""

    def __init__(self, run_dir: str, say: Callable[[str], None] = print):
        self.run_dir = run_dir.rstrip("/")
        self.remote = "://" in run_dir
        self.path = f"{self.run_dir}/{LOCK_FILE}"
        self.say = say
        self.holder = LockHolder.me()
        self._fd: int | None = None
        self._made_dir = False  # acquire created the run directory: removed again if the run left it empty
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # set when a lease was taken by another run (see module docstring)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or refuse at once.

        Raises:
            TrainError: another live run holds it (naming its host, pid, start and run id).
        """
        if self.remote:
            self._acquire_lease()
            return
        self._made_dir = not os.path.isdir(self.run_dir)
        os.makedirs(self.run_dir, exist_ok=True)
        if self._made_dir:
            # also at the process's exit, after Ray's shutdown (atexit runs handlers last-registered first, and
            # Ray registers its own at ray.init, later): a controller that started after release() may write its
            # marker until then
            atexit.register(remove_if_only_marker, self.run_dir)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = parse_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
                os.close(fd)
                raise TrainError(self._refusal(held)) from None
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):  # no flock here: a lease instead
                    self._acquire_lease()
                    return
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # we locked a file its holder had just removed while releasing: lock the one at the path now
        old = parse_holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        if old is not None:
            self.say(f"note: took over the stale lock of {old.describe()}, which no longer holds it")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(self.holder)).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Give the lock back and remove the lock file (no-op when not held); a run directory that
        :meth:`acquire` created and that is still empty goes too, or that holds only Ray Train's
        storage marker (:data:`RAY_TRAIN_STORAGE_MARKER`: the workers started beside a data phase
        that then failed)."""
        leased = self._thread is not None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)  # closing releases the flock
            self._fd = None
            if self._made_dir:
                remove_if_only_marker(self.run_dir)  # a run that failed before writing anything
        elif leased and self.lost is None:
            self._delete()

    # -- leases -----------------------------------------------------------------------------

    def _refusal(self, held: LockHolder | None) -> str:
        who = held.describe() if held is not None else "another process (its lock file is being written)"
        return (
            f"run directory {self.run_dir} is in use by {who}: wait for that run to end, stop it, or pick another checkpoint.name "
            f"(the lock is {self.path})"
        )

    def _acquire_lease(self) -> None:
        if not self.remote and self._create_exclusive():
            return self._start_heartbeat()
        held = parse_holder(self._read() or "")
        if held is not None and held.run_id != self.holder.run_id:
            fresh = time.time() - held.heartbeat < LEASE_S
            if fresh and not held.is_dead_here():
                raise TrainError(self._refusal(held))
            self.say(f"note: took over the stale lock of {held.describe()} (last heartbeat {time.time() - held.heartbeat:.0f} s ago)")
        self._write(self.holder)
        self._start_heartbeat()

    def _create_exclusive(self) -> bool:
        """Create the lock file only if there is none (atomic on a local or NFSv3+ file system)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(self.holder)))
        return True

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, name="rayft-run-lock", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        """Renew the lease every :data:`HEARTBEAT_S`; a renewal that fails (a passing storage
        error) is retried at the next beat; ``lost`` is set when another run took the lease, or when
        no renewal succeeded for :data:`LEASE_S` (others may then take it)."""
        last_ok = time.time()
        while not self._stop.wait(HEARTBEAT_S):
            try:
                now = parse_holder(self._read() or "")
                if now is not None and now.run_id != self.holder.run_id:
                    self.lost = f"the lock of {self.run_dir} was taken by {now.describe()}"
                    return
                self._write(LockHolder(**{**asdict(self.holder), "heartbeat": time.time()}))
                last_ok = time.time()
            except OSError as e:
                if time.time() - last_ok > LEASE_S:
                    self.lost = f"the lease on {self.path} could not be renewed for {LEASE_S:g} s ({e})"
                    return

    def _fs(self):
        import pyarrow.fs

        return pyarrow.fs.FileSystem.from_uri(self.path)

    def _read(self) -> str | None:
        if not self.remote:
            try:
                with open(self.path) as f:
                    return f.read()
            except FileNotFoundError:
                return None
        fs, p = self._fs()
        try:
            with fs.open_input_stream(p) as f:
                return f.read().decode("utf-8", "replace")
        except (FileNotFoundError, OSError):
            return None

    def _write(self, holder: LockHolder) -> None:
        data = json.dumps(asdict(holder)).encode()
        if not self.remote:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
            return
        fs, p = self._fs()
        with fs.open_output_stream(p) as f:
            f.write(data)

    def _delete(self) -> None:
        try:
            if self.remote:
                fs, p = self._fs()
                fs.delete_file(p)
            else:
                os.unlink(self.path)
        except (FileNotFoundError, OSError):
            pass

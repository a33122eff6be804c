"""One run per run directory: a second run is refused at once with who holds the directory; a
lock left by a dead run is taken over with a note; where flock is refused, a lease does the job."""

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rayft.train import run_lock
from rayft.train.errors import TrainError
from rayft.train.run_lock import LOCK_FILE, RunLock


def test_a_second_holder_is_refused_with_who_holds_it(tmp_path):
    run = tmp_path / "runs" / "r1"
    notes = []
    with RunLock(str(run), say=notes.append) as first:
        held = json.loads((run / LOCK_FILE).read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname() and held["run_id"] == first.holder.run_id
        with pytest.raises(TrainError) as e:
            RunLock(str(run)).acquire()
        assert str(e.value) == (
            f"run directory {run} is in use by pid {os.getpid()} on {socket.gethostname()} since {held['started']} "
            f"(run id {first.holder.run_id}): wait for that run to end, stop it, or pick another checkpoint.name (the lock is {run / LOCK_FILE})"
        )
    assert not run.exists() and notes == []  # the lock made the directory, nothing else used it: gone again
    with RunLock(str(run)):  # free again
        (run / "rayft.yaml").write_text("x")
    assert sorted(p.name for p in run.iterdir()) == ["rayft.yaml"]  # a directory the run used stays


def test_a_directory_holding_only_ray_trains_storage_marker_goes_with_the_lock(tmp_path):
    """The workers start beside the data phase: Ray Train's controller writes its storage marker into
    the run directory as it starts, and a data error then ends the run with nothing else written."""
    from rayft.train.run_lock import RAY_TRAIN_STORAGE_MARKER

    run = tmp_path / "runs" / "r1"
    with RunLock(str(run)):
        (run / RAY_TRAIN_STORAGE_MARKER).write_text("")
    assert not run.exists()
    with RunLock(str(run)):
        (run / RAY_TRAIN_STORAGE_MARKER).write_text("")
        (run / "rayft.yaml").write_text("x")
    assert sorted(p.name for p in run.iterdir()) == [RAY_TRAIN_STORAGE_MARKER, "rayft.yaml"]  # a run that began: kept whole
    run2 = tmp_path / "runs" / "r2"
    run2.mkdir()
    with RunLock(str(run2)):  # a directory the lock did not make is never removed
        (run2 / RAY_TRAIN_STORAGE_MARKER).write_text("")
    assert sorted(p.name for p in run2.iterdir()) == [RAY_TRAIN_STORAGE_MARKER]


def test_another_process_holding_the_lock_refuses_this_one(tmp_path):
    run = tmp_path / "r2"
    code = (
        "import sys, time; from rayft.train.run_lock import RunLock\n"
        f"lock = RunLock({str(run)!r}); lock.acquire(); print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with pytest.raises(TrainError, match=rf"is in use by pid {holder.pid} on "):
            RunLock(str(run)).acquire()
        assert time.monotonic() - t0 < 1.0  # refused at once, not after a wait
    finally:
        holder.kill()
        holder.wait()
    notes = []
    with RunLock(str(run), say=notes.append):  # the kernel released the dead holder's flock
        pass
    assert notes == [
        f"note: took over the stale lock of pid {holder.pid} on {socket.gethostname()} since " + notes[0].split(" since ", 1)[1]
    ]
    assert "which no longer holds it" in notes[0]


def lease_only(monkeypatch):
    """A file system that refuses flock (as some network file systems do)."""
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)


def write_holder(run, pid, heartbeat, host=None):
    run.mkdir(parents=True, exist_ok=True)
    holder = {
        "host": host or socket.gethostname(),
        "pid": pid,
        "started": "2026-12-01T10:00:00+00:00",
        "run_id": "abc123",
        "heartbeat": heartbeat,
    }
    (run / LOCK_FILE).write_text(json.dumps(holder))


def test_a_fresh_lease_of_a_live_process_is_refused(tmp_path, monkeypatch):
    lease_only(monkeypatch)
    run = tmp_path / "r3"
    write_holder(run, os.getppid(), time.time())  # a live process of this host, heartbeat now
    with pytest.raises(
        TrainError, match=rf"in use by pid {os.getppid()} on {socket.gethostname()} since 2026-12-01T10:00:00\+00:00 \(run id abc123\)"
    ):
        RunLock(str(run)).acquire()
    write_holder(run, 1, time.time(), host="another-host")  # another host's live lease: refused too
    with pytest.raises(TrainError, match=r"in use by pid 1 on another-host"):
        RunLock(str(run)).acquire()


@pytest.mark.parametrize("stale", ["dead pid here", "expired heartbeat"])
def test_a_stale_lease_is_taken_over_and_renewed(tmp_path, monkeypatch, stale):
    lease_only(monkeypatch)
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    run = tmp_path / "r4"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    if stale == "dead pid here":
        write_holder(run, int(dead), time.time())
    else:
        write_holder(run, 1, time.time() - run_lock.LEASE_S - 1, host="another-host")
    notes = []
    lock = RunLock(str(run), say=notes.append)
    lock.acquire()
    try:
        assert notes[0].startswith(f"note: took over the stale lock of pid {dead if stale == 'dead pid here' else 1} on ")
        first = json.loads((run / LOCK_FILE).read_text())
        assert first["run_id"] == lock.holder.run_id
        time.sleep(0.3)
        assert json.loads((run / LOCK_FILE).read_text())["heartbeat"] > first["heartbeat"]  # renewed
    finally:
        lock.release()
    assert not (run / LOCK_FILE).exists()


def test_a_lease_taken_by_another_run_is_noticed_and_not_deleted(tmp_path, monkeypatch):
    lease_only(monkeypatch)
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    run = tmp_path / "r5"
    lock = RunLock(str(run))
    lock.acquire()
    write_holder(run, 1, time.time(), host="another-host")  # a racing driver overwrote the lease
    time.sleep(0.3)
    lock.release()
    assert lock.lost == f"the lock of {run} was taken by pid 1 on another-host since 2026-12-01T10:00:00+00:00 (run id abc123)"
    assert json.loads((run / LOCK_FILE).read_text())["host"] == "another-host"


def test_a_torn_or_garbage_lock_file_is_no_holder(tmp_path, monkeypatch):
    run = tmp_path / "r6"
    run.mkdir()
    (run / LOCK_FILE).write_bytes(b"\x00{not json")  # a torn write, or anything else
    notes = []
    with RunLock(str(run), say=notes.append) as lock:  # the flock is free: taken, with no holder to name
        assert notes == [] and json.loads((run / LOCK_FILE).read_text())["run_id"] == lock.holder.run_id
    lease_only(monkeypatch)
    (run / LOCK_FILE).write_text("garbage")
    with RunLock(str(run), say=notes.append) as lock:  # a lease over an unreadable file: taken too
        assert notes == [] and json.loads((run / LOCK_FILE).read_text())["run_id"] == lock.holder.run_id

"""Run one benchmark subprocess with its whole output in a log file; read the end of such a log.

`rayft bench fabric` and `rayft bench train` run each training (or sweep) as a fresh process: its
own embedded Ray or torchrun, whose workers must not outlive it. :func:`run_logged` starts it in
its own process group and stops that whole group on a timeout or an interrupt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: Seconds between SIGTERM and SIGKILL to a timed-out run's process group.
KILL_GRACE_S = 30.0
#: The same when this process itself is interrupted.
INTERRUPT_GRACE_S = 5.0
#: Seconds a run may keep running after writing its done file (a sockets run was once seen hanging
#: on exit after its summary, until the time limit).
LINGER_S = 30.0


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group has no process left."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop the process group of ``proc`` (the leader of its own session): SIGTERM, wait up to
    ``grace_s`` s for every process of the group to exit, then SIGKILL what is left."""
    _signal_group(proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        proc.poll()  # reap the leader: a zombie still counts as a member of the group
        if proc.returncode is not None and not _signal_group(proc.pid, 0):
            return
        time.sleep(0.1)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def run_logged(
    cmd: list[str],
    env: dict[str, str],
    log: Path,
    timeout_s: float | None,
    kill_grace_s: float = KILL_GRACE_S,
    done_file: Path | None = None,
    linger_s: float = LINGER_S,
) -> int:
    """Run ``cmd`` with stdout and stderr into ``log``; its exit status (124 on timeout).

    The child starts in a new session (its own process group), so that on timeout (or when this
    process is interrupted) the whole group is stopped: SIGTERM, up to ``kill_grace_s`` s, SIGKILL.
    torchrun's and Ray's workers would otherwise outlive a killed leader and keep the GPUs.
    With ``done_file`` (a file the command writes once its work is done, e.g. a run summary), a
    process still running ``linger_s`` s after that file appeared is stopped the same way and the
    call returns 124 at once instead of waiting out ``timeout_s``.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    started = time.time()  # a done file older than this is a leftover, not this run's
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        done_at = None
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if done_file is not None and done_at is None and _written_since(done_file, started):
                    done_at = now
                if deadline is not None and now >= deadline:
                    _kill_group(proc, kill_grace_s)
                    f.write(f"\n[rayft bench] killed after {timeout_s} s\n")
                    return 124
                if done_at is not None and now - done_at >= linger_s:
                    _kill_group(proc, kill_grace_s)
                    f.write(
                        f"\n[rayft bench] {done_file.name} written, but the process was still running {linger_s:.0f} s later: stopped\n"
                    )
                    return 124
                time.sleep(0.2)
        except BaseException:  # interrupted (SIGTERM handler, Ctrl-C): leave no process behind, quickly
            # (a short grace: `timeout -k 10` SIGKILLs this process 10 s after its SIGTERM)
            _kill_group(proc, min(kill_grace_s, INTERRUPT_GRACE_S))
            raise
        # the leader exited by itself; anything it left running in its group goes too
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode


def _written_since(path: Path, t: float) -> bool:
    try:
        return path.stat().st_mtime >= t
    except OSError:
        return False


def log_tail(path: Path, n: int = 15) -> str:
    """The last ``n`` lines of the log at ``path``, each indented by four spaces ("" when it cannot be read)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines[-n:])


#: What runs one benchmark command into a log, as `rayft bench train` calls it:
#: ``(cmd, env, log, timeout_s) -> exit status`` (124 on timeout). :func:`run_logged` is one; tests pass fakes.
LoggedCommand = Callable[[list[str], dict[str, str], Path, float | None], int]
#: The same, as `rayft bench fabric` calls it, which may also pass ``done_file=`` (see :func:`run_logged`):
#: ``(cmd, env, log, timeout_s, done_file=None) -> exit status``.
LoggedCommandWithDoneFile = Callable[..., int]

"""Stopping a run on SIGTERM or SIGINT without losing it: checkpoint, records, exit 143 / 130.

Kubernetes sends SIGTERM to an evicted or deleted pod and SIGKILL after its grace period (30 s by
default); a user sends SIGINT with Ctrl-C. The path of a stop:

1. The driver's handler (:class:`SignalStop`) sets the stop request of the run's actor
   (:class:`rayft.train.run_actor.RunActor`, named, so that ``rayft stop`` can set it from another
   process too).
2. Rank 0 polls the flag without blocking (:class:`StopPoll`: one small actor call in flight,
   checked each step with ``ray.wait(timeout=0)``) and votes in the step's count all-reduce
   (:func:`rayft.train.step.global_counts`), so every rank stops at the same step boundary: the
   step not yet begun is abandoned, the last finished one is checkpointed (``checkpoint.on_signal``)
   and the workers return normally.
3. The driver waits for that at most ``checkpoint.signal_grace_s`` from the signal, writes the
   metrics and the summary, prints the ``--resume`` command and exits 143 (SIGTERM) or 130 (SIGINT).
   Past the grace it writes what arrived and exits without waiting (a second signal does the same
   at once).

Before training starts (data, Ray) a signal stops the driver at once with the same exit codes, and
so does ``rayft stop`` (:class:`StopRequestWatch`); workers already starting are called off, and the
driver waits for them to return, up to the same grace
(:meth:`rayft.train.worker_launch.WorkerLaunch.cancel`).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

STOP_NAMESPACE = "rayft"
EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}


def stop_actor_name(run_name: str) -> str:
    """The stop flag's actor name for run ``run_name`` (namespace :data:`STOP_NAMESPACE`)."""
    return f"rayft-stop-{run_name}"


class StopPoll:
    """Rank 0's view of the stop flag: :meth:`requested` never blocks after :meth:`check_now`.

    ``flag``: the run's :class:`~rayft.train.run_actor.RunActor` handle (its ``requested()``), or
    None (nothing can stop this run).
    """

    def __init__(self, flag: Any) -> None:
        self.flag = flag
        self.reason: str | None = None
        self._pending = None

    def check_now(self) -> bool:
        """Read the flag, waiting for the answer (once, at set-up: a signal during worker start)."""
        if self.flag is not None and self.reason is None:
            import ray

            try:
                self.reason = ray.get(self.flag.requested.remote())
            except ray.exceptions.RayActorError:  # the driver is gone: nothing can ask for a stop any more
                self.flag = None
        return self.reason is not None

    def requested(self) -> bool:
        """Whether a stop was requested, as far as is known now: never blocks, so the answer lags.
        A question to the flag is always in flight: the one asked at call k is answered by call k+1,
        and a new one goes out at once, so a stop set at any time is seen within two calls (steps)."""
        if self.flag is None or self.reason is not None:
            return self.reason is not None
        import ray

        if self._pending is None:
            self._pending = self.flag.requested.remote()
        ready, _ = ray.wait([self._pending], timeout=0)
        if ready:
            try:
                self.reason = ray.get(self._pending)
            except ray.exceptions.RayActorError:
                self.flag = None
            self._pending = self.flag.requested.remote() if self.flag is not None and self.reason is None else None
        return self.reason is not None


class StopBeforeTraining(KeyboardInterrupt):
    """A signal arrived before the workers started training (raised from the signal handler). A
    ``KeyboardInterrupt``: no ``except Exception`` on the way swallows it, and Ray's own check for
    signals while the driver waits in ``ray.get`` passes it on, where it prints and drops any other
    exception a handler raises (the driver maps a bare ``KeyboardInterrupt`` back to the recorded
    signal: :meth:`SignalStop.stop_before_training`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class SignalStop:
    """The driver's SIGTERM/SIGINT handling for one run (a context manager that restores the old
    handlers). Before :meth:`training_started` a signal raises :class:`StopBeforeTraining` in the
    main thread; after it, the handler only records the signal (a handler interrupts the main
    thread anywhere: it makes no Ray call and prints nothing) and :meth:`poll`, called by the
    driver's progress loop, prints the notes and calls ``on_stop(reason)`` once. A second signal
    sets ``forced``: the driver stops waiting.

    ``grace_s``: seconds from the first signal until the driver stops waiting (``deadline``).
    ``first_at``: the first signal's ``time.monotonic()``. ``calling_off``: the run ends before
    training and the driver waits for workers it started to return
    (:meth:`rayft.train.worker_launch.WorkerLaunch.cancel`); a signal then only records itself, as
    in training (a second one sets ``forced``). ``asked``: the reason of a stop asked through the
    run's actor before training (``rayft stop``), which :class:`StopRequestWatch` turns into this
    SIGTERM.
    """

    grace_s: float
    say: Callable[[str], None] = print
    on_stop: Callable[[str], None] | None = None
    signum: int | None = None
    first_at: float | None = None
    deadline: float | None = None
    forced: bool = False
    training: bool = False
    calling_off: bool = False
    asked: str | None = None
    _notes: list[str] = field(default_factory=list)
    _stop_sent: bool = False

    def __enter__(self) -> SignalStop:
        self._old = {s: signal.getsignal(s) for s in EXIT_CODES}
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, h in self._old.items():
                signal.signal(s, h)

    def install(self) -> None:
        """(Re)install the handlers: call again after ``ray.init``, which sets its own SIGTERM handler."""
        if threading.current_thread() is threading.main_thread():
            for s in EXIT_CODES:
                signal.signal(s, self._handle)

    def training_started(self) -> None:
        self.training = True

    def handles_sigterm(self) -> bool:
        """Whether this process's SIGTERM handler is this object's (installed, on the main thread)."""
        return threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == self._handle

    def stop_before_training(self, e: KeyboardInterrupt) -> StopBeforeTraining | None:
        """The stop ``e`` stands for: itself when it is a :class:`StopBeforeTraining`; for another
        ``KeyboardInterrupt`` (one Ray raised in its place) the signal this object recorded before
        training, if any; else None (an interrupt of someone else's)."""
        if isinstance(e, StopBeforeTraining):
            return e
        return StopBeforeTraining(self.signum) if self.signum is not None and not self.training else None

    @property
    def exit_code(self) -> int | None:
        return EXIT_CODES.get(self.signum) if self.signum is not None else None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def past_deadline(self) -> bool:
        return self.forced or (self.deadline is not None and time.monotonic() > self.deadline)

    def poll(self) -> None:
        """From the driver's loop (not the handler): print what the handler noted and pass the
        first signal on to ``on_stop`` once."""
        while self._notes:
            self.say(self._notes.pop(0))
        if self.signum is not None and not self._stop_sent and self.on_stop is not None:
            self._stop_sent = True
            self.on_stop(f"{self.name} to the driver")

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:  # a second signal: stop waiting
            self.forced = True
            self._notes.append(f"a second signal ({signal.Signals(signum).name}): stopping now without waiting for the workers")
            return
        self.signum, self.first_at = signum, time.monotonic()
        if self.calling_off:  # the run is ending already: raising here would skip the wait for its workers
            self._notes.append(
                f"{self.name}: the run is ending before training; waiting for its workers to return (a second signal stops at once)"
            )
            return
        if not self.training:
            raise StopBeforeTraining(signum)
        self.deadline = time.monotonic() + self.grace_s
        self._notes.append(
            f"{self.name}: stopping after the current step, checkpointing the last finished one (up to {self.grace_s:g} s; "
            "a second signal stops at once)"
        )


class StopRequestWatch:
    """While the driver's data phase runs (the workers may start beside it), a stop asked through
    the run's actor (``rayft stop``, a pod's preStop hook) stops the driver as a SIGTERM would: a
    thread reads the actor's request every ``poll_s`` seconds and, when one is set, sends the main
    thread SIGTERM (``_thread.interrupt_main``), whose ``signals`` handler raises
    :class:`StopBeforeTraining` at the main thread's next Python instruction. Without it the request
    would be read only once the workers train, after the whole data phase. Only where ``signals``
    handles this process's SIGTERM (the driver on its main thread): elsewhere the interrupt would
    reach someone else's handler. A context manager; ``flag``: the run's
    :class:`~rayft.train.run_actor.RunActor` handle."""

    def __init__(self, flag: Any, signals: SignalStop, poll_s: float = 0.5):
        self.flag, self.signals, self.poll_s = flag, signals, poll_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="rayft-stop-watch") if signals.handles_sigterm() else None

    def __enter__(self) -> StopRequestWatch:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.poll_s)  # one question to the actor in flight, at most

    def _watch(self) -> None:
        import _thread

        import ray

        while not self._done.wait(self.poll_s):
            try:
                reason = ray.get(self.flag.requested.remote(), timeout=30)
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):  # for a moment: ask again
                continue
            except ray.exceptions.RayActorError:  # the run is ending anyway
                return
            if reason is not None and not self._done.is_set():
                if self.signals.signum is None and not self.signals.calling_off:  # else a signal came first: its name stays
                    self.signals.asked = reason  # the stop's own name and reason, not the SIGTERM's that carries it
                _thread.interrupt_main(signal.SIGTERM)
                return


def running_stop_flags(run: str | None = None) -> list[str]:
    """Names of the stop flags of runs alive on the connected Ray cluster (``run``: only that
    run's, by its ``checkpoint.name``: the flag is named ``rayft-stop-<name>-<12-hex run id>``)."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == STOP_NAMESPACE]
    pattern = re.compile(re.escape(stop_actor_name(run)) + r"-[0-9a-f]{12}" if run else re.escape(stop_actor_name("")) + r".+")
    return sorted(n for n in names if pattern.fullmatch(n))


def request_stop(reason: str, run: str | None = None, wait_s: float = 0.0, say: Callable[[str], None] = print) -> list[str]:
    """Ask every running rayft run on the connected Ray cluster (or run ``run``) to stop as on a
    SIGTERM to its driver, then wait up to ``wait_s`` seconds until each has ended (its driver
    exits, and its flag with it). For a pod's ``preStop`` hook: Kubernetes runs it before the
    pod's SIGTERM, within ``terminationGracePeriodSeconds``. Returns the flags still alive after
    the wait (none when not waiting: ``wait_s`` 0)."""
    import ray

    flags = running_stop_flags(run)
    if not flags:
        say("no running rayft run on this Ray cluster" + (f" named {run}" if run else ""))
        return []
    for name in flags:
        ray.get(ray.get_actor(name, namespace=STOP_NAMESPACE).request.remote(reason))
        say(f"asked {name} to stop")
    if wait_s <= 0:
        return []  # asked, not waited for
    deadline = time.monotonic() + wait_s
    alive = flags
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [n for n in alive if n in running_stop_flags(run)]
    for name in alive:
        say(f"{name} still running after {wait_s:g} s")
    return alive

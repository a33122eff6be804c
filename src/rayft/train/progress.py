"""The driver's live view of a run: drain the workers' progress events into a progress bar while
Ray Train runs, and collect what the summary needs."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from rich.console import Console

from rayft.train.events import (
    CheckpointEvent,
    ExportEvent,
    InitialEvalEvent,
    ProgressChannel,
    ProgressEvent,
    ResumedEvent,
    StepEvent,
    StoppedEvent,
    WorkerFailedEvent,
    failure_text,
)
from rayft.train.stop import SignalStop

#: the summary's ``failures`` keep at most this many reports (64 ranks failing at each of a few restarts fit)
MAX_FAILURES_KEPT = 256


@dataclass
class RunProgress:
    """What the workers reported: ``history`` (one metrics record per reported step, the latest
    kept after a restart re-ran steps), the export check, finished checkpoints' timings, resumes,
    the initial evaluation, the workers' early stop (``stopped``) and their failures (``failures``:
    rank, error, unix time and who saw it: the worker's own report before Ray Train's restart, or Ray
    Train's for a worker lost without one; the first :data:`MAX_FAILURES_KEPT`). Each distinct error
    is said once until the next resume."""

    history: list[dict] = field(default_factory=list)
    export: dict = field(default_factory=dict)
    checkpoints: list[dict] = field(default_factory=list)
    resumes: list[dict] = field(default_factory=list)
    eval_initial: dict | None = None
    stopped: StoppedEvent | None = None
    failures: list[dict] = field(default_factory=list)
    failures_said: set[str] = field(default_factory=set)  # the errors said since the last resume
    worker_reports: set[tuple[int, str]] = field(default_factory=set)  # (rank, error) the workers reported themselves since then

    def add(self, event: ProgressEvent, say) -> str | None:
        """Take one event; ``say(text)`` prints a line above the bar. Returns the bar's new info
        text for a step, else None."""
        if isinstance(event, ExportEvent):
            self.export = event.info
        elif isinstance(event, CheckpointEvent):
            self.checkpoints.append(event.timing)
        elif isinstance(event, InitialEvalEvent):
            self.eval_initial = {"eval_loss": event.eval_loss, "eval_tokens": event.eval_tokens}
            say(f"eval loss before training: {event.eval_loss:.4f}")
        elif isinstance(event, ResumedEvent):
            self.failures_said.clear()  # a restart's new failures are said again
            self.worker_reports.clear()
            self.resumes.append(
                {"step": event.step, "from_world_size": event.from_world_size, "world_size": event.world_size, "load_s": event.load_s}
            )
            say(
                f"resumed from the checkpoint of step {event.step} (world size {event.from_world_size} → {event.world_size}; loaded in {event.load_s:.1f} s)"
            )
        elif isinstance(event, StoppedEvent):
            self.stopped = event
            held = f"checkpoint of step {event.checkpoint_step}" if event.checkpoint_step is not None else "no checkpoint"
            say(f"workers stopped after step {event.steps_done} ({event.reason}); {held}")
        elif isinstance(event, WorkerFailedEvent):
            self.add_failure(event, say)
        elif isinstance(event, StepEvent):
            return self.add_step(event.metrics)
        return None

    def add_failure(self, event: WorkerFailedEvent, say) -> None:
        """A worker's failure: kept (the first :data:`MAX_FAILURES_KEPT`) and said, once per distinct
        error (numbers aside: a pid, a rank) until the next resume. Ray Train's report of what a
        worker reported itself since then (the same rank and text) is that failure seen from the
        controller: dropped."""
        if event.seen_by == "worker":
            self.worker_reports.add((event.rank, event.error))
        elif (event.rank, event.error) in self.worker_reports:
            return
        if len(self.failures) < MAX_FAILURES_KEPT:
            self.failures.append(
                {"rank": event.rank, "error": event.error, "unix_time": event.unix_time, "seen_by": event.seen_by, "lost": event.lost}
            )
        key = re.sub(r"\d+", "#", event.error)
        if key in self.failures_said:  # every rank's failed save says the same: one line for them
            return
        self.failures_said.add(key)
        what = f"Ray Train lost worker rank {event.rank}" if event.lost else f"worker rank {event.rank} failed"
        say(
            f"{what}: {event.error}; Ray Train restarts the workers from the newest checkpoint while ray.max_failures "
            "allows (the workers' logs have the traceback)"
        )

    def add_step(self, m: dict) -> str:
        # After a restart the steps since the last checkpoint run again: keep the latest.
        while self.history and self.history[-1]["step"] >= m["step"]:
            self.history.pop()
        self.history.append(m)
        unit = "GPU" if m["gpu"] != "cpu" else "worker"
        info = f"loss {m['loss']:.4f}  {m['tokens_per_s_per_gpu']:,.0f} tok/s/{unit}"
        if m.get("mfu"):
            info += f"  MFU {100 * m['mfu']:.1f}%"
        if "eval_loss" in m:
            info += f"  eval {m['eval_loss']:.4f}"
        return info

    def extra(self) -> dict:
        """The summary's non-step parts (:func:`rayft.train.summary.build_summary`)."""
        extra = {"export": self.export, "checkpoints": self.checkpoints, "resumes": self.resumes, "failures": self.failures}
        if self.eval_initial is not None:
            extra["eval_initial"] = self.eval_initial
        return extra


def plain_line(step: int, total: int, info: str, elapsed_s: float, eta_s: float | None) -> str:
    """The progress line printed where no live bar can be drawn (a log file, a pipe, Ray job logs):
    ``step 12/100 (12%)  loss 1.2345  ...  elapsed 0:01:05  ETA 0:08:10``."""

    def hms(s: float) -> str:
        s = int(round(s))
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

    eta = f"  ETA {hms(eta_s)}" if eta_s is not None else ""
    return f"step {step}/{total} ({100 * step / max(total, 1):.0f}%)  {info}  elapsed {hms(elapsed_s)}{eta}"


def show_progress(
    fit_thread: threading.Thread,
    channel: ProgressChannel,
    total: int,
    console: Console,
    signals: SignalStop | None = None,
    on_step: Callable[[dict], None] | None = None,
    tick: Callable[[], None] | None = None,
    run: RunProgress | None = None,
) -> RunProgress:
    """Show the progress of ``total`` steps until ``fit_thread`` (running ``trainer.fit()``) ends
    and the channel is empty, or a signal's grace period is over (``signals``); returns what was
    reported. On a terminal that is a live progress bar; elsewhere (``console`` not a terminal: a
    file, a pipe, Ray job logs) one plain line per reported step (:func:`plain_line`; the workers
    report every ``train.log_every`` steps, the first and the last). ``on_step(metrics)`` is
    called with each step's record as it arrives, ``tick()`` every quarter second. ``run``: where to
    collect (a new one by default), so that a caller keeps what arrived when this raises."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    run = RunProgress() if run is None else run
    live = console.is_terminal
    cols = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    started = time.monotonic()
    first: list[tuple[int, float]] = []  # the first reported step and when: the ETA's rate is measured from there
    # refreshed from this loop, not rich's thread: a console that fails (a closed pipe) fails here, where the driver sees it
    with Progress(*cols, console=console, transient=False, auto_refresh=False) if live else contextlib.nullcontext() as bar:
        task = bar.add_task("train", total=total, info="starting workers…") if live else None
        out = bar.console if live else console

        def say(text: str) -> None:
            out.print(text, highlight=False, markup=False)  # texts from outside (a stop reason) are no markup

        def show(step: int, info: str) -> None:
            now = time.monotonic()
            if live:
                bar.update(task, completed=step, info=info)
                return
            if not first:
                first.append((step, now))
            s0, t0 = first[0]
            eta = (now - t0) / (step - s0) * (total - step) if step > s0 else None
            out.print(plain_line(step, total, info, now - started, eta), highlight=False, markup=False, soft_wrap=True)

        while True:
            if signals is not None:
                signals.poll()  # a signal's notes and stop request, outside its handler
            if tick is not None:
                tick()
            alive = fit_thread.is_alive()
            events = channel.drain()
            shown: list[tuple[list[str], int | None, str | None]] = []  # each event's lines, then its step's line
            for event in events:  # all recorded before anything is shown: a display that fails loses no drained event
                lines: list[str] = []
                info = run.add(event, lines.append)
                if info is not None and on_step is not None:
                    on_step(run.history[-1])
                shown.append((lines, run.history[-1]["step"] if info is not None else None, info))
            try:
                for lines, step, info in shown:
                    for line in lines:
                        say(line)
                    if info is not None:
                        show(step, info)
                if live:
                    bar.refresh()
            except BlockingIOError:  # a non-blocking stream full for now: rich writes what it kept with its next output
                pass
            if not alive and not events:
                break
            if signals is not None and signals.past_deadline():
                say(f"{signals.name}: the workers did not stop within {signals.grace_s:g} s; writing what arrived and exiting")
                break
            fit_thread.join(0.25)  # a quarter second, or less where fit returns meanwhile: its end is not waited for
    return run


def progress_failure(e: BaseException, console: Console) -> str:
    """The reason a driver gives for :func:`show_progress`'s failure ``e``. A failure inside rich's
    console (its file a closed pipe or a hung-up terminal; on a closed pipe rich raises
    ``SystemExit(1)``, ``Console.on_broken_pipe``) also makes ``console`` quiet: every later print
    to it would fail the same way, the signals' notes and the summary's included."""
    import rich

    root = os.path.dirname(rich.__file__) + os.sep
    tb, in_console = e.__traceback__, False
    while tb is not None and not in_console:
        in_console = tb.tb_frame.f_code.co_filename.startswith(root)
        tb = tb.tb_next
    why = "its console's pipe was closed" if isinstance(e, SystemExit) and in_console else failure_text(e, limit=500)
    if not in_console:
        return f"the driver's progress loop failed ({why})"
    console.quiet = True
    return f"the driver could not show the run's progress ({why})"

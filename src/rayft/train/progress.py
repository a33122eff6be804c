"""The driver's live view of a run: drain the workers' progress events into a progress bar while
Ray Train runs, and collect what the summary needs."""

from __future__ import annotations

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
)
from rayft.train.stop import SignalStop


@dataclass
class RunProgress:
    """What the workers reported: ``history`` (one metrics record per reported step, the latest
    kept after a restart re-ran steps), the export check, finished checkpoints' timings, resumes,
    the initial evaluation and the workers' early stop (``stopped``)."""

    history: list[dict] = field(default_factory=list)
    export: dict = field(default_factory=dict)
    checkpoints: list[dict] = field(default_factory=list)
    resumes: list[dict] = field(default_factory=list)
    eval_initial: dict | None = None
    stopped: StoppedEvent | None = None

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
        elif isinstance(event, StepEvent):
            return self.add_step(event.metrics)
        return None

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
        extra = {"export": self.export, "checkpoints": self.checkpoints, "resumes": self.resumes}
        if self.eval_initial is not None:
            extra["eval_initial"] = self.eval_initial
        return extra


def show_progress(
    fit_thread: threading.Thread,
    channel: ProgressChannel,
    total: int,
    console: Console,
    signals: SignalStop | None = None,
    on_step: Callable[[dict], None] | None = None,
    tick: Callable[[], None] | None = None,
) -> RunProgress:
    """Show a progress bar of ``total`` steps until ``fit_thread`` (running ``trainer.fit()``) ends
    and the channel is empty, or a signal's grace period is over (``signals``); returns what was
    reported. ``on_step(metrics)`` is called with each step's record as it arrives, ``tick()``
    every quarter second."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    run = RunProgress()
    cols = [
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ]
    with Progress(*cols, console=console, transient=False, refresh_per_second=4) as bar:
        task = bar.add_task("train", total=total, info="starting workers…")

        def say(text: str) -> None:
            bar.console.print(text, highlight=False, markup=False)  # texts from outside (a stop reason) are no markup

        while True:
            if signals is not None:
                signals.poll()  # a signal's notes and stop request, outside its handler
            if tick is not None:
                tick()
            alive = fit_thread.is_alive()
            events = channel.drain()
            for event in events:
                info = run.add(event, say)
                if info is not None:
                    bar.update(task, completed=run.history[-1]["step"], info=info)
                    if on_step is not None:
                        on_step(run.history[-1])
            if not alive and not events:
                break
            if signals is not None and signals.past_deadline():
                say(f"{signals.name}: the workers did not stop within {signals.grace_s:g} s; writing what arrived and exiting")
                break
            time.sleep(0.25)
    return run

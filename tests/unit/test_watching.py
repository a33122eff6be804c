"""Watching a run without a terminal, and its metrics across --resume (issue 21, item 6)."""

import io
import json
import os
import threading
import time
from collections import deque

import pytest
from rich.console import Console

from rayft.train.events import ProgressChannel, ResumedEvent, StepEvent
from rayft.train.progress import show_progress
from rayft.train.run_dir import MetricsLog, write_metrics


class ListMailbox:
    """The run actor's mailbox as the driver reads it (take: every event not taken yet), over a list."""

    def __init__(self, events):
        self.events = deque(events)

    def take(self):
        taken, self.events = list(self.events), deque()
        return taken


def step(n: int, loss: float) -> StepEvent:
    return StepEvent({"step": n, "loss": loss, "tokens_per_s_per_gpu": 1234.5, "gpu": "cpu", "mfu": None})


def test_plain_progress_lines_when_output_is_not_a_terminal():
    events = [ResumedEvent(step=2, from_world_size=2, world_size=2, load_s=0.5), step(3, 2.5), step(6, 2.0), step(5, 2.2), step(8, 1.5)]
    buf = io.StringIO()
    console = Console(file=buf, width=80)  # a file: no terminal, as under nohup, CI, kubectl logs or Ray job logs
    assert not console.is_terminal
    fit = threading.Thread(target=time.sleep, args=(0.3,))
    fit.start()
    seen = []
    run = show_progress(fit, ProgressChannel(ListMailbox(events)), 8, console, on_step=seen.append)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "resumed from the checkpoint of step 2 (world size 2 → 2; loaded in 0.5 s)"
    steps = [ln for ln in lines if ln.startswith("step ")]
    # one whole line per reported step (never cut at 80 columns), as it arrives; a step reported again after a restart too
    assert [ln.split()[1] for ln in steps] == ["3/8", "6/8", "5/8", "8/8"]
    assert steps[0].startswith("step 3/8 (38%)  loss 2.5000  1,234 tok/s/worker  elapsed 0:00:0")
    assert "ETA" not in steps[0] and steps[-1].endswith("ETA 0:00:00")
    assert [h["step"] for h in run.history] == [3, 5, 8] and [m["step"] for m in seen] == [3, 6, 5, 8]


def test_resumed_run_keeps_the_metrics_before_its_checkpoint_once(tmp_path):
    path = tmp_path / "rayft_metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 10.0 - s}) + "\n" for s in range(1, 8)) + '{"step": 8, "lo')  # cut by a kill
    log = MetricsLog(str(tmp_path), resumed_step=5)  # resumed from the checkpoint of step 5: steps 6 and 7 run again
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4, 5]
    history = [{"step": s, "loss": 1.0} for s in (6, 7, 8)]
    for rec in history:
        log.append(rec)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == list(range(1, 9))  # kept as they came: a stop keeps them
    write_metrics(str(tmp_path), history, resumed=True)  # the end of the run
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, 9)) and recs[4]["loss"] == 5.0 and recs[5]["loss"] == 1.0
    MetricsLog(str(tmp_path), resumed_step=None)  # a new run starts the file empty
    assert path.read_text() == ""


def test_a_failed_rewrite_of_the_records_leaves_the_old_ones_whole(tmp_path, monkeypatch):
    """A full disk at the run's end: the metrics and summary files keep what they held (write_text
    would have emptied them first), and no temporary file is left."""
    from rayft.train.run_dir import write_run_records

    old = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2))
    (tmp_path / "rayft_metrics.jsonl").write_text(old)

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    history = [{"step": s, "loss": 0.5} for s in (1, 2, 3)]
    with pytest.raises(OSError, match="No space left"):
        write_run_records(str(tmp_path), history, {"steps": 3}, resumed=False)
    assert (tmp_path / "rayft_metrics.jsonl").read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rayft_metrics.jsonl"]
    monkeypatch.undo()
    write_run_records(str(tmp_path), history, {"steps": 3}, resumed=False)
    assert [json.loads(x)["loss"] for x in (tmp_path / "rayft_metrics.jsonl").read_text().splitlines()] == [0.5] * 3
    assert json.loads((tmp_path / "rayft_summary.json").read_text()) == {"steps": 3}


def test_the_error_of_a_run_its_driver_stopped_names_the_checkpoint_and_what_it_lacks():
    from rayft.train.driver import driver_failure_error

    reason = "the driver could not record step 3 (OSError: [Errno 28] No space left on device)"
    got = [str(driver_failure_error(reason, {"steps_done": 5, "checkpoint_step": held}, "/runs/r")) for held in (5, 4, 2, None)]
    assert got == [
        f"{reason}; the workers stopped after step 5; newest checkpoint: step 5; resume with: rayft train <the run's config> --resume /runs/r",
        f"{reason}; the workers stopped after step 5; newest checkpoint: step 4 (step 5 is not in it: checkpoint.on_signal is off); "
        "resume with: rayft train <the run's config> --resume /runs/r",
        f"{reason}; the workers stopped after step 5; newest checkpoint: step 2 (steps 3-5 are not in it: checkpoint.on_signal is off); "
        "resume with: rayft train <the run's config> --resume /runs/r",
        f"{reason}; the workers stopped after step 5; no checkpoint to resume from",
    ]


def test_unreachable_hub_is_one_line_and_the_cache(monkeypatch):
    from huggingface_hub import constants

    from rayft.train.hub import offline_when_unreachable

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    said, probes = [], []

    def probe():
        probes.append(1)
        return "[Errno -2] Name or service not known"

    assert not offline_when_unreachable(["qwen2-tiny", "qwen2.5", None], said.append, probe)  # nothing from the Hub: no probe
    assert probes == [] and said == []
    assert offline_when_unreachable(["Org/Model-1B", None], said.append, probe)
    assert probes == [1] and constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"
    assert said == [
        f"note: {constants.ENDPOINT} cannot be reached ([Errno -2] Name or service not known): "
        "Org/Model-1B from the local Hugging Face cache only (HF_HUB_OFFLINE=1)"
    ]
    assert not offline_when_unreachable(["Org/Model-1B"], said.append, probe) and probes == [1]  # already offline: no second probe


def test_every_offline_tokenizer_name_makes_no_hub_probe():
    from rayft.train.hub import hub_ids

    names = ["qwen2.5", "qwen3", "llama3", "mistral-v3"]
    assert hub_ids([*names, "Org/Model-1B", "qwen2-tiny"]) == ["Org/Model-1B"]  # only the Hub id is left


def test_flag_types_patch_is_a_no_op_on_older_typers(monkeypatch):
    from typer.core import TyperOption

    from rayft.commands.help_format import hide_flag_types

    for cls in TyperOption.__mro__:  # typer < ~0.28 has no such method, on the class or its bases
        if "display_type_rich" in vars(cls):
            monkeypatch.delattr(cls, "display_type_rich")
    hide_flag_types()  # no AttributeError
    assert not hasattr(TyperOption, "display_type_rich")


def test_version_and_help_screens_without_bool_placeholders():
    from typer.testing import CliRunner

    from rayft import __version__
    from rayft.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output == f"rayft {__version__}\n"
    for args in (["--help"], ["submit", "--help"], ["generate", "--help"]):
        res = CliRunner().invoke(app, args, terminal_width=200)
        assert res.exit_code == 0 and "--help" in res.output and "<bool>" not in res.output, args
    assert "<path>" in res.output and "<int>" in res.output  # options that take a value keep their type


def test_torchao_import_noise_dropped(caplog):
    import logging

    import rayft  # noqa: F401 -- its import installs the filters

    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning(
            "Failed to load /x/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load this library"
        )
        logging.getLogger("torch.utils._pytree").warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by ..."
        )
        logging.getLogger("torchao").warning("float8 is slow here")
    assert [r.getMessage() for r in caplog.records] == ["float8 is slow here"]  # other warnings still show


def test_the_loop_sees_fit_return_without_finishing_its_quarter_second():
    """fit ends 0.05 s into the loop's first wait: the loop returns then, not at the wait's end (0.25 s),
    which is what the run's `end` phase counted (bench/NOTES.md §42)."""
    fit = threading.Thread(target=time.sleep, args=(0.05,))
    t0 = time.perf_counter()
    fit.start()
    show_progress(fit, ProgressChannel(ListMailbox([])), 8, Console(file=io.StringIO()))
    assert not fit.is_alive()
    assert time.perf_counter() - t0 < 0.2


def test_a_fit_that_ended_during_the_data_phase_is_named_by_ray_trains_error():
    """The data phase's watch on the workers' start (WorkerLaunch.check_started): a live ``fit`` is
    no error; one that ended says whether the workers failed (Ray Train's WorkerGroupError, or its
    ControllerError around a worker's failed call: the process group's set-up, which the controller
    makes through the workers' actors) or Ray Train's run did before them (its controller: the run's
    storage, say), with Ray Train's text."""
    import ray.exceptions
    from ray.train import ControllerError, WorkerGroupError

    from rayft.train.errors import TrainError
    from rayft.train.worker_launch import WorkerLaunch

    launch = WorkerLaunch(None, Console(file=io.StringIO()), "r", "/runs/r", None, None, "id", None, None, {})
    launch.check_started()  # fit not started yet
    release = threading.Event()
    launch.thread = threading.Thread(target=release.wait)
    launch.thread.start()
    launch.check_started()  # starting: no error
    release.set()
    launch.thread.join()

    def said(error):
        launch.outcome["error"] = error
        with pytest.raises(TrainError) as e:
            launch.check_started()
        return str(e.value)

    gloo = RuntimeError("Unable to find address for: bogus0")
    assert said(WorkerGroupError("Training failed due to worker errors", {0: gloo})).startswith(
        "the workers failed at their start, while the data were tokenized: Training failed due to worker errors"
    )
    in_worker = ray.exceptions.RayTaskError("execute._setup_torch_process_group", "Traceback: ... bogus0", gloo)
    assert said(ControllerError(in_worker)).startswith(
        "the workers failed at their start, while the data were tokenized: Training failed due to controller error:"
    )
    assert said(ControllerError(PermissionError(13, "Permission denied", "/runs/r"))) == (
        "Ray Train's run failed before training, while the data were tokenized: "
        "Training failed due to controller error:\n[Errno 13] Permission denied: '/runs/r'"
    )


class TerminalFailing:
    """A terminal's file that fails with ``error``: from its first write that holds ``at`` on (a
    hung-up terminal: EIO), or at that write only (``once``: a non-blocking stream full for a
    moment, EAGAIN; rich keeps what it could not write and writes it with its next)."""

    def __init__(self, error, at, once=False):
        self.error, self.at, self.once, self.failed, self.text = error, at, once, 0, ""

    def isatty(self):
        return True

    def write(self, text):
        if (self.at in text and not (self.once and self.failed)) or (self.failed and not self.once):
            self.failed += 1
            raise self.error
        self.text += text
        return len(text)

    def flush(self):
        pass


def test_a_live_bar_whose_terminal_fails_raises_in_the_loop_while_fit_runs():
    """On a terminal the bar is drawn from the progress loop, not rich's refresh thread, so a
    terminal that fails mid-run (EIO) raises there while ``fit`` still runs (the driver then asks the
    workers to stop: rayft.train.driver) instead of dying silently in rich's thread, unseen until the
    run's end; the failure is named as the console's, and the console made quiet."""
    from rayft.train.progress import RunProgress, progress_failure

    console = Console(file=TerminalFailing(OSError(5, "Input/output error"), at="loss"), width=100, force_terminal=True)
    assert console.is_terminal
    release = threading.Event()
    fit = threading.Thread(target=release.wait, args=(30,))
    fit.start()
    run = RunProgress()
    t0 = time.monotonic()
    try:
        with pytest.raises(OSError) as e:
            show_progress(fit, ProgressChannel(ListMailbox([step(n, 2.0) for n in range(1, 6)])), 100, console, run=run)
        assert fit.is_alive() and time.monotonic() - t0 < 5
    finally:
        release.set()
    assert [h["step"] for h in run.history] == [1, 2, 3, 4, 5]  # every drained event recorded before any was shown
    assert progress_failure(e.value, console) == "the driver could not show the run's progress (OSError: [Errno 5] Input/output error)"
    assert console.quiet


def test_a_stream_full_for_a_moment_delays_a_line_and_the_run_goes_on():
    """EAGAIN from a non-blocking stream (a CI runner's pipe, say) is not a dead console: the loop
    goes on, and the line rich could not write comes with the next one."""
    out = TerminalFailing(BlockingIOError(11, "Resource temporarily unavailable"), at="step 1/", once=True)
    out.isatty = lambda: False  # plain lines, one write each
    sent = threading.Event()
    fit = threading.Thread(target=sent.wait, args=(30,))  # ends once step 2 was handed over
    fit.start()

    class Later(ListMailbox):  # step 1 now, step 2 on a later pass
        def take(self):
            taken = super().take()
            if not taken and not sent.is_set():
                sent.set()
                return [step(2, 1.5)]
            return taken

    console = Console(file=out, width=200)
    run = show_progress(fit, ProgressChannel(Later([step(1, 2.0)])), 2, console)
    assert [h["step"] for h in run.history] == [1, 2] and out.failed == 1 and not console.quiet
    assert [ln.split()[1] for ln in out.text.splitlines()] == ["1/2", "2/2"]

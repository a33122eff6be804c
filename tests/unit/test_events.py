"""The driver↔worker boundary: typed progress events (an unknown one is an error, never a step),
the driver's collection of them, the workers' typed arguments and the step clock."""

import pickle

import pytest

from rayft.train.events import (
    CheckpointEvent,
    ExportEvent,
    InitialEvalEvent,
    ProgressChannel,
    ResumedEvent,
    StepEvent,
    UnknownEventError,
)
from rayft.train.progress import RunProgress
from rayft.train.step import StepClock
from rayft.train.worker_args import WorkerArgs


class ListMailbox:
    """A mailbox with the run actor's two sides (rayft.train.run_actor.ActorMailbox): post, and take
    every event not taken yet."""

    def __init__(self, items):
        self.items = list(items)

    def post(self, event, wait=False, timeout_s=None):
        self.items.append(event)

    def take(self):
        taken, self.items = self.items, []
        return taken


def step(n, loss=1.0):
    return {"step": n, "loss": loss, "tokens_per_s_per_gpu": 1000.0 * n, "gpu": "cpu"}


def test_an_untyped_message_is_refused_on_both_sides():
    channel = ProgressChannel.silent()
    with pytest.raises(UnknownEventError, match=r"not a progress event: dict \{'chekpoint'"):
        channel.send({"chekpoint": {"step": 2}})  # a misspelt key was once taken for a step
    channel.send(CheckpointEvent({"step": 2}))  # a silent channel drops typed events
    received = ProgressChannel(ListMailbox([StepEvent(step(1)), {"step": 2}]))
    with pytest.raises(UnknownEventError, match=r"not a progress event: dict"):
        received.drain()


def test_events_go_through_the_mailbox_in_order_and_are_taken_once():
    from rayft.train.run_actor import RunActor

    box = ListMailbox([])
    channel = ProgressChannel(box)
    first, second = StepEvent(step(1)), CheckpointEvent({"step": 1})
    channel.send(first)
    with pytest.raises(UnknownEventError):
        channel.send({"step": 2})  # refused before it is posted
    channel.send(second, wait=True)
    assert box.items == [first, second]
    assert channel.drain() == [first, second] and channel.drain() == []
    actor = RunActor()  # the actor's state, as the driver and rank 0 call it
    actor.post(first)
    actor.post(second)
    assert actor.take() == [first, second] and actor.take() == []


def test_only_rank_0_reports():
    channel = ProgressChannel(ListMailbox([]))
    assert channel.for_rank(0) is channel
    assert channel.for_rank(1).mailbox is None


def test_the_driver_collects_each_kind_and_keeps_the_latest_of_a_rerun_step():
    said = []
    events = [
        InitialEvalEvent(eval_loss=2.5, eval_tokens=40.0),
        StepEvent(step(1, 3.0)),
        StepEvent(step(2, 2.9)),
        CheckpointEvent({"step": 2, "save_s": 0.5}),
        StepEvent(step(3, 2.8)),
        ResumedEvent(step=2, from_world_size=2, world_size=1, load_s=0.25),
        StepEvent(step(3, 2.7)),  # after a restart from step 2: step 3 again
        ExportEvent({"export_dir": "/r/hf", "export_max_abs_logit_diff": 0.0}),
    ]
    run = RunProgress()
    infos = [run.add(e, said.append) for e in ProgressChannel(ListMailbox(events)).drain()]
    assert [h["loss"] for h in run.history] == [3.0, 2.9, 2.7]
    assert infos[1] == "loss 3.0000  1,000 tok/s/worker"
    assert said == [
        "eval loss before training: 2.5000",
        "resumed from the checkpoint of step 2 (world size 2 → 1; loaded in 0.2 s)",
    ]
    assert run.extra() == {
        "export": {"export_dir": "/r/hf", "export_max_abs_logit_diff": 0.0},
        "checkpoints": [{"step": 2, "save_s": 0.5}],
        "resumes": [{"step": 2, "from_world_size": 2, "world_size": 1, "load_s": 0.25}],
        "failures": [],
        "eval_initial": {"eval_loss": 2.5, "eval_tokens": 40.0},
    }


def test_worker_args_travel_pickled_and_are_checked_on_arrival():
    args = WorkerArgs(
        config={"data": {"train_files": ["x.jsonl"]}},
        dataset=None,
        validation=None,
        plan=None,
        pad_id=151643,
        data_fingerprint="abc",
        tokenizer="qwen2.5",
        run_dir="/runs/r",
        progress=ProgressChannel.silent(),
    )
    back = WorkerArgs.from_loop_config(pickle.loads(pickle.dumps(args.loop_config())))
    assert back == args and back.parsed_config().data.train_files == ["x.jsonl"]
    with pytest.raises(TypeError, match=r"train_loop_config\['args'\] must be a WorkerArgs, got dict"):
        WorkerArgs.from_loop_config({"args": {"config": {}}})


def test_step_clock_laps_and_skips(monkeypatch):
    now = iter([10.0, 12.0, 20.0, 21.0])
    monkeypatch.setattr("rayft.train.step.time.perf_counter", lambda: next(now))
    clock = StepClock()  # 10.0
    assert clock.lap() == 2.0  # 10 → 12
    clock.skip()  # a checkpoint until 20: not step time
    assert clock.lap() == 1.0


def test_step_clock_with_device_marks_measures_between_device_moments(monkeypatch):
    """On a GPU the marks are timed events: a step's time runs from the previous step's end (or
    the clock's start, or a skip: where the host was then) to its own end, on the device, however
    late the host finishes it (the loop finishes a step after it queued the next)."""
    host = iter([10.0, 30.0, 30.5, 40.0, 41.0, 42.0])
    monkeypatch.setattr("rayft.train.step.time.perf_counter", lambda: next(host))

    class DeviceMoment:  # a timed CUDA event: elapsed_time is milliseconds between two device moments
        def __init__(self, at_s):
            self.at_s = at_s

        def elapsed_time(self, other):
            return (other.at_s - self.at_s) * 1e3

    device = iter([DeviceMoment(100.0), DeviceMoment(112.0)])  # the marks the clock records itself (start, skip)
    monkeypatch.setattr(StepClock, "_device_now", lambda self: next(device))
    clock = StepClock(device_marks=True)  # host 10.0, device 100.0
    assert clock.lap(DeviceMoment(101.5)) == pytest.approx(1.5)  # finished by the host at 30: the device's 1.5 s
    assert clock.lap(DeviceMoment(102.1)) == pytest.approx(0.6)  # the host saw it at 30.5
    clock.skip()  # a checkpoint: host 40.0, device 112.0
    assert clock.lap(DeviceMoment(112.7)) == pytest.approx(0.7)  # from the skip's mark, not the last step's end
    assert clock.lap() == pytest.approx(1.0)  # no step end: the host's, 41 → 42


def test_the_resume_line_warns_when_the_packing_rule_or_the_global_batch_changed():
    from rayft.data.packing import PACKING_RULE, packing_rule
    from rayft.train.loop import resume_note

    assert (packing_rule(True), packing_rule(False)) == (PACKING_RULE, "none") == ("bfd-1", "none")
    same = {"step": 4, "world_size": 2, "global_batch_rows": 8, "packing": "bfd-1"}
    assert resume_note(same, 2, 8, "bfd-1") == ""
    assert resume_note(same, 1, 8, "bfd-1") == " (saved at world size 2, resharded to 1 by DCP)"
    older = {"step": 4, "world_size": 2, "global_batch_rows": 8}  # written before the rule was recorded
    assert resume_note(older, 2, 8, "bfd-1") == (
        "; WARNING: the checkpoint records no packing rule (written before rayft recorded it), this run packs with 'bfd-1', "
        "so the rows, and the data order, differ from the original run's from here on"
    )
    assert resume_note(older, 2, 8, "none") == ""  # padding mode's rows never changed
    assert resume_note({**same, "packing": "bfd-0"}, 2, 16, "bfd-1") == (
        "; WARNING: the global batch changed from 8 to 16 rows, so the data order differs from the original run "
        "(keep workers × micro_batch_size × grad_accum_steps); WARNING: the checkpoint records packing rule 'bfd-0', "
        "this run packs with 'bfd-1', so the rows, and the data order, differ from the original run's from here on"
    )
    assert "records packing rule 'bfd-1', this run packs with 'none'" in resume_note(same, 2, 8, "none")


def test_a_checkpoints_state_records_the_packing_rule():
    from types import SimpleNamespace

    import numpy as np

    from rayft.config import RayftConfig
    from rayft.data.packing import plan_steps
    from rayft.train.loop import Worker

    for packing, rule in ((True, "bfd-1"), (False, "none")):
        cfg = RayftConfig.model_validate({"data": {"train_files": ["x.jsonl"], "packing": packing}, "train": {"micro_batch_size": 2}})
        plan = plan_steps(np.full(8, 5), rows_per_step=4, row_len=16, packing=packing, shuffle=True, seed=0, epochs=1, max_steps=None)
        w = SimpleNamespace(cfg=cfg, plan=plan, world=2, args=SimpleNamespace(data_fingerprint="f", tokenizer="t"))
        state = Worker.checkpoint_state(w, 0, 1.5)
        assert state["packing"] == rule and state["global_batch_rows"] == 4 and state["step"] == 1


def test_a_workers_failure_is_said_and_kept_for_the_summary():
    """WorkerFailedEvent (a worker's own report before Ray Train restarts the group): a line on the
    driver naming the rank and error, and the summary's ``failures``."""
    from rayft.train.events import WorkerFailedEvent, failure_text

    error = failure_text(OSError(28, "No space left on device"))
    assert error == "OSError: [Errno 28] No space left on device"
    assert failure_text(RuntimeError("\n  first line\nsecond")) == "RuntimeError: first line / second"
    assert failure_text(ValueError("")) == "ValueError"
    assert failure_text(RuntimeError("x" * 500), limit=20) == "RuntimeError: xxxxx…"
    run, said = RunProgress(), []
    infos = [run.add(e, said.append) for e in ProgressChannel(ListMailbox([WorkerFailedEvent(1, error, 1.5)])).drain()]
    assert infos == [None]
    assert said == [
        "worker rank 1 failed: OSError: [Errno 28] No space left on device; Ray Train restarts the workers from the "
        "newest checkpoint while ray.max_failures allows (the workers' logs have the traceback)"
    ]
    assert run.extra()["failures"] == [{"rank": 1, "error": error, "unix_time": 1.5, "seen_by": "worker", "lost": False}]


def test_ranks_failing_alike_are_said_once_until_the_next_resume():
    """A failed save raises on every rank (a full shared disk): one line for them, each kept for the
    summary; after the restart's resume the same error is said again."""
    from rayft.train.events import ResumedEvent, WorkerFailedEvent

    full = "OSError: [Errno 28] No space left on device"
    events = [WorkerFailedEvent(r, full, 1.0) for r in range(64)] + [WorkerFailedEvent(7, "RuntimeError: gloo", 1.1)]
    events += [ResumedEvent(100, 64, 64, 15.0), WorkerFailedEvent(3, full, 2.0)]
    run, said = RunProgress(), []
    for e in ProgressChannel(ListMailbox(events)).drain():
        run.add(e, said.append)
    failed = [line.split(";")[0] for line in said if line.startswith("worker rank")]
    assert failed == [f"worker rank 0 failed: {full}", "worker rank 7 failed: RuntimeError: gloo", f"worker rank 3 failed: {full}"]
    assert len(run.extra()["failures"]) == 66


#: Ray 2.60's ActorDiedError for a Ray Train worker SIGKILLed mid-step (its text as Ray Train's controller held it, 2026-12-05)
DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n\tactor_id: 0a48ab6453f67ec3873573a901000000\n"
    "\tpid: 8523\n\tnamespace: 1963c72e-992f-4469-b840-2ddfbd7e252a\n\tip: 192.0.2.2\nThe actor is dead because its worker process has "
    "died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
    "Some common causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called"
)


def test_how_ray_train_saw_a_worker_fail_is_said_in_one_line():
    """rayft.train.worker_loss.failure_as_ray_train_saw_it on Ray Train's own error classes: a dead process (its
    pid, host and Ray's exit detail, cut to the limit; lost), a hung health check (its first line;
    lost), a train function's exception (the exception as the worker's own report says it; not lost)."""
    from ray.train.v2._internal.exceptions import (
        UserExceptionWithTraceback,
        WorkerHealthCheckFailedError,
        WorkerHealthCheckTimeoutError,
    )

    from rayft.train.worker_loss import failure_as_ray_train_saw_it

    died = WorkerHealthCheckFailedError("A worker health check failed.\nWorker info: Worker(pid=8523)", failure=RuntimeError(DIED))
    text, lost = failure_as_ray_train_saw_it(died)
    assert lost and text.startswith(
        "its process died (pid 8523 on 192.0.2.2): Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits "
        "with a connection error code 2. End of file."
    )
    assert text.endswith("(2) ray stop --force was called") and "\n" not in text and "  " not in text
    cut, _ = failure_as_ray_train_saw_it(died, limit=120)
    assert len(cut) == 120 and cut.endswith("…") and text.startswith(cut[:-1])
    hung = WorkerHealthCheckTimeoutError(
        "A worker health check has been hanging for 600.12 seconds. Marking the worker as dead.\nWorker info: x"
    )
    assert failure_as_ray_train_saw_it(hung) == (
        "WorkerHealthCheckTimeoutError: A worker health check has been hanging for 600.12 seconds. Marking the worker as dead.",
        True,
    )
    tb = 'Traceback (most recent call last):\n  File "loop.py", line 3, in run\n    raise ValueError("bad row")\nValueError: bad row\n'
    raised = UserExceptionWithTraceback(ValueError("bad row"), tb)
    assert failure_as_ray_train_saw_it(raised) == ("ValueError: bad row", False)  # as the worker's own report (failure_text) says it
    raised._base_exc = None  # a Ray that keeps only the traceback: its last line
    assert failure_as_ray_train_saw_it(raised) == ("ValueError: bad row", False)


def test_ray_trains_report_is_said_where_the_worker_could_not_report_itself():
    """Ray Train's controller reports every failed rank (rayft.train.worker_loss): a worker killed
    outright is said as "Ray Train lost worker rank R"; the controller's report of what a worker
    reported itself (same rank and text) is dropped, but not a later loss of that rank; losses that
    differ only by numbers (pids) are said once; after a resume a raise the worker could not post
    is said from the controller's report."""
    from rayft.train.events import ResumedEvent, WorkerFailedEvent

    died = "its process died (pid {} on 10.0.0.2): Worker exit type: SYSTEM_ERROR"
    events = [
        WorkerFailedEvent(1, "ValueError: bad row", 1.0),
        WorkerFailedEvent(1, "ValueError: bad row", 1.1, seen_by="ray_train"),
        WorkerFailedEvent(2, died.format(8523), 1.2, seen_by="ray_train", lost=True),
        WorkerFailedEvent(3, died.format(8524), 1.2, seen_by="ray_train", lost=True),
        WorkerFailedEvent(1, died.format(9999), 1.3, seen_by="ray_train", lost=True),  # rank 1 OOM-killed in the next attempt
        ResumedEvent(4, 4, 4, 3.0),
        WorkerFailedEvent(1, "ValueError: bad row", 5.0, seen_by="ray_train"),  # its own post timed out
    ]
    run, said = RunProgress(), []
    for e in ProgressChannel(ListMailbox(events)).drain():
        run.add(e, said.append)
    assert [line.split("; Ray Train restarts")[0] for line in said if "resumed" not in line] == [
        "worker rank 1 failed: ValueError: bad row",
        f"Ray Train lost worker rank 2: {died.format(8523)}",
        "worker rank 1 failed: ValueError: bad row",
    ]
    kept = [(f["rank"], f["seen_by"], f["lost"]) for f in run.extra()["failures"]]
    assert kept == [(1, "worker", False), (2, "ray_train", True), (3, "ray_train", True), (1, "ray_train", True), (1, "ray_train", False)]


def test_the_controllers_report_posts_each_failure_once():
    """WorkerLossReport on Ray Train's controller: a rank polled again with the same failure (a
    preempted worker, Ray 2.60) is posted once; another pid is another failure."""
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from rayft.train.worker_loss import WorkerLossReport

    mailbox = ListMailbox([])
    report = WorkerLossReport(ProgressChannel(mailbox))

    def dead(pid):
        return WorkerHealthCheckFailedError("A worker health check failed.", failure=RuntimeError(DIED.replace("8523", str(pid))))

    report.after_exception(None, {0: dead(8523)})
    report.after_exception(None, {0: dead(8523)})
    report.after_exception(None, {0: dead(8600), 1: dead(8601)})
    got = [(e.rank, e.error.split(")")[0], e.lost) for e in mailbox.items]
    assert got == [
        (0, "its process died (pid 8523 on 192.0.2.2", True),
        (0, "its process died (pid 8600 on 192.0.2.2", True),
        (1, "its process died (pid 8601 on 192.0.2.2", True),
    ]

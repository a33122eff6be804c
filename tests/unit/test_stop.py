"""The driver's signal handling: before training a signal stops at once; during training the
first asks the workers to stop (and starts the grace period), a second stops waiting."""

import os
import signal
import time

import pytest

from rayft.train.run_actor import RunActor
from rayft.train.stop import EXIT_CODES, SignalStop, StopBeforeTraining, StopPoll, stop_actor_name


def test_a_signal_before_training_stops_the_driver_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopBeforeTraining) as e:
        with SignalStop(grace_s=5, say=lambda s: None):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler raises in the main thread before this ends
    assert e.value.signum == signal.SIGTERM and EXIT_CODES[e.value.signum] == 143
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_during_training_the_first_signal_requests_a_stop_and_the_second_forces_it():
    said, requested = [], []
    with SignalStop(grace_s=0.2, say=said.append, on_stop=requested.append) as stop:
        stop.training_started()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.signum == signal.SIGINT and stop.exit_code == 130 and stop.name == "SIGINT"
        assert requested == [] and said == []  # the handler only records: no Ray call, no output
        stop.poll()
        stop.poll()
        assert requested == ["SIGINT to the driver"]  # passed on once
        assert said == [
            "SIGINT: stopping after the current step, checkpointing the last finished one (up to 0.2 s; a second signal stops at once)"
        ]
        assert not stop.past_deadline()
        time.sleep(0.25)
        assert stop.past_deadline()  # the grace period is over
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        stop.poll()
        assert stop.forced and stop.signum == signal.SIGINT  # the first signal decides the exit code
        assert said[-1] == "a second signal (SIGTERM): stopping now without waiting for the workers"


def test_while_the_run_calls_its_workers_off_a_signal_only_records_itself_and_a_second_forces():
    """Before training, once the driver waits for workers it called off (WorkerLaunch.cancel), a
    signal raising out of that wait would leave fit's thread under Ray's shutdown at exit."""
    said = []
    with SignalStop(grace_s=5, say=said.append) as stop:
        stop.calling_off = True
        t0 = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # no StopBeforeTraining
        assert stop.signum == signal.SIGTERM and t0 <= stop.first_at <= time.monotonic() and not stop.forced
        stop.poll()
        assert said == ["SIGTERM: the run is ending before training; waiting for its workers to return (a second signal stops at once)"]
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.forced and stop.signum == signal.SIGTERM and stop.exit_code == 143


def test_a_stop_record_before_training_keeps_the_stops_reason():
    from rayft.train.summary import stop_record

    asked = stop_record("rayft stop", None, [], None, forced=False, reason="preStop of pod head-0")
    assert (asked["signal"], asked["reason"], asked["steps_done"]) == ("rayft stop", "preStop of pod head-0", 0)
    assert stop_record("SIGTERM", None, [], 4, forced=True)["reason"] == "SIGTERM to the driver"


def test_the_stop_flag_is_set_once_and_the_poll_without_a_flag_never_stops():
    flag = RunActor()
    assert flag.requested() is None
    flag.request("SIGTERM to the driver")
    flag.request("later")
    assert flag.requested() == "SIGTERM to the driver"
    poll = StopPoll(None)  # ranks other than 0
    assert poll.check_now() is False and poll.requested() is False
    assert stop_actor_name("run-1-abc") == "rayft-stop-run-1-abc"


def test_a_stop_forced_as_the_run_ended_points_to_export_not_resume(tmp_path, monkeypatch):
    """A stop forced after the last step's checkpoint was written: that checkpoint holds every step,
    which --resume refuses, so the CLI says how to export it instead of how to resume."""
    from typer.testing import CliRunner

    from rayft.cli import app
    from rayft.train import driver
    from rayft.train.errors import TrainStopped

    done = TrainStopped("SIGTERM", 143, "runs/x", 200, forced=False, steps_done=200, total_steps=200)
    assert (
        done.finished
        and str(done) == "stopped by SIGTERM after 200 step(s); checkpoint of step 200 in runs/x, its last: nothing is left to resume"
    )
    midway = TrainStopped("SIGTERM", 143, "runs/x", 150, steps_done=170, total_steps=200)
    assert not midway.finished and str(midway).endswith("; checkpoint of step 150 in runs/x")
    (tmp_path / "chat.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: {name_or_path: qwen2-tiny}\ndata: {train_files: [chat.jsonl]}\ntrain: {use_gpu: false}\n")
    for stopped, hint in ((done, "export with: rayft export runs/x"), (midway, "--resume runs/x")):

        def stop_now(*args, _stopped=stopped, **kwargs):
            raise _stopped

        monkeypatch.setattr(driver, "run_training", stop_now)
        res = CliRunner().invoke(app, ["train", str(cfg)])
        assert res.exit_code == 143 and hint in res.output, res.output
        assert ("resume with" in res.output) is (stopped is midway)

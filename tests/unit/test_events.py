"""The driver↔worker boundary: typed progress events (an unknown one is an error, never a step),
the driver's collection of them, the workers' typed arguments and the step clock."""

import pickle

import pytest
from ray.util.queue import Empty

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


class ListQueue:
    """A queue with ray.util.queue.Queue's driver-side read (get_nowait raising Empty)."""

    def __init__(self, items):
        self.items = list(items)

    def get_nowait(self):
        if not self.items:
            raise Empty
        return self.items.pop(0)


def step(n, loss=1.0):
    return {"step": n, "loss": loss, "tokens_per_s_per_gpu": 1000.0 * n, "gpu": "cpu"}


def test_an_untyped_message_is_refused_on_both_sides():
    channel = ProgressChannel.silent()
    with pytest.raises(UnknownEventError, match=r"not a progress event: dict \{'chekpoint'"):
        channel.send({"chekpoint": {"step": 2}})  # a misspelt key was once taken for a step
    channel.send(CheckpointEvent({"step": 2}))  # a silent channel drops typed events
    received = ProgressChannel(ListQueue([StepEvent(step(1)), {"step": 2}]))
    with pytest.raises(UnknownEventError, match=r"not a progress event: dict"):
        received.drain()


def test_only_rank_0_reports():
    channel = ProgressChannel(ListQueue([]))
    assert channel.for_rank(0) is channel
    assert channel.for_rank(1).queue is None


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
    infos = [run.add(e, said.append) for e in ProgressChannel(ListQueue(events)).drain()]
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
    now = iter([10.0, 10.5, 12.0, 20.0, 21.0])
    monkeypatch.setattr("rayft.train.step.time.perf_counter", lambda: next(now))
    clock = StepClock()  # 10.0
    assert clock.since_mark() == 0.5
    assert clock.lap() == 2.0  # 10 → 12
    clock.skip()  # a checkpoint until 20: not step time
    assert clock.lap() == 1.0

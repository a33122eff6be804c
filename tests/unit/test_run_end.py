"""The end of a run with an export (rayft.train.loop.finish_with_export): the last step's checkpoint
is saved once the export's weight files are written, before the export's checks, and is saved even
when the export fails, before or after its write. The export and the checkpoint writer are
stand-ins that record the order of calls; what is under test is the order and the no-loss rule."""

from types import SimpleNamespace

import pytest

from rayft.train import loop


class RecordingSaver:
    def __init__(self, calls: list[str]):
        self.calls = calls

    def save(self, module, optimizer, state: dict, metrics: dict) -> list[dict]:
        self.calls.append(f"save step {state['step']} loss {state['loss']}")
        return []


def worker(calls: list[str]) -> SimpleNamespace:
    return SimpleNamespace(
        model=SimpleNamespace(module="module"),
        model_conf=None,
        data=None,
        cfg=None,
        args=None,
        device=None,
        progress=None,
        optimizer="optimizer",
        saver=RecordingSaver(calls),
        checkpoint_state=lambda step, loss: {"step": step + 1, "loss": loss},
        saved_step=3,
    )


def fake_export(calls: list[str], fail: str | None = None):
    def export_and_verify(model, model_conf, ds, cfg, args, device, progress, after_write):
        if fail == "before_write":
            raise OSError("no room for hf.tmp")
        calls.append("write")
        after_write()
        if fail == "check":
            raise RuntimeError("read back differs")
        calls.append("check")

    return export_and_verify


def test_the_last_checkpoint_is_saved_between_the_export_write_and_its_checks(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(loop, "export_and_verify", fake_export(calls))
    w = worker(calls)
    loop.finish_with_export(w, (5, 1.25, {"step": 6}))
    assert calls == ["write", "save step 6 loss 1.25", "check"]
    assert w.saved_step == 6


@pytest.mark.parametrize(("fail", "expected"), [("before_write", ["save step 6 loss 1.25"]), ("check", ["write", "save step 6 loss 1.25"])])
def test_a_failed_export_still_saves_the_last_checkpoint_once(monkeypatch, fail, expected):
    calls: list[str] = []
    monkeypatch.setattr(loop, "export_and_verify", fake_export(calls, fail))
    w = worker(calls)
    with pytest.raises((OSError, RuntimeError)):
        loop.finish_with_export(w, (5, 1.25, {"step": 6}))
    assert calls == expected
    assert w.saved_step == 6


def test_no_checkpoint_due_means_no_save(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(loop, "export_and_verify", fake_export(calls))
    w = worker(calls)
    loop.finish_with_export(w, None)
    assert calls == ["write", "check"] and w.saved_step == 3

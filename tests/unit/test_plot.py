"""`rayft plot` on two runs' metrics files (issue 21, item 5)."""

import json

import pytest

from rayft.train.errors import TrainError
from rayft.train.plot import DPI, FIG_INCHES, plot_runs, read_metrics


def write_run(run, steps, gpu: bool, eval_every: int | None = None):
    """A run directory's rayft_metrics.jsonl, one line per step as the driver writes it (rayft.train.loop.step_record's keys)."""
    run.mkdir(parents=True)
    lines = []
    for s in steps:
        rec = {
            "step": s,
            "total_steps": steps[-1],
            "loss": 10.0 / s,
            "lr": 1e-3,
            "tokens_per_s_per_gpu": 1000.0 + s,
            "gpu": "NVIDIA H200" if gpu else "cpu",
        }
        rec["peak_mem_gib"] = 20.0 + s if gpu else None
        if eval_every and s % eval_every == 0:
            rec["eval_loss"] = 11.0 / s
        lines.append(json.dumps(rec))
    (run / "rayft_metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_two_runs_on_shared_axes_make_a_png_of_the_set_size(tmp_path):
    import matplotlib.image

    write_run(tmp_path / "cpu-run", range(1, 9), gpu=False)
    write_run(tmp_path / "gpu-run", range(1, 13), gpu=True, eval_every=4)
    out = plot_runs([tmp_path / "cpu-run", tmp_path / "gpu-run"], tmp_path / "plots" / "both.png")
    img = matplotlib.image.imread(out)
    assert img.shape[:2] == (round(FIG_INCHES[1] * DPI), round(FIG_INCHES[0] * DPI)) == (900, 1000)
    assert img[..., :3].std() > 0.05  # curves and text, not a blank page


def test_metrics_lines_read_by_step_and_bad_ones_named(tmp_path):
    write_run(tmp_path / "r", [1, 2, 3], gpu=False)
    path = tmp_path / "r" / "rayft_metrics.jsonl"
    with path.open("a") as f:
        f.write(json.dumps({"step": 2, "loss": 0.5}) + "\n")  # step 2 again (after a restart): the last one wins
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "r")] == [(1, 10.0), (2, 0.5), (3, 10.0 / 3)]
    with path.open("a") as f:
        f.write('{"loss": 1.0}\n')
    with pytest.raises(TrainError, match=rf"^{path}:5: a metrics line is a JSON object with an integer step"):
        read_metrics(tmp_path / "r")
    with pytest.raises(TrainError, match="no rayft_metrics.jsonl"):
        plot_runs([tmp_path / "missing"], tmp_path / "x.png")


def test_metrics_not_utf8_or_without_a_step_are_errors_and_no_png(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    path = run / "rayft_metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 1.0}\n{"step": 2, "note": "\xff"}\n')
    with pytest.raises(TrainError, match=rf"^{path}:2: not UTF-8 \(byte 46\)$"):
        read_metrics(run)
    assert path.read_bytes().index(b"\xff") == 46
    for empty in ("", "\n\n"):
        path.write_text(empty)
        with pytest.raises(TrainError, match=rf"^{path}: no step recorded$"):
            plot_runs([run], tmp_path / "out.png")
        assert not (tmp_path / "out.png").exists()


def test_a_single_step_is_drawn_as_a_dot(tmp_path, monkeypatch):
    import matplotlib.image
    import matplotlib.pyplot as plt

    figs = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: (figs.append(fig), close(fig)))  # keep the figure to find the point's pixel
    write_run(tmp_path / "one", [1], gpu=False)
    out = plot_runs([tmp_path / "one"], tmp_path / "one.png")
    img = matplotlib.image.imread(out)[..., :3]
    x, y = figs[0].axes[0].transData.transform((1, 10.0))  # the loss of step 1, in pixels from the bottom left
    row, col = img.shape[0] - round(y), round(x)
    blue = [0x1F / 255, 0x77 / 255, 0xB4 / 255]  # the first colour of the cycle
    patch = img[row - 1 : row + 2, col - 1 : col + 2]
    assert abs(patch - blue).max() < 0.1  # the point is drawn (a one-point line alone leaves the page white)

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

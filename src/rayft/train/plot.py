"""Curves of one or more runs from their ``rayft_metrics.jsonl`` (see :class:`rayft.train.run_dir.MetricsLog`),
drawn on shared axes with matplotlib into a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from rayft.train.errors import TrainError

# (title, [(record key, line style, label suffix)]); a panel is drawn when any run has one of its keys
PANELS = (
    ("loss", [("loss", "-", ""), ("eval_loss", "--o", " eval")]),
    ("tokens/s per GPU (worker on the CPU)", [("tokens_per_s_per_gpu", "-", "")]),
    ("peak GPU memory (GiB)", [("peak_mem_gib", "-", "")]),
)
FIG_INCHES = (10.0, 9.0)  # width, height: with ``DPI`` a 1000 x 900 pixel PNG
DPI = 100


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The step records of a run directory's ``rayft_metrics.jsonl``, by step (the last line of a
    step wins, as after a restart that re-ran it).

    Raises:
        TrainError: no such file, a file that is not UTF-8 (``FILE:LINE: not UTF-8 (byte N)``, N the
            0-based offset), a line that is not a JSON object with a ``step`` (FILE:LINE), or a
            file with no step at all (``FILE: no step recorded``).
    """
    path = Path(run_dir) / "rayft_metrics.jsonl"
    try:
        data = path.read_bytes()
    except OSError:
        raise TrainError(f"{run_dir}: no rayft_metrics.jsonl (not a run directory, or no step reported yet)") from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        bad_line = data[: e.start].count(b"\n") + 1
        raise TrainError(f"{path}:{bad_line}: not UTF-8 (byte {e.start})") from None
    by_step: dict[int, dict] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrainError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise TrainError(f"{path}:{n}: a metrics line is a JSON object with an integer step")
        by_step[rec["step"]] = rec
    if not by_step:
        raise TrainError(f"{path}: no step recorded")
    return [by_step[s] for s in sorted(by_step)]


def plot_runs(run_dirs: list[str | Path], out: str | Path) -> Path:
    """Draw loss (and eval loss), tokens/s per GPU and peak GPU memory against step for each run
    (labelled by its directory's name) into the PNG ``out`` (``FIG_INCHES`` x ``DPI`` pixels). A
    panel no run has values for says so instead of a curve (memory of CPU runs).

    Raises:
        TrainError: a run without metrics (:func:`read_metrics`), or two runs with the same name.
    """
    try:
        import matplotlib
    except ImportError:
        raise TrainError("rayft plot needs matplotlib (pip install 'rayft[plot]')") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(d).resolve().name, read_metrics(d)) for d in run_dirs]
    names = [n for n, _ in runs]
    if len(set(names)) != len(names):
        raise TrainError(f"runs with the same name: {names} (each run is labelled by its directory's name)")
    fig, axes = plt.subplots(len(PANELS), 1, figsize=FIG_INCHES, dpi=DPI, sharex=True)
    try:
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for ax, (title, series) in zip(axes, PANELS):
            drawn = False
            for i, (name, recs) in enumerate(runs):
                for key, style, suffix in series:
                    pts = [(r["step"], r[key]) for r in recs if r.get(key) is not None]
                    if pts:
                        xs, ys = zip(*pts)
                        dot = {"marker": "o"} if len(pts) == 1 else {}  # a line through one point draws nothing: a dot
                        ax.plot(xs, ys, style, color=colors[i % len(colors)], label=name + suffix, markersize=4, **dot)
                        drawn = True
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "not recorded (CPU runs)", ha="center", va="center", transform=ax.transAxes, color="gray")
        axes[-1].set_xlabel("step")
        fig.tight_layout()
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=DPI)
    finally:
        plt.close(fig)
    return out

"""The float8-vs-bf16 comparison of ``bench/gpu/float8_evidence.sh`` (issue 23), from its two runs' files.

    python3 bench/gpu/float8_compare.py DIR OUT.json [--command "..."]

``DIR`` holds each mode's ``metrics-MODE.jsonl`` (the run's ``rayft_metrics.jsonl``: the steps the
driver recorded, every ``train.log_every``-th) and ``float8-evidence-MODE-1xgpu.json``
(``rayft.benchmarks.record``). Writes one results file: the loss gap (float8 − bf16) at the recorded
steps, its largest absolute value after step 50 (and up to step 250), the mean gap after step 50,
each run's held-out losses and their lowest, tokens/s, MFU, peak memory, wall time and both loss
curves. Its ``environment`` and ``git_commit`` are the float8 run's (the GPU host's), not this machine's.
"""

import argparse
import json
import statistics
from pathlib import Path

MODES = ("bf16", "float8")


def compare(d: Path) -> dict:
    """The comparison's figures from the two runs' files in ``d`` (FileNotFoundError: a run is missing)."""
    runs = {m: {r["step"]: r for r in map(json.loads, (d / f"metrics-{m}.jsonl").read_text().splitlines())} for m in MODES}
    fig = {m: json.loads((d / f"float8-evidence-{m}-1xgpu.json").read_text())["figures"] for m in MODES}
    common = sorted(set(runs["bf16"]) & set(runs["float8"]))
    after = {s: runs["float8"][s]["loss"] - runs["bf16"][s]["loss"] for s in common if s > 50}
    worst = max(after, key=lambda s: abs(after[s]))
    evals = {m: {str(s): r["eval_loss"] for s, r in runs[m].items() if "eval_loss" in r} for m in MODES}
    return {
        "steps": common[-1],
        "loss_points": f"the steps the driver recorded (train.log_every), {len(common)} points per run",
        "largest_abs_gap_after_step_50": abs(after[worst]),
        "at_step": worst,
        "largest_abs_gap_steps_51_to_250": max(abs(g) for s, g in after.items() if s <= 250),
        "mean_gap_after_step_50": statistics.mean(after.values()),
        "final_loss": {m: runs[m][common[-1]]["loss"] for m in MODES},
        "eval_loss": evals,
        "best_eval_loss": {m: min(evals[m].values()) for m in MODES},
        "median_tokens_per_s_per_gpu": {m: fig[m]["median_tokens_per_s_per_gpu"] for m in MODES},
        "median_mfu": {m: fig[m]["median_mfu"] for m in MODES},
        "peak_mem_gib": {m: fig[m]["peak_mem_gib"] for m in MODES},
        "wall_s": {m: fig[m]["wall_s"] for m in MODES},
        "loss_curves": {"steps": common, **{m: [runs[m][s]["loss"] for s in common] for m in MODES}},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--command", default="bash bench/gpu/float8_evidence.sh")
    ap.add_argument("--note", default=None)
    a = ap.parse_args()
    f8 = json.loads((a.dir / "float8-evidence-float8-1xgpu.json").read_text())
    doc = {
        "command": a.command,
        "git_commit": f8["git_commit"],
        "date": f8["date"],
        "environment": f8["environment"],
        "figures": compare(a.dir),
    }
    doc["runs"] = {m: f"float8-evidence-{m}-1xgpu.json" for m in MODES}
    if a.note:
        doc["note"] = a.note
    a.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v for k, v in doc["figures"].items() if k not in ("loss_curves", "wall_s")}, indent=1))


if __name__ == "__main__":
    main()

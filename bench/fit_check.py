"""The memory planner (rayft.train.memory_plan, `rayft fit`) against every measured peak.

bench/fit_points.json lists each peak of torch.cuda.max_memory_allocated that a results file in
bench/results records for a rayft run (file, key, the settings that set memory); this script reads
each figure back from its file (checking the list), predicts it, and writes the comparison:

    python bench/fit_check.py [--out bench/results/<date>-fit-vs-measured-cpu.json]

The points were measured by earlier commits on one or two H200s and on one H200 emulating rank 0 of
8 L4s (bench/gpu/l4_fit_fakepg.py); no GPU is needed to run this.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figure_at(doc, key: str):
    """The value at a dotted key path with list indices (``figures.runs[0].peak_mem_gib``)."""
    for part in key.split("."):
        m = re.fullmatch(r"([^\[]+)((?:\[\d+\])*)", part)
        doc = doc[m.group(1)]
        for idx in re.findall(r"\[(\d+)\]", m.group(2)):
            doc = doc[int(idx)]
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results" / f"{datetime.date.today()}-fit-vs-measured-cpu.json"))
    args = ap.parse_args()

    from rayft.config import ModelConfig
    from rayft.train.memory_plan import TrainShape, model_dims, plan_memory
    from rayft.train.model import load_model_config

    points = json.loads((ROOT / "bench/fit_points.json").read_text())
    dims, rows = {}, []
    for p in points:
        if not p.get("figure_in_text") and p["file"].endswith(".json"):  # else a figure in a log's or a note's text
            got = figure_at(json.loads((ROOT / p["file"]).read_text()), p["key"])
            assert abs(got - p["measured_gib"]) < 0.01, (p["file"], p["key"], got)
            p["read_back"] = True
        if p["model"] not in dims:
            dims[p["model"]] = model_dims(load_model_config(ModelConfig(name_or_path=p["model"])))
        shape = TrainShape(
            gpus=p["gpus"],
            micro_batch_size=p["micro_batch_size"],
            seq_len=p["seq_len"],
            activation_checkpointing=p["activation_checkpointing"],
            compiled=p["compile"],
            liger=p["liger_kernels"],
            fused_loss=p["loss"] == "fused",
            fused_loss_chunk_mem=p["fused_loss_chunk_mem"],
            reshard_after_forward=p["reshard_after_forward"],
            float8=p["float8"],
            cpu_offload=p.get("cpu_offload", False),
            without_fsdp2=p.get("without_fsdp2", False),  # one GPU without FSDP2 (parallel.single_worker)
        )
        predicted = plan_memory(dims[p["model"]], shape).peak / 2**30
        rows.append({**p, "predicted_gib": round(predicted, 3), "error": round(predicted / p["measured_gib"] - 1, 4)})
    judged = [r for r in rows if not r["float8"] and not r.get("padding")]
    within = [r for r in judged if abs(r["error"]) <= 0.10]
    summary = {
        "points": len(rows),
        "judged (float8 excluded: not modelled, counted as bf16; padding mode excluded: counted as full rows)": len(judged),
        "within_10pct": len(within),
        "max_abs_error": max(abs(r["error"]) for r in judged),
        "median_abs_error": sorted(abs(r["error"]) for r in judged)[len(judged) // 2],
        "outside_10pct": [(r["file"], r["key"], r["measured_gib"], r["predicted_gib"]) for r in judged if abs(r["error"]) > 0.10],
        "float8_points": [(r["file"], r["key"], r["measured_gib"], r["predicted_gib"]) for r in rows if r["float8"]],
        "padding_points": [(r["file"], r["key"], r["measured_gib"], r["predicted_gib"]) for r in rows if r.get("padding")],
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    import torch
    import transformers

    doc = {
        "command": "python bench/fit_check.py",
        "git_commit": commit,
        "host": f"{platform.machine()} CPU (no GPU needed: the measured figures are read from the files named)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "figures": {"summary": summary, "rows": rows},
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

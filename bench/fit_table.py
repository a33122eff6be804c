"""`rayft fit`'s table: the largest Qwen2.5 model (and, under ``families``, the largest Qwen3 and
Llama 3 preset) that fully fine-tunes at seq 2048 (micro-batch 1, torch.compile, fused loss) on 8
GPUs of each kind, plain / with activation checkpointing / with
checkpointing and CPU offload (host memory: the instance's per GPU, 80% usable). Predicted, not
measured (bench/fit_check.py compares the planner with the measured peaks).

    python bench/fit_table.py [--out bench/results/<date>-fit-table-cpu.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"]
OTHER_FAMILIES = {
    "qwen3": ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"],
    "llama-3": ["llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b"],
}
MODES = {
    "plain": {},
    "checkpointing": {"activation_checkpointing": True},
    "checkpointing + offload": {"activation_checkpointing": True, "cpu_offload": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results" / f"{datetime.date.today()}-fit-table-cpu.json"))
    args = ap.parse_args()
    from rayft.cluster.instances import catalog
    from rayft.config import ModelConfig
    from rayft.train.memory_plan import GpuTarget, TrainShape, host_share, judge, model_dims, parse_gpus
    from rayft.train.model import load_model_config

    names = MODELS + [n for family in OTHER_FAMILIES.values() for n in family]
    dims = {n: model_dims(load_model_config(ModelConfig(name_or_path=n))) for n in names}
    g6 = catalog()["g6.12xlarge"]
    targets = {"2x g6.12xlarge (the sample: 8x L4)": GpuTarget(8, "L4", g6.gpu_memory_mib * 2**20, "g6.12xlarge", host_share(g6))}
    targets.update({f"8x {gpu}": parse_gpus(f"8x{gpu}") for gpu in ("L4", "A10G", "L40S", "H100", "H200")})

    def largest(models: list[str], target) -> dict:
        """Per mode: the largest of ``models`` (ascending) that fits ``target``, or None."""
        row = {}
        for mode, change in MODES.items():
            best = None
            for name in models:
                v = judge(dims[name], TrainShape(gpus=8, micro_batch_size=1, seq_len=2048, compiled=True, **change), target)
                if v.fits:
                    best = {"model": name, "largest_micro_batch": v.largest_micro_batch, "needed_gib_at_1": round(v.plan.needed() / 2**30, 1),
                            "host_gib_per_gpu": round(v.plan.host_per_gpu / 2**30, 1)}  # fmt: skip
            row[mode] = best
        return row

    rows = {}
    for label, target in targets.items():
        rows[label] = {
            "gpu_memory_gib": round(target.memory / 2**30, 1),
            "host_gib_per_gpu": round((target.host_memory_per_gpu or 0) / 2**30),
            **largest(MODELS, target),
            "families": {family: largest(models, target) for family, models in OTHER_FAMILIES.items()},
        }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {
        "command": "python bench/fit_table.py",
        "git_commit": commit,
        "host": "CPU (a prediction: rayft.train.memory_plan)",
        "figures": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print("| GPUs | GPU / host GiB per GPU | " + " | ".join(MODES) + " |\n|---|---|" + "---|" * len(MODES))
    for label, r in rows.items():
        cells = [f"{r[m]['model']} (≤ {r[m]['largest_micro_batch']})" if r[m] else "none" for m in MODES]
        print(f"| {label} | {r['gpu_memory_gib']} / {r['host_gib_per_gpu']} | " + " | ".join(cells) + " |")
    for family in OTHER_FAMILIES:
        print(f"\n{family}: | GPUs | " + " | ".join(MODES) + " |\n|---|" + "---|" * len(MODES))
        for label, r in rows.items():
            cells = [f"{b['model']} (≤ {b['largest_micro_batch']})" if (b := r["families"][family][m]) else "none" for m in MODES]
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""The export's read back, before and after rayft.train.safetensors_rows, alternating in one process
on the GPU host (device tool, .gpu carried):
  source .gpu/setup.sh; python3 bench/gpu/readback_ab.py --out $OUT/readback-ab-1xgpu.json
The qwen2.5-1.5b preset (random init, fp32 on the GPU as one worker trains it, 6.2 GB) is exported
once through ``write_sharded_hf_weights`` on a one-rank NCCL group into /tmp; then each arm reads it
back and compares it with the model, the files in the page cache as they are at a run's end:
"before" is the read back as it was until this change (each tensor through ``safe_open``'s mapping,
the model's tensor copied to pageable host memory, compared on the CPU), "after" is
``compare_export`` as it is now (plain reads into one pinned 64 MiB buffer, compared on the GPU).
Both must find the export exact (0.0).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from one_rank import one_rank_preset  # bench/gpu/one_rank.py, beside this script

from rayft.benchmarks.record import write_result
from rayft.train import hf_weights
from rayft.train.safetensors_rows import tensor_gap


def before(module: torch.nn.Module, out_dir: Path) -> float:
    """The read back until this change, for one rank."""
    import json

    from safetensors import safe_open

    sd = hf_weights.export_state_dict(module)
    index = out_dir / hf_weights.INDEX_FILE
    weight_map = json.loads(index.read_text())["weight_map"] if index.exists() else dict.fromkeys(sd, hf_weights.SINGLE_FILE)
    by_file: dict[str, list[str]] = {}
    for name in sd:
        by_file.setdefault(weight_map[name], []).append(name)
    worst = 0.0
    for file, names in by_file.items():
        with safe_open(str(out_dir / file), framework="pt") as f:
            for name in names:
                mine = sd[name].to_local() if hasattr(sd[name], "to_local") else sd[name]  # one rank: its shard is whole
                worst = max(worst, tensor_gap(f.get_slice(name)[:], mine.detach().cpu()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    a = ap.parse_args()
    dev, model = one_rank_preset(a.preset, port=29534)
    model.release_compute_copies()  # as the export does
    out = Path("/tmp/rb-export")
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    hf_weights.write_sharded_hf_weights(model.module, out)
    write_s = time.perf_counter() - t
    gb = sum(p.stat().st_size for p in out.glob("*.safetensors")) / 1e9
    rows = []
    for rep in range(a.reps):
        for arm in ("before", "after") if rep % 2 == 0 else ("after", "before"):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            gap = before(model.module, out) if arm == "before" else hf_weights.compare_export(model.module, out, dev)["max_abs_diff"]
            s = time.perf_counter() - t
            assert gap == 0.0, f"{arm}: the export is not exact ({gap})"
            row = {"rep": rep, "arm": arm, "read_back_s": round(s, 3), "gb_per_s": round(gb / s, 2), "max_abs_diff": gap}
            print(row, flush=True)
            rows.append(row)
    shutil.rmtree(out)
    mean = {arm: sum(r["read_back_s"] for r in rows if r["arm"] == arm) / a.reps for arm in ("before", "after")}
    figures = {"weights": model.weights_mode, "gb": round(gb, 3), "write_s": round(write_s, 2), "rows": rows,
               "mean_s": {k: round(v, 3) for k, v in mean.items()}, "before_over_after": round(mean["before"] / mean["after"], 2)}  # fmt: skip
    print(figures["mean_s"], figures["before_over_after"])
    print(write_result(a.out, "python3 bench/gpu/readback_ab.py --out $OUT/readback-ab-1xgpu.json", figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

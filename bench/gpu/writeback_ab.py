"""The end of a run's two disk writes with and without the early writeback (rayft.train.writeback),
alternating in one process on the GPU host (device tool, .gpu carried):
  source .gpu/setup.sh; python3 bench/gpu/writeback_ab.py --out $OUT/writeback-ab-1xgpu.json
(1) the HF export's weights of the qwen2.5-1.5b preset (random init, fp32 on the GPU, 6.2 GB) through
``write_sharded_hf_weights`` on a one-rank NCCL group, and (2) a DCP save of what an async
checkpoint of that run writes after staging (fp32 weights and Adam's two moments, 18.5 GB, host
tensors) through ``HashingFileSystemWriter`` with the run's 8 writer threads. The "off" arm makes
``start_writeback`` a no-op (the export's writer thread stays in both arms). Each write ends in its
fsync; the files go to /tmp (the runs' disk) and are deleted after each write.
"""

from __future__ import annotations

import argparse
import shutil
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from one_rank import one_rank_preset  # bench/gpu/one_rank.py, beside this script

from rayft.benchmarks.record import write_result
from rayft.train import hashing_writer, hf_weights, safetensors_stream, writeback

ON = writeback.start_writeback


def arm(on: bool) -> None:
    fn = ON if on else (lambda fd, offset, nbytes: False)
    writeback.start_writeback = fn
    safetensors_stream.start_writeback = fn  # the names each module bound at import


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    a = ap.parse_args()
    dev, model = one_rank_preset(a.preset, port=29533)
    sd = {
        k: v.full_tensor().detach().cpu() if hasattr(v, "full_tensor") else v.detach().cpu() for k, v in model.module.state_dict().items()
    }
    state = {
        "model": sd,
        "exp_avg": {k: torch.randn_like(v) for k, v in sd.items()},
        "exp_avg_sq": {k: torch.rand_like(v) for k, v in sd.items()},
    }
    gb = {
        "export": sum(v.numel() * v.element_size() for v in sd.values()) / 1e9,
        "checkpoint": 3 * sum(v.numel() * v.element_size() for v in sd.values()) / 1e9,
    }
    rows = []
    for rep in range(a.reps):
        for on in (False, True) if rep % 2 == 0 else (True, False):
            arm(on)
            d = "/tmp/wb-export"
            shutil.rmtree(d, ignore_errors=True)
            t = time.perf_counter()
            hf_weights.write_sharded_hf_weights(model.module, d)
            export_s = time.perf_counter() - t
            shutil.rmtree(d)
            c = "/tmp/wb-ckpt"
            shutil.rmtree(c, ignore_errors=True)
            t = time.perf_counter()
            dcp.save(state, storage_writer=hashing_writer.HashingFileSystemWriter(c, thread_count=8), no_dist=True)
            ckpt_s = time.perf_counter() - t
            shutil.rmtree(c)
            row = {"rep": rep, "writeback": on, "export_s": round(export_s, 2), "export_gb_per_s": round(gb["export"] / export_s, 2),
                   "checkpoint_s": round(ckpt_s, 2), "checkpoint_gb_per_s": round(gb["checkpoint"] / ckpt_s, 2)}  # fmt: skip
            print(row, flush=True)
            rows.append(row)
    mean = {on: {k: sum(r[k] for r in rows if r["writeback"] == on) / a.reps for k in ("export_s", "checkpoint_s")} for on in (False, True)}
    figures = {"gb": gb, "rows": rows, "mean_off": mean[False], "mean_on": mean[True],
               "ratio_off_over_on": {k: round(mean[False][k] / mean[True][k], 3) for k in ("export_s", "checkpoint_s")}}  # fmt: skip
    print(figures["ratio_off_over_on"])
    print(write_result(a.out, "python3 bench/gpu/writeback_ab.py --out $OUT/writeback-ab-1xgpu.json", figures))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

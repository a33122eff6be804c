"""What checkpoint digests cost on this CPU: BLAKE2b-128 alone, a DCP save through DCP's plain
writer and through rayft's hashing one, and verifying the files again (issue 19, docs/checkpoints.md).

    python bench/checkpoint_hash_cost.py --gb 1 --repeats 3 --out bench/results/DATE-checkpoint-hash-cost-2cpu.json

CPU seconds (``time.process_time``, every thread of the process) per GB of state, median of the
repeats; wall seconds too. One process, a one-rank gloo group, 2 DCP writer threads, a temporary
directory on the local disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rayft.benchmarks.record import write_result
from rayft.train.digests import compare, file_digest
from rayft.train.hashing_writer import HashingFileSystemWriter


def timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29631")
    dist.init_process_group("gloo", rank=0, world_size=1)
    n = int(a.gb * 2**30 / 4 / 8)
    state = {f"w{i}": torch.randn(n) for i in range(8)}  # 8 fp32 tensors, a.gb GiB in all
    gb = sum(t.numel() * 4 for t in state.values()) / 1e9
    rows: dict[str, list[tuple[float, float]]] = {"blake2b_alone": [], "save_plain": [], "save_hashing": [], "verify": []}
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        for r in range(a.repeats):
            plain, hashed = os.path.join(tmp, f"plain{r}"), os.path.join(tmp, f"hashed{r}")
            rows["save_plain"].append(timed(lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(plain, thread_count=2))))
            writer = HashingFileSystemWriter(hashed, thread_count=2)
            rows["save_hashing"].append(timed(lambda: dcp.save(state, storage_writer=writer)))
            expected = dict(writer.digests)  # what the save recorded while writing
            assert sorted(expected) == sorted(os.listdir(hashed)), (sorted(expected), os.listdir(hashed))
            rows["verify"].append(timed(lambda: compare(hashed, expected)))
            rows["blake2b_alone"].append(timed(lambda: [file_digest(os.path.join(plain, f)) for f in os.listdir(plain)]))
    dist.destroy_process_group()
    figures = {"state_gb": round(gb, 3), "repeats": a.repeats, "cpus": os.cpu_count()}
    for k, v in rows.items():
        figures[f"{k}_cpu_s_per_gb"] = round(statistics.median(c for c, _ in v) / gb, 3)
        figures[f"{k}_wall_s_per_gb"] = round(statistics.median(w for _, w in v) / gb, 3)
    figures["hashing_extra_cpu_s_per_gb"] = round(figures["save_hashing_cpu_s_per_gb"] - figures["save_plain_cpu_s_per_gb"], 3)
    out = write_result(a.out, "python " + " ".join(sys.argv), figures, load_average=os.getloadavg())
    print(out.read_text())


if __name__ == "__main__":
    main()

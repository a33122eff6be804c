"""Step-planning cost and packing efficiency: best fit decreasing (rayft.data.packing) against the
best fit in visiting order it replaced (issue 18, part 4).

    python bench/plan_time.py --sizes 1e6,2e6,4e6,1e7 --old-up-to 4e6 --out bench/results/DATE-plan-time-2cpu.json

The example lengths follow the real files' distribution: the sample files under ``--data``
(default ``../shared/data``: alpaca EN/ZH, C4) are tokenized as training does (Qwen2.5 tokenizer,
``--seq-len``), and N lengths are drawn from their lengths with replacement (``--seed``).

Timed (CPU seconds, ``time.process_time``, one repeat each): one epoch's plan, packed and shuffled,
cut into steps of ``--rows-per-step`` rows. ``new``: :func:`rayft.data.packing.plan_steps`;
``old``: the planner of commit a204a62 (below, verbatim but for taking lengths instead of a
dataset), quadratic, so only up to ``--old-up-to`` examples. Packing efficiency (non-padding /
row tokens) of both, at every size and on each file alone (mean of 3 epochs, at ``--seq-len``
and at 512).
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from rayft.benchmarks.record import write_result
from rayft.data.packing import epoch_rows, plan_steps

FILES = ("alpaca_en_demo.json", "alpaca_zh_demo.json", "c4_demo.jsonl")


def old_pack_rows(lengths: np.ndarray, order: np.ndarray, row_len: int) -> list[list[int]]:
    """Best fit in visiting order, free space in a sorted Python list (a204a62's ``pack_rows``)."""
    free: list[tuple[int, int]] = []  # (free tokens, row index), sorted
    rows: list[list[int]] = []
    for i in order.tolist():
        n = int(lengths[i])
        if n > row_len:
            raise ValueError(f"example {i} has {n} tokens, more than the row length {row_len}")
        k = bisect.bisect_left(free, (n, -1))
        if k < len(free):
            space, r = free.pop(k)
            rows[r].append(i)
            space -= n
        else:
            r, space = len(rows), row_len - n
            rows.append([i])
        if space > 0:
            bisect.insort(free, (space, r))
    return rows


def old_plan_one_epoch(lengths: np.ndarray, rows_per_step: int, row_len: int, seed: int) -> list[list[list[int]]]:
    """a204a62's ``plan_steps`` for one packed, shuffled epoch: the rows of every step."""
    rng = np.random.default_rng([seed, 0])
    rows = old_pack_rows(lengths, rng.permutation(len(lengths)), row_len)
    rows = [rows[i] for i in rng.permutation(len(rows))]
    return [rows[s * rows_per_step : (s + 1) * rows_per_step] for s in range(math.ceil(len(rows) / rows_per_step))]


def file_lengths(data: Path, seq_len: int) -> dict[str, np.ndarray]:
    from rayft.data.formats import load_conversations
    from rayft.data.tokenize import tokenize_dataset
    from rayft.data.tokenizer import load_tokenizer

    tok = load_tokenizer("qwen2.5")
    return {f: tokenize_dataset(tok, list(load_conversations([str(data / f)])), seq_len).lengths() for f in FILES}


def efficiency(lengths: np.ndarray, n_rows: int, row_len: int) -> float:
    return float(lengths.sum()) / (n_rows * row_len)


def cpu_model() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,2e6,4e6,1e7")
    ap.add_argument("--old-up-to", type=float, default=4e6)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rows-per-step", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    data = Path(a.data)
    if not all((data / f).exists() for f in FILES):
        sys.exit(f"needs {', '.join(FILES)} under {data}")
    figures: dict = {"seq_len": a.seq_len, "rows_per_step": a.rows_per_step, "cpus": os.cpu_count(), "cpu_model": cpu_model()}

    per_file: dict[str, dict] = {}
    by_len = {L: file_lengths(data, L) for L in (a.seq_len, 512)}
    for L, lengths_of in by_len.items():
        for f, lengths in lengths_of.items():
            new, old = [], []
            for epoch in range(3):
                new.append(efficiency(lengths, len(epoch_rows(lengths, epoch, a.seed, L, True, True)), L))
                order = np.random.default_rng([a.seed, epoch]).permutation(len(lengths))
                old.append(efficiency(lengths, len(old_pack_rows(lengths, order, L)), L))
            per_file[f"{f}@{L}"] = {
                "examples": len(lengths),
                "new_efficiency": round(float(np.mean(new)), 5),
                "old_efficiency": round(float(np.mean(old)), 5),
            }
            print(f"{f} at {L}: {len(lengths)} examples, efficiency new {np.mean(new):.4f} old {np.mean(old):.4f}", flush=True)
    figures["per_file"] = per_file

    pool = np.concatenate(list(by_len[a.seq_len].values()))
    figures["length_pool"] = {
        "examples": len(pool),
        "mean": round(float(pool.mean()), 1),
        "median": float(np.median(pool)),
        "max": int(pool.max()),
    }
    rng = np.random.default_rng(a.seed)
    sizes = []
    for n in (int(float(s)) for s in a.sizes.split(",")):
        lengths = rng.choice(pool, n)
        row: dict = {"examples": n}
        c0 = time.process_time()
        plan = plan_steps(
            lengths, rows_per_step=a.rows_per_step, row_len=a.seq_len, packing=True, shuffle=True, seed=a.seed, epochs=1, max_steps=None
        )
        row["new_cpu_s"] = round(time.process_time() - c0, 3)
        row["new_efficiency"] = round(plan.packing_efficiency(lengths, a.seq_len), 5)
        row["new_steps"] = len(plan)
        row["new_plan_mb"] = round(
            sum(x.nbytes for x in (plan.rows.offsets, plan.rows.examples, plan.step_offsets, plan.epoch_of_step)) / 1e6, 1
        )
        if n <= a.old_up_to:
            c0 = time.process_time()
            steps = old_plan_one_epoch(lengths, a.rows_per_step, a.seq_len, a.seed)
            row["old_cpu_s"] = round(time.process_time() - c0, 3)
            row["old_efficiency"] = round(efficiency(lengths, sum(map(len, steps)), a.seq_len), 5)
            row["old_steps"] = len(steps)
            del steps
        sizes.append(row)
        print(row, flush=True)
    figures["sizes"] = sizes
    out = write_result(a.out, "python " + " ".join(sys.argv), figures, load_average=os.getloadavg())
    print(out.read_text())


if __name__ == "__main__":
    main()

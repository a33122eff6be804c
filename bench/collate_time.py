"""The host's time to build one micro-batch (issue 23; bench/NOTES.md §32): ``collate`` as it is
against the function at ``--old-ref`` (read with ``git show``), on the rows rayft packs from the real
alpaca EN+ZH samples (../shared/data, Qwen2.5's tokenizer, seq 2048), alternating, equal outputs
checked:
  python bench/collate_time.py --out bench/results/DATE-collate-time-2cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from rayft.benchmarks.record import write_result
from rayft.data.packing import collate, plan_steps
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_dataset
from rayft.data.tokenizer import load_tokenizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def old_collate(ref: str):
    """``collate`` of ``src/rayft/data/packing.py`` at git ``ref``."""
    text = subprocess.run(["git", "show", f"{ref}:src/rayft/data/packing.py"], capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "packing_old.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("packing_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["packing_old"] = module
    spec.loader.exec_module(module)
    return module.collate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--old-ref", default="f10c181")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=16, help="rows per micro-batch")
    ap.add_argument("--batches", type=int, default=20, help="micro-batches timed, each once per function and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    records = []
    for name in ("alpaca_en_demo.json", "alpaca_zh_demo.json"):
        records += json.loads((DATA / name).read_text())
    tok = load_tokenizer("qwen2.5")
    ds = tokenize_dataset(tok, [to_conversation(r, f"r{i}", "alpaca") for i, r in enumerate(records)], seq_len=a.seq_len)
    plan = plan_steps(ds, rows_per_step=a.rows, row_len=a.seq_len, packing=True, shuffle=True, seed=0, epochs=1, max_steps=a.batches)
    batches = [plan.step_rows(s) for s in range(len(plan))]
    old = old_collate(a.old_ref)
    for rows in batches:  # equal outputs, key for key, dtype for dtype
        x, y = old(ds, rows, a.seq_len, tok.pad_token_id), collate(ds, rows, a.seq_len, tok.pad_token_id)
        assert x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(a.rounds):
        for name, fn in (("old", old), ("new", collate)):
            for rows in batches:
                t = time.perf_counter()
                fn(ds, rows, a.seq_len, tok.pad_token_id)
                times[name].append(time.perf_counter() - t)
    docs = statistics.mean(sum(len(r) for r in rows) for rows in batches)
    figures = {
        "micro_batches": len(batches),
        "rows_per_micro_batch": a.rows,
        "seq_len": a.seq_len,
        "documents_per_micro_batch_mean": docs,
        "old_ref": a.old_ref,
        "equal_outputs": True,
        "old_ms_median": 1e3 * statistics.median(times["old"]),
        "new_ms_median": 1e3 * statistics.median(times["new"]),
        "speedup": statistics.median(times["old"]) / statistics.median(times["new"]),
    }
    out = write_result(a.out, " ".join(["python", *sys.argv]), figures)
    print(json.dumps(figures, indent=1), "\n", out)


if __name__ == "__main__":
    main()

"""Time data preprocessing: read + tokenize N records locally, with Ray Data on every CPU, and from
the tokenized-data cache.

    PYTHONPATH=src python3 bench/preprocess.py [--n 100000] [--data FILE ...] [--cpus N] [--out FILE]

The records are synthetic but made of real text: the instructions, inputs and outputs of the
sample alpaca files (English and Chinese; ``--data``, default ``../shared/data/alpaca_*_demo.json``,
else ``.gpu/data/alpaca_*_demo.json``) recombined with a fixed seed into alpaca records (one
output, or two or three joined for longer ones; some with a ``history`` of earlier turns) and
multi-turn ``messages`` records, written to a temporary JSONL file. Nothing is downloaded.

Paths timed, each from the JSONL file to a TokenizedDataset (the Qwen2.5 tokenizer, ``--seq-len``):

* ``local``: ``load_conversations`` + ``tokenize_dataset`` in this process;
* ``ray``: ``load_conversations`` + ``tokenize_dataset_ray`` over an embedded local Ray of
  ``--cpus`` CPUs (Ray's start-up is timed separately, as ``ray_init_s``; the actor pool's start is
  inside the timed path); its result must equal the local one (``identical``);
* ``cache_hit``: ``rayft.train.driver.load_run_data`` finding the entry written from the local result
  (hash the input file, load and verify the arrays).

Writes one results JSON (:func:`rayft.benchmarks.record.write_result`): command, commit, CPU model and
count, versions, records/s for each path and the Ray speedup over local.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def default_data() -> list[str]:
    for pattern in ("../shared/data/alpaca_*_demo.json", ".gpu/data/alpaca_*_demo.json"):
        found = sorted(glob.glob(pattern))
        if found:
            return found
    return []


def synthesize(pool: list[dict], n: int, seed: int) -> list[dict]:
    """``n`` records recombined from ``pool`` (alpaca records): 60 % alpaca (1–3 outputs joined),
    15 % alpaca with a 1–2 turn history, 25 % messages with 2–4 user/assistant turns (a third with
    a system turn). Deterministic for a given pool and seed."""
    rng = random.Random(seed)
    pick = lambda: pool[rng.randrange(len(pool))]  # noqa: E731
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.75:
            a = pick()
            k = rng.choice((1, 1, 1, 2, 3))
            rec = {"instruction": a["instruction"], "input": a.get("input", ""), "output": "\n\n".join(pick()["output"] for _ in range(k))}
            if u >= 0.60:
                rec["history"] = [[pick()["instruction"], pick()["output"]] for _ in range(rng.randint(1, 2))]
        else:
            msgs = [{"role": "system", "content": "You are a careful assistant."}] if rng.random() < 1 / 3 else []
            for _ in range(rng.randint(2, 4)):
                msgs += [{"role": "user", "content": pick()["instruction"]}, {"role": "assistant", "content": pick()["output"]}]
            rec = {"messages": msgs}
        out.append(rec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="records to generate")
    ap.add_argument("--data", nargs="+", default=None, help="alpaca JSON files to draw text from")
    ap.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of the embedded Ray (default: all)")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="results JSON (default bench/results/<date>-preprocess-<ncpu>cpu.json)")
    ap.add_argument("--label", default=None, help="free text stored with the results (e.g. 'dev box, shared CPUs')")
    a = ap.parse_args()
    files = a.data or default_data()
    if not files:
        sys.exit("no source data: pass --data FILE ... (alpaca JSON arrays)")

    import numpy as np
    import ray
    from rich.console import Console

    from rayft.benchmarks.record import write_result
    from rayft.config import DataConfig, RayftConfig
    from rayft.data import cache as cache_lib
    from rayft.data.formats import load_conversations
    from rayft.data.parallel import tokenize_dataset_ray
    from rayft.data.tokenize import fingerprint, tokenize_dataset
    from rayft.data.tokenizer import load_tokenizer
    from rayft.train.driver import load_run_data

    pool = [r for f in files for r in json.loads(Path(f).read_text(encoding="utf-8"))]
    records = synthesize(pool, a.n, a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="rayft-bench-prep-"))
    src = tmp / "synthetic.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    n_msgs = sum("messages" in r for r in records)
    print(
        f"{a.n:,} records ({n_msgs:,} messages, {a.n - n_msgs:,} alpaca) from {len(pool):,} source records, {src.stat().st_size / 2**20:.1f} MiB",
        flush=True,
    )
    tok = load_tokenizer("qwen2.5")

    t0 = time.perf_counter()
    ex = list(load_conversations([str(src)]))
    t_load = time.perf_counter() - t0
    local = tokenize_dataset(tok, ex, a.seq_len)
    t_local = time.perf_counter() - t0
    print(
        f"local: {t_local:.1f} s (read {t_load:.1f} s), {a.n / t_local:,.0f} records/s; {len(local):,} examples, {len(local.tokens):,} tokens",
        flush=True,
    )

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=a.cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    ex = list(load_conversations([str(src)]))
    via_ray = tokenize_dataset_ray(tok, ex, a.seq_len)
    t_ray = time.perf_counter() - t0
    ray.shutdown()
    identical = fingerprint(via_ray) == fingerprint(local) and (via_ray.truncated, via_ray.dropped_no_trainable) == (
        local.truncated,
        local.dropped_no_trainable,
    )
    print(
        f"ray ({a.cpus} CPUs): {t_ray:.1f} s (+ ray.init {t_init:.1f} s), {a.n / t_ray:,.0f} records/s; identical to local: {identical}",
        flush=True,
    )

    cfg = RayftConfig(data=DataConfig(train_files=[str(src)], seq_len=a.seq_len, preprocess="local", cache_dir=str(tmp / "cache")))
    key, hashed = cache_lib.cache_key(cfg.data, tok, "qwen2.5")
    t0 = time.perf_counter()
    cache_lib.save(cfg.data.cache_dir, key, cache_lib.CachedData({"train": local}), hashed)
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    hit = load_run_data(cfg, Console(quiet=True))
    t_hit = time.perf_counter() - t0
    assert hit.cache == "hit" and np.array_equal(hit.train.tokens, local.tokens)
    print(
        f"cache hit: {t_hit:.2f} s (tokenizer load + file hash + verified load), {a.n / t_hit:,.0f} records/s; write {t_write:.2f} s",
        flush=True,
    )

    ncpu = os.cpu_count()
    out = a.out or f"bench/results/{dt.date.today():%Y-%m-%d}-preprocess-{ncpu}cpu.json"
    figures = {
        "records": a.n,
        "examples": len(local),
        "tokens": int(len(local.tokens)),
        "seq_len": a.seq_len,
        "input_mib": round(src.stat().st_size / 2**20, 2),
        "ray_cpus": a.cpus,
        "local_s": round(t_local, 3),
        "local_read_s": round(t_load, 3),
        "local_records_per_s": round(a.n / t_local, 1),
        "ray_s": round(t_ray, 3),
        "ray_init_s": round(t_init, 3),
        "ray_records_per_s": round(a.n / t_ray, 1),
        "ray_speedup": round(t_local / t_ray, 3),
        "ray_identical_to_local": identical,
        "cache_hit_s": round(t_hit, 3),
        "cache_hit_records_per_s": round(a.n / t_hit, 1),
        "cache_write_s": round(t_write, 3),
    }
    cmd = "python3 bench/preprocess.py " + " ".join(sys.argv[1:])
    path = write_result(
        out, cmd, figures, cpu={"model": cpu_model(), "count": ncpu}, source_files=[os.path.basename(f) for f in files], label=a.label
    )
    print(json.dumps(figures, indent=1))
    print(f"wrote {path}")
    if not identical:
        sys.exit("the Ray Data path gave other tokens than the local path")


if __name__ == "__main__":
    main()

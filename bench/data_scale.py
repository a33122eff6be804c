"""Data at any size (issue 18): the driver's memory and time for `rayft data prepare` as the data grow,
a worker's memory when it opens its view of the token store, and the start of training on a small
and a large prepared store.

    python bench/data_scale.py --records 10000 100000 --cpus 2 --out bench/results [--kind instruct|web]
        [--tokenizer qwen|whitespace] [--mode local|ray] [--train] [--label TEXT]

Records are synthetic but follow the real files' lengths: ``instruct`` records recombine the
instructions, inputs and outputs of ``../shared/data/alpaca_*_demo.json`` (60 % alpaca, 15 % alpaca
with a history, 25 % multi-turn messages, as the earlier bench/preprocess.py made them); ``web`` documents
join 1–4 random documents of ``c4_demo.jsonl`` (1–4k tokens each). They are streamed to a JSON Lines
file (never held in memory here).

For each size, in a fresh child process (so its peak RSS is its own: ``resource.getrusage(RUSAGE_SELF)``):

* ``prepare``: ``rayft data prepare``'s work (:func:`rayft.data.prepare.prepare_data` with a store
  under a temporary ``data.cache_dir``): wall and CPU seconds of the driver process, peak RSS;
  with ``--mode ray`` the Ray Data actors' CPU is not the driver's (their wall time is);
* ``hit``: opening the prepared store again (what ``rayft train`` does first): wall, peak RSS;
* ``view``: a worker's RSS before and after unpickling its view (as ``ray.get`` hands it) and
  reading every example of rank 0's share of 8 ranks (first pass maps the shards).

``--tokenizer whitespace`` replaces the Qwen2.5 tokenizer (about 2 ms of CPU per instruction record
on this 2-core machine) by a regex word tokenizer that renders the same ChatML text: for the
memory series at sizes the real tokenizer cannot reach in minutes here; its records/s are not
tokenizer figures. ``--train`` also runs ``rayft train`` (qwen2-tiny, CPU, 1 step, the store
prepared) on the smallest and the largest size and records the wall time to the first step.

Writes ``<out>/<date>-data-scale-<kind>-<tokenizer>-<ncpu>cpu.json`` with :func:`rayft.benchmarks.record.write_result`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


def source(pattern: str) -> list[str]:
    for base in ("../shared/data", str(HERE.parents[2] / "shared" / "data"), ".gpu/data"):
        found = sorted(glob.glob(os.path.join(base, pattern)))
        if found:
            return found
    sys.exit(f"no source data for {pattern}: needs ../shared/data (the project's shared folder)")


def write_inputs(stem: Path, n: int, kind: str, files: int) -> tuple[str, int]:
    """``n`` records as one JSON Lines file ``stem.jsonl`` or, with ``files`` > 1, as ``files`` files
    under ``stem/`` written by as many processes; returns (the path to give ``data.train_files``,
    total bytes)."""
    if files <= 1:
        return str(stem) + ".jsonl", write_records(Path(str(stem) + ".jsonl"), n, kind)
    from concurrent.futures import ProcessPoolExecutor

    stem.mkdir()
    jobs = [(stem / f"part-{i:04d}.jsonl", n // files + (i < n % files), kind, i) for i in range(files)]
    with ProcessPoolExecutor(min(files, os.cpu_count() or 1)) as pool:
        sizes = list(pool.map(write_records, *zip(*jobs)))
    return str(stem), sum(sizes)


def write_records(path: Path, n: int, kind: str, seed: int = 0) -> int:
    """Stream ``n`` synthetic records to ``path`` (JSON Lines); returns its size in bytes."""
    rng = random.Random(seed)
    if kind == "instruct":
        pool = [r for f in source("alpaca_*_demo.json") for r in json.loads(Path(f).read_text(encoding="utf-8"))]
    else:
        pool = [json.loads(line)["text"] for f in source("c4_demo.jsonl") for line in Path(f).read_text(encoding="utf-8").splitlines()]
    pick = lambda: pool[rng.randrange(len(pool))]  # noqa: E731
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(n):
            if kind == "web":
                rec = {"text": "\n\n".join(pick() for _ in range(rng.randint(1, 4)))}
            else:
                u = rng.random()
                if u < 0.75:
                    a = pick()
                    k = rng.choice((1, 1, 1, 2, 3))
                    rec = {
                        "instruction": a["instruction"],
                        "input": a.get("input", ""),
                        "output": "\n\n".join(pick()["output"] for _ in range(k)),
                    }
                    if u >= 0.60:
                        rec["history"] = [[pick()["instruction"], pick()["output"]] for _ in range(rng.randint(1, 2))]
                else:
                    msgs = [{"role": "system", "content": "You are a careful assistant."}] if rng.random() < 1 / 3 else []
                    for _ in range(rng.randint(2, 4)):
                        msgs += [{"role": "user", "content": pick()["instruction"]}, {"role": "assistant", "content": pick()["output"]}]
                    rec = {"messages": msgs}
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path.stat().st_size


class WhitespaceTokenizer:
    """A fast stand-in for the memory series: ChatML rendering (Qwen2.5's layout, no default
    system turn), tokens = runs of word or non-space characters and of spaces, ids by hash."""

    eos_token_id = 151643
    pad_token_id = 151643
    chat_template = "chatml-whitespace"
    _TOK = re.compile(r"\w+|[^\w\s]|\s+")

    def apply_chat_template(self, messages, tools=None, tokenize=False):
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)

    def get_vocab(self):
        return {"<|im_end|>": 151645}

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        spans = [m.span() for m in self._TOK.finditer(text)]
        out = {"input_ids": [hash(text[a:b]) % 150000 for a, b in spans]}
        if return_offsets_mapping:
            out["offset_mapping"] = spans
        return out


class Chars4Tokenizer(WhitespaceTokenizer):
    """A faster stand-in for the 10M-record memory point: the same ChatML rendering, one token per 4
    characters (about BPE's rate on English), ids from the characters, all in numpy (the whitespace
    stand-in's Python loop cost more CPU per record than the rest of the ingest)."""

    chat_template = "chatml-chars4"
    _MIX = np.array([1, 131, 17161, 2248091], dtype=np.int64)

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        codes = np.concatenate([codes, np.zeros(-len(codes) % 4, dtype=np.int64)]).reshape(-1, 4)
        ids = (codes @ self._MIX) % 150000
        if not return_offsets_mapping:
            return {"input_ids": ids.tolist()}
        starts = np.arange(0, len(text), 4)
        return {"input_ids": ids, "offset_mapping": np.stack([starts, np.minimum(starts + 4, len(text))], axis=1)}


def child(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    import resource

    import psutil
    from rich.console import Console

    from rayft.config import RayftConfig

    cfg = RayftConfig.model_validate(
        {
            "model": {"name_or_path": "qwen2-tiny"},  # its tokenizer is Qwen2.5's: the store `rayft train` on it finds
            "data": {"train_files": [args.file], "seq_len": 2048, "preprocess": args.mode, "cache_dir": args.cache},
            "ray": {"num_cpus": args.cpus},
        }
    )
    name = "whitespace"
    if args.child == "view":
        tok = None  # a worker holds no tokenizer
    elif args.tokenizer == "whitespace":
        tok = WhitespaceTokenizer()
    elif args.tokenizer == "chars4":
        name, tok = "chars4", Chars4Tokenizer()
    else:
        from rayft.data.tokenizer import load_tokenizer
        from rayft.train.model import default_tokenizer

        name = default_tokenizer(cfg.model)
        tok = load_tokenizer(name)
    rss0 = psutil.Process().memory_info().rss
    out: dict = {"rss_before_mib": rss0 / 2**20}
    if args.child in ("prepare", "hit"):
        from rayft.data.prepare import prepare_data
        from rayft.train.ray_cluster import connect_ray

        c0, w0 = time.process_time(), time.perf_counter()
        d = prepare_data(cfg, Console(quiet=True), tok, name, connect=lambda: connect_ray(cfg))
        out.update(wall_s=time.perf_counter() - w0, cpu_s=time.process_time() - c0, examples=len(d.train), cache=d.cache)
        out["tokens"] = int(d.train.lengths().sum())
        if args.child == "prepare":
            import pickle

            Path(args.view).write_bytes(pickle.dumps(d.train))
    else:  # view: a worker's side (numpy and the view's module imported before the baseline)
        import pickle

        import numpy as np

        import rayft.data.token_view  # noqa: F401

        rss0 = psutil.Process().memory_info().rss
        out["rss_before_mib"] = rss0 / 2**20

        blob = Path(args.view).read_bytes()
        w0 = time.perf_counter()
        view = pickle.loads(blob)
        rss1 = psutil.Process().memory_info().rss
        mine = np.arange(len(view))[0::8]
        n_tok = sum(len(view.example(int(i))[0]) for i in mine)
        out.update(
            unpickle_s=time.perf_counter() - w0,
            view_bytes=len(blob),
            rss_after_view_mib=rss1 / 2**20,
            rss_after_reading_share_mib=psutil.Process().memory_info().rss / 2**20,
            share_examples=len(mine),
            share_tokens=int(n_tok),
            shards_mapped=len(view.shards_touched()),
        )
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(out), flush=True)


def run_child(kind: str, **kw) -> dict:
    cmd = [sys.executable, str(HERE), "--child", kind] + [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def train_to_first_step(cfg_dir: Path, data_file: str, cache: str) -> dict:
    """`rayft train` (qwen2-tiny, CPU, 1 step) on a prepared store: its wall timeline (seconds)."""
    cfg = cfg_dir / "job.yaml"
    cfg.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        f"data: {{train_files: [{data_file}], seq_len: 2048, cache_dir: {cache}}}\n"
        "train: {num_workers: 1, use_gpu: false, micro_batch_size: 1, max_steps: 1}\n"
        f"checkpoint: {{storage_path: {cfg_dir / 'runs'}, save_final: false, export_hf: false}}\n"
    )
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "rayft.cli", "train", str(cfg)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"rayft train failed:\n{p.stderr[-3000:]}")
    (run,) = (cfg_dir / "runs").iterdir()
    summary = json.loads((run / "rayft_summary.json").read_text())
    w = summary.get("wall_s") or {}
    before_first = sum(w.get(k, 0) for k in ("data", "ray", "checks", "workers_start", "data_wait", "worker_setup"))
    return {"process_wall_s": wall, "to_first_step_s": before_first, "wall": w, "used_store": "used the tokenized store" in p.stderr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, nargs="+", default=[10_000])
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--kind", choices=("instruct", "web"), default="instruct")
    ap.add_argument("--tokenizer", choices=("qwen", "whitespace", "chars4"), default="qwen")
    ap.add_argument("--files", type=int, default=1, help="write each size's records as this many files (in parallel)")
    ap.add_argument("--mode", choices=("local", "ray", "auto"), default="local")
    ap.add_argument("--train", action="store_true", help="also time rayft train to its first step on the smallest and largest store")
    ap.add_argument("--label", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--file", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--view", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)
    if a.train and a.tokenizer != "qwen":
        sys.exit("--train needs --tokenizer qwen (rayft train tokenizes with the model's tokenizer)")
    from rayft.benchmarks.record import write_result

    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="rayft-bench-scale-"))
    for n in sorted(a.records):
        f, size = write_inputs(tmp / f"{a.kind}-{n}", n, a.kind, a.files)
        cache = tmp / f"cache-{n}"
        view = tmp / f"view-{n}.pkl"
        common = dict(file=f, cache=cache, cpus=a.cpus, tokenizer=a.tokenizer, mode=a.mode)
        prep = run_child("prepare", view=view, **common)
        hit = run_child("hit", view=view, **common)
        worker = run_child("view", view=view, **common)
        row = {
            "records": n,
            "input_mib": round(size / 2**20, 2),
            "examples": prep["examples"],
            "tokens": prep["tokens"],
            "prepare_wall_s": round(prep["wall_s"], 2),
            "prepare_driver_cpu_s": round(prep["cpu_s"], 2),
            "prepare_records_per_s": round(n / prep["wall_s"], 1),
            "prepare_driver_peak_rss_mib": round(prep["peak_rss_mib"], 1),
            "driver_rss_before_prepare_mib": round(prep["rss_before_mib"], 1),
            "hit_wall_s": round(hit["wall_s"], 3),
            "hit_driver_peak_rss_mib": round(hit["peak_rss_mib"], 1),
            "view_pickle_bytes": worker["view_bytes"],
            "worker_rss_before_view_mib": round(worker["rss_before_mib"], 1),
            "worker_rss_after_view_mib": round(worker["rss_after_view_mib"], 1),
            "worker_rss_after_reading_its_share_mib": round(worker["rss_after_reading_share_mib"], 1),
            "worker_share_examples": worker["share_examples"],
            "worker_shards_mapped": worker["shards_mapped"],
            "store_mib": round(sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) / 2**20, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        rows[-1]["_file"], rows[-1]["_cache"] = str(f), str(cache)
    train = {}
    if a.train:
        for row in (rows[0], rows[-1]):
            d = tmp / f"train-{row['records']}"
            d.mkdir()
            train[str(row["records"])] = train_to_first_step(d, row["_file"], row["_cache"])
            print(json.dumps({row["records"]: train[str(row["records"])]}), flush=True)
    for row in rows:
        row.pop("_file"), row.pop("_cache")
    ncpu = os.cpu_count()
    out = Path(a.out) / f"{dt.date.today():%Y-%m-%d}-data-scale-{a.kind}-{a.tokenizer}-{ncpu}cpu.json"
    figures = {"kind": a.kind, "tokenizer": a.tokenizer, "mode": a.mode, "ray_cpus": a.cpus, "sizes": rows}
    if train:
        figures["train_to_first_step"] = train
    cmd = "python bench/data_scale.py " + " ".join(sys.argv[1:])
    note = (
        None
        if a.tokenizer == "qwen"
        else f"{a.tokenizer} tokenizer: a stand-in for the memory series; its rates are not Qwen tokenizer rates"
    )
    print(f"wrote {write_result(out, cmd, figures, cpu={'count': ncpu}, label=a.label, note=note)}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)  # the generated inputs and stores (GBs at 1M records)


if __name__ == "__main__":
    main()

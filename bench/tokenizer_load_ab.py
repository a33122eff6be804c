"""The offline tokenizers' load, ``rayft.data.tokenizer.load_tokenizer``: this tree, whose cache records the
added tokens in ``tokenizer_config.json``, against ``--base``'s ``src`` with the cache as transformers 5
saves it (no ``added_tokens_decoder``) (issue 23; bench/NOTES.md §42):
  python bench/tokenizer_load_ab.py --base COMMIT --reps 8 --out bench/results/DATE-tokenizer-load-2cpu.json
Each sample is a fresh process timing ``load_tokenizer(name)`` alone (transformers imported before the
clock starts), as the driver's data phase and rank 0's export load it. Each arm has its own
``RAYFT_CACHE``, copied from this tree's built cache (the old arm's with the field taken out); arms
alternate, after one unrecorded load of each (bytecode, page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rayft.benchmarks.record import commit_src, write_result
from rayft.data.tokenizer import OFFLINE_TOKENIZERS, load_tokenizer, offline_cache_dir

ROOT = Path(__file__).resolve().parents[1]
LOAD = (
    "import sys, time, transformers; from rayft.data.tokenizer import load_tokenizer; "
    "t = time.perf_counter(); load_tokenizer(sys.argv[1]); print(time.perf_counter() - t)"
)


def sample(src: Path, cache: Path, name: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(src), "RAYFT_CACHE": str(cache)}
    return float(subprocess.run([sys.executable, "-c", LOAD, name], capture_output=True, text=True, check=True, env=env).stdout.split()[-1])


def caches(names: list[str], tmp: Path) -> dict[str, Path]:
    """The two arms' RAYFT_CACHE: ``new`` as this tree writes it, ``old`` without ``added_tokens_decoder``."""
    out = {}
    for arm in ("old", "new"):
        for name in names:
            dst = tmp / f"cache-{arm}" / "tokenizers" / name
            shutil.copytree(offline_cache_dir(name), dst)
            conf = json.loads((dst / "tokenizer_config.json").read_text())
            if arm == "old":
                conf.pop("added_tokens_decoder", None)
            elif "added_tokens_decoder" not in conf:
                raise SystemExit(f"{dst}: this tree's cache has no added_tokens_decoder")
            (dst / "tokenizer_config.json").write_text(json.dumps(conf, indent=2, ensure_ascii=False))
        out[arm] = tmp / f"cache-{arm}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the commit of the old arm")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--names", default=",".join(sorted(OFFLINE_TOKENIZERS)))
    a = ap.parse_args()
    names = a.names.split(",")
    for name in names:
        load_tokenizer(name)  # built into the user's cache once, and completed by this tree
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {"old": commit_src(ROOT, a.base, Path(tmp)), "new": ROOT / "src"}
        cache = caches(names, Path(tmp))
        rows = []
        for name in names:
            for arm in ("old", "new"):
                sample(srcs[arm], cache[arm], name)
            for rep in range(a.reps):
                for arm in ("new", "old") if rep % 2 == 0 else ("old", "new"):
                    rows.append({"name": name, "rep": rep, "arm": arm, "load_s": round(sample(srcs[arm], cache[arm], name), 4)})
        for arm in ("old", "new"):  # the old tree read its cache as it was: nothing was added to it
            for name in names:
                conf = json.loads((cache[arm] / "tokenizers" / name / "tokenizer_config.json").read_text())
                assert ("added_tokens_decoder" in conf) == (arm == "new"), (arm, name)
    median = {
        name: {
            arm: round(statistics.median(r["load_s"] for r in rows if r["name"] == name and r["arm"] == arm), 4) for arm in ("old", "new")
        }
        for name in names
    }
    for name, m in median.items():
        m["old_over_new"] = round(m["old"] / m["new"], 2)
    print(json.dumps(median, indent=1))
    command = f"python bench/tokenizer_load_ab.py --base {a.base} --reps {a.reps} --out OUT.json"
    print(write_result(a.out, command, {"base": a.base, "rows": rows, "median_s": median}))


if __name__ == "__main__":
    main()

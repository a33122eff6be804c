"""Peak host memory (RSS) per rank of loading a Hugging Face checkpoint into FSDP2 shards and
writing the export, on N CPU ranks (gloo), sharded (rayft.train.hf_weights) vs gathered on rank 0
(the path before: rank 0 loads the whole model and broadcasts it; the export gathers it on rank 0).

    python bench/sharded_weights_rss.py [--preset qwen2.5-1.5b] [--ranks 4] [--work DIR] [--out FILE]

Writes a seeded random init of the preset as bf16 safetensors (once, under --work), then for each
mode starts N rank processes that each load it (fp32 shards), export it (fp32) and report their
peak RSS (``VmHWM``: file pages of the memory-mapped safetensors they touched count too).
Target (issue 25): peak ≤ 1.3 × (fp32 model bytes ÷ N) + 2 GB per rank.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
rank, world, store, src, out, mode, report = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
rank = int(rank)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM
from rayft.train.hf_weights import compare_export, load_sharded_weights, write_sharded_hf_weights
from rayft.train.checkpoint import full_model_state_dict
from rayft.train.model import decoder_layers

def rss():  # peak resident set of this process so far, bytes: VmHWM (per address space, so not the
    # forking parent's; ru_maxrss keeps the parent's high-water mark across exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

marks = {"after_imports": rss()}
conf = AutoConfig.from_pretrained(src)
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
mesh = init_device_mesh("cpu", (world,))
mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
for layer in decoder_layers(model):
    fully_shard(layer, mesh=mesh, mp_policy=mp)
fully_shard(model, mesh=mesh, mp_policy=mp)
model.to_empty(device="cpu")
t = time.perf_counter()
if mode.startswith("sharded"):
    load_sharded_weights(model, src)
else:
    full = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict() if rank == 0 else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del full
dist.barrier()
load_s = time.perf_counter() - t
marks["after_load"] = rss()
t = time.perf_counter()
write_s = None
if mode == "sharded":
    write_sharded_hf_weights(model, out)
    write_s = time.perf_counter() - t
    check = compare_export(model, out, torch.device("cpu"))
elif mode == "sharded-dcp":  # the sharded export before 2026-12-02: torch's HF writer, then its consolidation
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._consolidate_hf_safetensors import consolidate_safetensors_files_on_every_rank
    import torch.distributed.checkpoint as dcp
    from rayft.train.hf_weights import export_file_count, export_state_dict, file_index, write_index
    sd = export_state_dict(model)
    sizes = [(k, v.numel() * v.element_size()) for k, v in sd.items()]
    index = file_index(sizes, min(len(sizes), export_file_count(sum(b for _, b in sizes))))
    if rank == 0:
        os.makedirs(f"{out}/sharded")
    dist.barrier()
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(f"{out}/sharded", fqn_to_index_mapping=index, save_distributed=True))
    dist.barrier()
    consolidate_safetensors_files_on_every_rank(f"{out}/sharded", out, fqn_to_index_mapping=index)
    if rank == 0:
        import shutil
        shutil.rmtree(f"{out}/sharded")
        write_index(Path(out), index, dict(sizes))
    dist.barrier()
    del sd
    write_s = time.perf_counter() - t
    check = compare_export(model, out, torch.device("cpu"))
else:
    sd = full_model_state_dict(model)
    if rank == 0:
        from safetensors.torch import save_file
        os.makedirs(out, exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items() if k != "lm_head.weight" or not conf.tie_word_embeddings}, f"{out}/model.safetensors")
    del sd
    check = None
dist.barrier()
export_s = time.perf_counter() - t
marks["after_export"] = rss()
json.dump({"rank": rank, "peak_rss": marks, "load_s": load_s, "export_s": export_s, "write_s": write_s, "check": check}, open(report, "w"))
dist.destroy_process_group()
"""


def write_source(preset: str, path: Path) -> int:
    """A seeded random init of ``preset`` as bf16 safetensors in ``path`` (kept when there);
    returns the fp32 model's bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.model import load_model_config

    conf = load_model_config(ModelConfig(name_or_path=preset))
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
        model.save_pretrained(path, max_shard_size="2GB")
        del model
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    return 4 * sum(p.numel() for p in skeleton.parameters())


def run_mode(mode: str, ranks: int, src: Path, work: Path) -> list[dict]:
    out, script = work / f"export-{mode}", work / "rank.py"
    shutil.rmtree(out, ignore_errors=True)
    script.write_text(RANK)
    store = work / f"store-{mode}"
    store.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(ranks), str(store), str(src), str(out), mode, str(work / f"report-{mode}-{r}.json")],
            env=env,
        )
        for r in range(ranks)
    ]
    codes = [p.wait(timeout=3600) for p in procs]
    assert codes == [0] * ranks, codes
    shutil.rmtree(out, ignore_errors=True)
    return [json.loads((work / f"report-{mode}-{r}.json").read_text()) for r in range(ranks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--work", default="/tmp/rayft-rss")
    ap.add_argument(
        "--modes", default="sharded,gathered", help="comma-separated: sharded, sharded-dcp (the sharded export before 2026-12-02), gathered"
    )
    ap.add_argument("--out", default=str(ROOT / "bench/results" / f"{datetime.date.today()}-sharded-weights-rss-{os.cpu_count()}cpu.json"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"{args.preset}-bf16"
    # in a child process, so that this one stays small (the ranks are its children)
    got = subprocess.run([sys.executable, __file__, "--write-source", args.preset, str(src)], capture_output=True, text=True, check=True)
    model_bytes = int(got.stdout.split()[-1])
    bound = 1.3 * model_bytes / args.ranks + 2e9
    modes = {mode: run_mode(mode, args.ranks, src, work) for mode in args.modes.split(",")}
    gb = 1e9
    figures = {
        "model_fp32_bytes": model_bytes,
        "ranks": args.ranks,
        "bound_bytes_per_rank": bound,
        "modes": {
            mode: {
                "peak_rss_gb_per_rank": [round(max(r["peak_rss"].values()) / gb, 3) for r in reps],
                "after_imports_gb": [round(r["peak_rss"]["after_imports"] / gb, 3) for r in reps],
                "after_load_gb": [round(r["peak_rss"]["after_load"] / gb, 3) for r in reps],
                "load_s": [round(r["load_s"], 1) for r in reps],
                "export_s": [round(r["export_s"], 1) for r in reps],
                "write_s": [None if r.get("write_s") is None else round(r["write_s"], 1) for r in reps],
                "within_bound": all(max(r["peak_rss"].values()) <= bound for r in reps),
                "export_check": reps[0]["check"],
            }
            for mode, reps in modes.items()
        },
    }
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    doc = {
        "command": f"python bench/sharded_weights_rss.py --preset {args.preset} --ranks {args.ranks} --modes {args.modes}",
        "git_commit": commit,
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU (gloo ranks on the CPU)",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "figures": figures,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-source"]:
        print(write_source(sys.argv[2], Path(sys.argv[3])))
    else:
        main()

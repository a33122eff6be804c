"""Time the training step's parts on one GPU without Ray (diagnostics for bench/NOTES.md).

    python3 bench/gpu/profile_step.py [--model qwen2.5-1.5b] [--mb 8] [--seq 2048]
Prints ms per step for: random tokens (no position ids), packed real rows (restarting position
ids), the collate alone, and a torch.profiler table of the packed step.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from rayft.config import ModelConfig, ParallelConfig
from rayft.data.formats import load_conversations
from rayft.data.packing import collate, plan_steps
from rayft.data.tokenize import tokenize_dataset
from rayft.data.tokenizer import load_tokenizer
from rayft.train.model import build_sharded_model
from rayft.train.step import train_step

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="qwen2.5-1.5b")
ap.add_argument("--mb", type=int, default=8)
ap.add_argument("--seq", type=int, default=2048)
ap.add_argument("--data", nargs="+", default=[".gpu/data/alpaca_en_demo.json", ".gpu/data/alpaca_zh_demo.json"])
ap.add_argument("--attn", default="sdpa")
ap.add_argument("--clip", action="store_true")
ap.add_argument("--no-profile", action="store_true")
a = ap.parse_args()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29555", RANK="0", WORLD_SIZE="1")
dist.init_process_group("nccl")
dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
model = build_sharded_model(
    ModelConfig(name_or_path=a.model, attn_implementation=a.attn),
    ParallelConfig(),
    device=dev,
    activation_checkpointing=False,
    compile_layers=False,
    seed=0,
)
opt = torch.optim.AdamW(model.module.parameters(), lr=1e-5, fused=True)
tok = load_tokenizer("qwen2.5")
ds = tokenize_dataset(tok, load_conversations(a.data), a.seq)
plan = plan_steps(ds, rows_per_step=a.mb, row_len=a.seq, packing=True, shuffle=True, seed=0, epochs=1, max_steps=20)


def timed(name, make_batch, n=8, warm=3):
    ts = []
    for i in range(n + warm):
        b = make_batch(i)
        torch.cuda.synchronize()
        t = time.perf_counter()
        step(b)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    ts = sorted(ts[warm:])
    med = ts[len(ts) // 2]
    print(
        f"{name}: {1000 * med:.1f} ms/step, {a.mb * a.seq / med:,.0f} tokens/s (row tokens), peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
        flush=True,
    )


def step(b):
    """rayft's own step (rayft.train.step.train_step) on one micro-batch; clipping with --clip."""
    n = int((b["labels"] != -100).sum())
    return train_step(model, opt, [b], n_trainable=n, max_grad_norm=1.0 if a.clip else None)


def rnd(i):
    ids = torch.randint(0, 151000, (a.mb, a.seq), device=dev)
    return {
        "input_ids": ids,
        "position_ids": torch.arange(a.seq, device=dev).expand(a.mb, -1),
        "labels": ids,
        "cu_seq_lens": torch.arange(0, (a.mb + 1) * a.seq, a.seq, device=dev, dtype=torch.int32),  # one document per row
    }


def packed(i):
    return {k: v.to(dev) for k, v in collate(ds, plan.step_rows(i % len(plan)), a.seq, 151643).items()}


t = time.perf_counter()
for i in range(10):
    collate(ds, plan.step_rows(i % len(plan)), a.seq, 151643)
print(f"collate: {100 * (time.perf_counter() - t):.1f} ms per micro-batch", flush=True)
timed("random tokens, causal", rnd)
timed("packed rows, restarting position ids", packed)
if a.no_profile:
    raise SystemExit(0)

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for i in range(2):
        b = packed(i)
        step(b)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
dist.destroy_process_group()

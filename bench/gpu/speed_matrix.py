"""Time rayft's training step under one setting at a time, without Ray (diagnostics for bench/NOTES.md).

    python3 bench/gpu/speed_matrix.py --name fused+compile --gpus 2 --ce fused --compile --mb 16 [--data packed]

One process per GPU (torch.multiprocessing), the real model builder and loss
(``build_sharded_model``, ``train_step``), fused AdamW, grad clipping, as in the training
loop. Prints one JSON line: median step time over the timed steps, tokens/s/GPU (non-padding),
MFU, peak memory; appends it to ``--out`` when given.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ap = argparse.ArgumentParser()
ap.add_argument("--name", required=True)
ap.add_argument("--model", default="qwen2.5-1.5b")
ap.add_argument("--gpus", type=int, default=1)
ap.add_argument("--mb", type=int, default=8)
ap.add_argument("--seq", type=int, default=2048)
ap.add_argument("--data", choices=["random", "packed", "padded"], default="random")
ap.add_argument("--files", nargs="+", default=[".gpu/data/alpaca_en_demo.json", ".gpu/data/alpaca_zh_demo.json"])
ap.add_argument("--attn", default="auto")
ap.add_argument("--ce", default="auto")
ap.add_argument("--compile", action="store_true")
ap.add_argument("--liger", action="store_true")
ap.add_argument("--ac", action="store_true")
ap.add_argument("--no-reshard", action="store_true")
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--warmup", type=int, default=4)
ap.add_argument("--out")


def worker(rank: int, a) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK=str(rank), WORLD_SIZE=str(a.gpus))
    dist.init_process_group("nccl", device_id=torch.device(f"cuda:{rank}"))
    dev = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(dev)
    from rayft.config import ModelConfig, ParallelConfig
    from rayft.data.packing import collate, plan_steps
    from rayft.train.metrics import flops_per_token, gpu_peak_flops, mfu
    from rayft.train.model import build_sharded_model, load_model_config, matmul_params
    from rayft.train.step import COUNT_KEYS, global_counts, train_step

    mcfg = ModelConfig(name_or_path=a.model, attn_implementation=a.attn)
    model = build_sharded_model(
        mcfg,
        ParallelConfig(reshard_after_forward=not a.no_reshard),
        device=dev,
        activation_checkpointing=a.ac,
        compile_layers=a.compile,
        seed=0,
        liger_kernels=a.liger,
        cross_entropy=a.ce,
    )
    opt = torch.optim.AdamW(model.module.parameters(), lr=1e-5, fused=True)
    conf = load_model_config(mcfg)
    n_mm = matmul_params(model.module)
    _, peak = gpu_peak_flops(dev)
    if a.data in ("packed", "padded"):
        from rayft.data.formats import load_conversations
        from rayft.data.tokenize import tokenize_dataset
        from rayft.data.tokenizer import load_tokenizer

        ds = tokenize_dataset(load_tokenizer("qwen2.5"), list(load_conversations(a.files)), a.seq)
        packing = a.data == "packed"
        plan = plan_steps(ds, rows_per_step=a.mb * a.gpus, row_len=a.seq, packing=packing, shuffle=True, seed=0, epochs=10, max_steps=None)

    def batch(i):
        if a.data == "random":
            g = torch.Generator().manual_seed(i * 100 + rank)
            ids = torch.randint(0, 151000, (a.mb, a.seq), generator=g)
            b = {
                "input_ids": ids,
                "position_ids": torch.arange(a.seq).expand(a.mb, -1).contiguous(),
                "labels": torch.roll(ids, -1, 1),
                "cu_seq_lens": torch.arange(0, (a.mb + 1) * a.seq, a.seq, dtype=torch.int32),
                "num_tokens": torch.tensor(a.mb * a.seq),
                "num_trainable": torch.tensor(a.mb * a.seq),
                "attn_tokens_sq": torch.tensor(float(a.mb * a.seq * a.seq)),
            }
        else:
            b = collate(ds, plan.step_rows(i % len(plan))[rank :: a.gpus], a.seq, 151643, fixed_len=packing)
        return {k: v if k in COUNT_KEYS else v.to(dev, non_blocking=True) for k, v in b.items()}  # counts stay on the host, as in training

    times, toks, sqs = [], [], []
    for i in range(a.warmup + a.steps):
        b = batch(i)
        torch.cuda.synchronize()
        t = time.perf_counter()
        counts = global_counts([b], time_vote=False, write_done=True, device=dev)  # the global trainable targets, as in training
        loss = train_step(model, opt, [b], counts.trainable, max_grad_norm=1.0).loss
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
            toks.append(int(b["num_tokens"]))
            sqs.append(float(b["attn_tokens_sq"]))
    med = statistics.median(times)
    tps = statistics.median(n / t for n, t in zip(toks, times))
    span = sum(sqs) / sum(toks)
    fpt = flops_per_token(n_mm, conf.num_hidden_layers, conf.hidden_size, span)
    res = {
        "name": a.name,
        "gpus": a.gpus,
        "mb": a.mb,
        "seq": a.seq,
        "data": a.data,
        "attn": model.attn_implementation,
        "ce": a.ce,
        "compile": a.compile,
        "liger": a.liger,
        "ac": a.ac,
        "reshard_after_forward": not a.no_reshard,
        "step_s_median": round(med, 4),
        "step_s_min": round(min(times), 4),
        "step_s_max": round(max(times), 4),
        "tokens_per_s_per_gpu": round(tps),
        "mfu": round(mfu(tps, fpt, peak), 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 1),
        "loss_last": round(loss, 4),
    }
    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    args = ap.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.gpus)

"""Issue 9, part 3, on one GPU: what fits in an L4's memory when FSDP2 shards over 8 ranks.

    python3 bench/gpu/l4_fit_fakepg.py --seq 2048 --mbs 1,2,4,8 [--ac] --out $OUT/l4fit-seq2048.json

One process plays rank 0 of ``--world`` (8, the sample's world size) through PyTorch's fake process
group (``torch.testing._internal.distributed.fake_pg``: collectives return at once and move no
data; torchtitan's memory estimation uses the same). FSDP2 therefore shards every parameter,
gradient and AdamW state 8 ways, exactly as on 8 GPUs, while all the compute runs on this GPU.
The model is built by rayft's own ``build_sharded_model`` (compile per layer, fused loss,
reshard-after-forward on, as ``rayft train`` does by default), and PyTorch's memory is capped at
``--limit-gib`` by rayft's ``cap_gpu_memory`` (``train.gpu_memory_limit_gib``).

For each micro-batch in ``--mbs`` (ascending) it runs ``--warm`` + ``--steps`` training steps
(forward, backward, clipping, AdamW) on random tokens of length ``--seq`` and records the peak
allocated and reserved memory (GiB) and the median step time, stopping at the first micro-batch
that runs out of memory.

Left out, so the true margin on an L4 is smaller: NCCL's buffers and the CUDA context, which sit
outside PyTorch's allocator and on an L4 come out of the same 24 GB. The step times are this GPU's
compute without communication, not an L4's. After the fake all-gathers the parameters hold
whatever was in memory, so the losses mean nothing.
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-1.5b", help="a rayft preset")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mbs", default="1,2,4,8", help="micro-batches to try, ascending")
    ap.add_argument("--ac", action="store_true", help="activation checkpointing")
    ap.add_argument("--limit-gib", type=float, default=22.5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.train.device import cap_gpu_memory
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    dev = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.world)
    res = {
        "model": a.model,
        "world": a.world,
        "seq": a.seq,
        "activation_checkpointing": a.ac,
        "limit_gib": a.limit_gib,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "tries": [],
    }
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        res["memory_fraction"] = cap_gpu_memory(dev, a.limit_gib)
    t = time.perf_counter()
    model = build_sharded_model(
        ModelConfig(name_or_path=a.model, attn_implementation="auto", init_device="gpu"),
        ParallelConfig(),
        device=dev,
        activation_checkpointing=a.ac,
        compile_layers=True,
        seed=0,
        cross_entropy="auto",
    )
    opt = build_optimizer(model.module, TrainConfig(lr=1e-5), dev)
    res["build_s"] = round(time.perf_counter() - t, 1)
    gib = (lambda f: round(f() / 2**30, 2)) if dev.type == "cuda" else (lambda f: None)
    res["after_build_allocated_gib"] = gib(torch.cuda.memory_allocated)
    vocab = model.module.config.vocab_size
    for mb in (int(v) for v in a.mbs.split(",")):
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, t_try = [], time.perf_counter()
        try:
            for i in range(a.warm + a.steps):
                ids = torch.randint(0, vocab - 1000, (mb, a.seq), device=dev)
                batch = {
                    "input_ids": ids,
                    "position_ids": torch.arange(a.seq, device=dev).expand(mb, -1),
                    "labels": ids,
                    "cu_seq_lens": torch.arange(0, mb * a.seq + 1, a.seq, device=dev, dtype=torch.int32),
                }
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                # rayft's own step; every rank of the fake group stands for one with the same token count
                train_step(model, opt, [batch], n_trainable=a.world * ids.numel(), max_grad_norm=1.0)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                if i >= a.warm:
                    times.append(time.perf_counter() - t0)
            step = statistics.median(times)
            row = {
                "micro_batch": mb,
                "fits": True,
                "step_s": round(step, 4),
                "tokens_per_s": round(mb * a.seq / step),
                "peak_allocated_gib": gib(torch.cuda.max_memory_allocated),
                "peak_reserved_gib": gib(torch.cuda.max_memory_reserved),
                "try_s": round(time.perf_counter() - t_try, 1),
            }
        except torch.OutOfMemoryError as e:
            row = {
                "micro_batch": mb,
                "fits": False,
                "error": str(e).split("\n")[0][:300],
                "peak_allocated_gib": gib(torch.cuda.max_memory_allocated),
                "peak_reserved_gib": gib(torch.cuda.max_memory_reserved),
            }
        res["tries"].append(row)
        print(f"[l4fit] seq {a.seq} ac {a.ac} {row}", flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        if not row["fits"]:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

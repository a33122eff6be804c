"""Issue 9, part 3, on one GPU: what fits in an L4's memory when FSDP2 shards over 8 ranks.

    python3 bench/gpu/l4_fit_fakepg.py --seq 2048 --mbs 1,2,4,8 [--ac] --out $OUT/l4fit-seq2048.json
    python3 bench/gpu/l4_fit_fakepg.py --model qwen2.5-7b --modes ac,ac+offload --mbs 1,2,4 --out ...

``--modes`` (comma-separated, each run in turn in the same process): ``none``; ``ac`` (activation
checkpointing on every decoder layer) or ``acK`` (every K-th layer); ``offload``
(``parallel.cpu_offload``: the shards, their gradients and AdamW states in pinned host memory, the
optimizer step on the CPU); combined with ``+``, e.g. ``ac+offload``.

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
    ap.add_argument("--ac", action="store_true", help="activation checkpointing (the same as --modes ac)")
    ap.add_argument("--modes", default="none", help="comma-separated: none, ac, acK, offload, ac+offload, ...")
    ap.add_argument("--limit-gib", type=float, default=22.5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from rayft.train.device import cap_gpu_memory

    dev = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=a.world)
    modes = ["ac"] if a.ac else a.modes.split(",")
    res = {
        "model": a.model,
        "world": a.world,
        "seq": a.seq,
        "limit_gib": a.limit_gib,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "modes": {},
    }
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        res["memory_fraction"] = cap_gpu_memory(dev, a.limit_gib)
    for mode in modes:
        res["modes"][mode] = run_mode(a, mode, dev, res)
    dist.destroy_process_group()


def host_rss_gib() -> float:
    """This process's resident host memory now (GiB; pinned buffers count), from /proc."""
    import os

    with open("/proc/self/statm") as f:
        return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30, 2)


def run_mode(a, mode: str, dev: torch.device, res: dict) -> dict:
    """Build the model in ``mode`` and try each micro-batch; the mode's record."""
    import gc

    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    parts = mode.split("+")
    ac: bool | int = False
    for part in parts:
        if part.startswith("ac"):
            ac = int(part[2:]) if part[2:] else True
        elif part not in ("none", "offload"):
            raise SystemExit(f"--modes: unknown mode part {part!r} in {mode!r}")
    offload = "offload" in parts
    rec = {"activation_checkpointing": ac, "cpu_offload": offload, "tries": []}
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    try:
        model = build_sharded_model(
            ModelConfig(name_or_path=a.model, attn_implementation="auto", init_device="gpu"),
            ParallelConfig(cpu_offload=offload),
            device=dev,
            activation_checkpointing=ac,
            compile_layers=True,
            seed=0,
            cross_entropy="auto",
        )
    except torch.OutOfMemoryError as e:
        rec["build_error"] = str(e).split("\n")[0][:300]
        print(f"[l4fit] {a.model} {mode}: out of memory while building", flush=True)
        return rec
    opt = build_optimizer(model.module, TrainConfig(lr=1e-5), dev)
    rec["build_s"] = round(time.perf_counter() - t, 1)
    gib = (lambda f: round(f() / 2**30, 2)) if dev.type == "cuda" else (lambda f: None)
    rec["after_build_allocated_gib"] = gib(torch.cuda.memory_allocated)
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
                "host_rss_gib": host_rss_gib(),
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
        rec["tries"].append(row)
        res["modes"][mode] = rec
        print(f"[l4fit] {a.model} seq {a.seq} {mode} {row}", flush=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        if not row["fits"]:
            break
    del model, opt
    return rec


if __name__ == "__main__":
    main()

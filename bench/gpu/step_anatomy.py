"""Where rayft's training step spends its GPU time, and what the candidate changes buy.

    python3 bench/gpu/step_anatomy.py --ng 2 --mb 16 --out $OUT/step-anatomy.json [--trace $OUT/trace.json.gz]

Diagnostics for bench/NOTES.md (no Ray: one process per GPU, FSDP2 exactly as the worker builds
it, with compile, the fused loss and reshard-after-forward off). Three parts:

1. kernels alone on GPU 0: matmul rates for the decoder layer's and the LM head's shapes at the
   micro-batch's token count, causal GQA attention (forward + backward) under each SDPA backend,
   and liger's fused linear cross-entropy (forward + backward) at several ``chunk_mem_const``;
2. the training step (``--accum`` forward/backward passes, clipping, AdamW) on ``--ng`` GPUs for
   each variant in ``--variants``, median of ``--steps`` after ``--warm``, GPU phases timed with CUDA events;
3. a torch.profiler trace of two steps of the last variant on rank 0, its kernels summed by kind
   (matmul, attention, loss, fused elementwise, optimizer, collectives, other) and the share of the
   step in which the compute stream ran nothing.
Everything is printed and written to ``--out`` as JSON.
"""

import argparse
import contextlib
import gzip
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 1536, 8960, 12, 2, 128, 151936  # Qwen2.5-1.5B


def cuda_ms(fn, n=10, warm=3):
    """Median CUDA-event milliseconds of ``fn()``."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()  # noqa: E702
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def kernels_alone(tokens: int, seq: int) -> dict:
    dev = torch.device("cuda:0")
    out = {"matmul_tflops": {}, "attention_ms": {}, "fused_ce_ms": {}}
    shapes = {
        "qkv": (HIDDEN, HIDDEN + 2 * KV_HEADS * HEAD_DIM),
        "o": (HIDDEN, HIDDEN),
        "gate_up": (HIDDEN, 2 * INTER),
        "down": (INTER, HIDDEN),
        "lm_head": (HIDDEN, VOCAB),
    }
    for name, (k, n) in shapes.items():
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        ms = cuda_ms(lambda: F.linear(x, w))
        out["matmul_tflops"][name] = round(2 * tokens * k * n / ms / 1e9, 1)
        x = w = None
    B = tokens // seq
    q = torch.randn(B, HEADS, seq, HEAD_DIM, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, KV_HEADS, seq, HEAD_DIM, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in [
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ]:
        for gqa in (True, False):
            kk, vv = (k, v) if gqa else (k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1))

            def fb():
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa)
                o.sum().backward()

            try:
                out["attention_ms"][f"{name}{'' if gqa else '_expanded_kv'}"] = round(cuda_ms(fb), 3)
            except Exception as e:  # noqa: BLE001 (a backend that cannot take this shape)
                out["attention_ms"][f"{name}{'' if gqa else '_expanded_kv'}"] = f"{type(e).__name__}: {str(e)[:120]}"
    try:
        from torch.nn.attention.varlen import varlen_attn

        qv, kv_, vv_ = (t.detach().transpose(1, 2).reshape(B * seq, t.shape[1], HEAD_DIM).requires_grad_() for t in (q, k, v))
        cu = torch.arange(0, B * seq + 1, seq, device=dev, dtype=torch.int32)

        def fbv():
            o = varlen_attn(qv, kv_, vv_, cu, cu, seq, seq, window_size=(-1, 0), enable_gqa=True)
            o.sum().backward()

        out["attention_ms"]["varlen_flash"] = round(cuda_ms(fbv), 3)
    except Exception as e:  # noqa: BLE001
        out["attention_ms"]["varlen_flash"] = f"{type(e).__name__}: {str(e)[:160]}"
    q = k = v = None
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    h = torch.randn(tokens, HIDDEN, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(VOCAB, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02).requires_grad_()
    tgt = torch.randint(0, VOCAB, (tokens,), device=dev)
    for c in (1, 2, 4, 8, 16):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

        def ce():
            liger_fused_linear_cross_entropy(h, w, tgt, reduction="sum", accum_dtype=torch.float32, chunk_mem_const=c).backward()
            h.grad = w.grad = None

        ms = cuda_ms(ce)
        out["fused_ce_ms"][str(c)] = {
            "ms": round(ms, 2),
            "extra_peak_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 2),
            "tflops_of_3_matmuls": round(6 * tokens * HIDDEN * VOCAB / ms / 1e9, 1),
        }
    return out


VARIANTS = {
    # name: (SDPA backends in priority order or None for PyTorch's choice, liger chunk_mem_const)
    "base": (None, 1),
    "ce4": (None, 4),
    "ce8": (None, 8),
    "ce16": (None, 16),
    "cudnn_ce4": (["CUDNN_ATTENTION", "FLASH_ATTENTION"], 4),
    "cudnn_ce8": (["CUDNN_ATTENTION", "FLASH_ATTENTION"], 8),
    "cudnn_ce16": (["CUDNN_ATTENTION", "FLASH_ATTENTION"], 16),
}


def worker(rank: int, a) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561", RANK=str(rank), WORLD_SIZE=str(a.ng), LOCAL_RANK=str(rank))
    dev = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.train.loss import TokenLoss
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    model = build_sharded_model(
        ModelConfig(name_or_path="qwen2.5-1.5b", attn_implementation="auto", init_device="gpu"),
        ParallelConfig(reshard_after_forward=False, reduce_dtype=a.reduce_dtype),
        device=dev,
        activation_checkpointing=False,
        compile_layers=True,
        seed=0,
        cross_entropy="fused",
    )
    opt = build_optimizer(model.module, TrainConfig(lr=1e-5), dev)
    B, L = a.mb, a.seq
    gen = torch.Generator(device=dev).manual_seed(rank)

    def batch():
        ids = torch.randint(0, VOCAB - 1000, (B, L), device=dev, generator=gen)
        return {
            "input_ids": ids,
            "position_ids": torch.arange(L, device=dev).expand(B, -1),
            "labels": ids,
            "cu_seq_lens": torch.arange(0, B * L + 1, L, device=dev, dtype=torch.int32),
        }

    def step(accum: int = 1):
        """rayft's own step (rayft.train.step.train_step) over ``accum`` micro-batches; every token is a target."""
        bs = [batch() for _ in range(accum)]
        return train_step(model, opt, bs, n_trainable=a.ng * sum(b["labels"].numel() for b in bs), max_grad_norm=1.0)

    results = {}
    for name in a.variants.split(","):
        backends, chunk = VARIANTS[name]
        model.loss = TokenLoss("fused", {"chunk_mem_const": chunk})
        torch._dynamo.reset()
        ctx = sdpa_kernel([getattr(SDPBackend, x) for x in backends], set_priority=True) if backends else contextlib.nullcontext()
        times, fb, op = [], [], []
        t_first = time.perf_counter()
        try:
            with ctx:
                for i in range(a.warm + a.steps):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    r = step(a.accum)  # gradient accumulation: reduce-scatter on the last micro-batch only
                    loss = r.loss
                    dt = time.perf_counter() - t
                    if i == 0:
                        first = time.perf_counter() - t_first
                    if i >= a.warm:
                        times.append(dt)
                        fb.append(r.fwd_bwd_s)
                        op.append(r.optim_s)
            med = statistics.median(times)
            results[name] = {
                "step_s": round(med, 4),
                "step_s_min": round(min(times), 4),
                "step_s_max": round(max(times), 4),
                "fwd_bwd_s": round(statistics.median(fb), 4),
                "clip_optim_s": round(statistics.median(op), 4),
                "tokens_per_s_per_gpu": round(a.accum * B * L / med),
                "first_step_s": round(first, 1),
                "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
                "last_loss": loss,
            }
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        torch.cuda.reset_peak_memory_stats()
        if rank == 0:
            print(f"[variant {name}] {results[name]}", flush=True)
    prof_summary = None
    if a.trace:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        if rank == 0:
            raw = a.trace[:-3] if a.trace.endswith(".gz") else a.trace
            prof.export_chrome_trace(raw)
            prof_summary = summarise_trace(raw)
            if a.trace.endswith(".gz"):
                with open(raw, "rb") as f, gzip.open(a.trace, "wb") as g:
                    g.write(f.read())
                os.remove(raw)
    if rank == 0:
        with open(a.out + ".steps.json", "w") as f:
            json.dump({"variants": results, "profile": prof_summary}, f, indent=1)
    dist.destroy_process_group()


KINDS = [
    ("collective", ("nccl",)),
    ("attention", ("flash", "fmha", "cudnn", "attn")),
    ("loss", ("cross_entropy", "liger", "element_mul")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "nvjet", "sm90", "cutlass", "xmma", "cublas", "splitk")),
    ("fused_elementwise", ("triton",)),
]


def kind_of(name: str) -> str:
    n = name.lower()
    for kind, keys in KINDS:
        if any(k in n for k in keys):
            return kind
    return "other"


def summarise_trace(path: str) -> dict:
    """GPU milliseconds per kernel kind over the traced steps, the top kernels, and the compute
    stream's idle share between its first and last kernel."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel"]
    by_kind, by_name = {}, {}
    for e in ev:
        k = kind_of(e["name"])
        by_kind[k] = by_kind.get(k, 0.0) + e["dur"] / 1e3
        by_name[e["name"][:90]] = by_name.get(e["name"][:90], 0.0) + e["dur"] / 1e3
    comp = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if kind_of(e["name"]) != "collective")
    busy, end = 0.0, None
    for s, t in comp:
        if end is None or s > end:
            busy += t - s
            end = t  # noqa: E702
        elif t > end:
            busy += t - end
            end = t  # noqa: E702
    span = comp[-1][1] - comp[0][0] if comp else 0
    return {
        "steps": 2,
        "gpu_ms_by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda x: -x[1])},
        "compute_span_ms": round(span / 1e3, 1),
        "compute_busy_ms": round(busy / 1e3, 1),
        "compute_idle_share": round(1 - busy / span, 3) if span else None,
        "top_kernels_ms": {k: round(v, 1) for k, v in sorted(by_name.items(), key=lambda x: -x[1])[:25]},
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ng", type=int, default=2)
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--variants", default="base,ce4,ce8,cudnn_ce4")
    ap.add_argument("--reduce-dtype", default="float32")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--trace", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    res = {
        "gpu": torch.cuda.get_device_name(0),
        "ng": a.ng,
        "mb": a.mb,
        "seq": a.seq,
        "torch": torch.__version__,
        "reduce_dtype": a.reduce_dtype,
        "accum": a.accum,
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
    }
    if not a.skip_kernels:
        t = time.perf_counter()
        res["kernels_alone"] = kernels_alone(a.mb * a.seq, a.seq)
        res["kernels_alone_s"] = round(time.perf_counter() - t, 1)
        print(json.dumps(res, indent=1), flush=True)
        torch.cuda.empty_cache()
    mp.spawn(worker, args=(a,), nprocs=a.ng)
    with open(a.out + ".steps.json") as f:
        res.update(json.load(f))
    os.remove(a.out + ".steps.json")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "kernels_alone"}, indent=1), flush=True)

"""Spike (research only, not product code): rayft's training step on ONE GPU with and without FSDP2.

    python3 bench/gpu/single_rank_spike.py --variants fsdp,fsdp-noreshard,nofsdp-autocast,nofsdp-bf16 \
        --out $OUT/spike.json [--deadline EPOCH_S]

On one rank FSDP2's all-gather copy-in/copy-out, fp32 -> bf16 casts and reduce-scatter copies took
~21 ms of a ~349 ms step (bench/NOTES.md §24). This measures the step without them. Variants:

- ``fsdp``: rayft as it was (FSDP2 over the one rank: ``single_worker="fsdp2"``, reshard_after_forward True).
- ``fsdp-noreshard``: the same with ``reshard_after_forward=False``.
- ``nofsdp-autocast``: ``rayft.train.model.fully_shard`` patched to a no-op, so the model stays a
  plain module with fp32 parameters; the forward and the loss (``rayft.train.step.micro_batch_loss``)
  run under ``torch.autocast(bfloat16)``, the backward outside it (as torchtitan does on one GPU and
  as PyTorch's AMP recipe says). ``register_fsdp_forward_method`` is already a no-op for a module
  that is not an ``FSDPModule``; the plain module gets a no-op ``set_requires_gradient_sync``.
- ``nofsdp-bf16``: ``fully_shard`` a no-op and the parameters cast to bf16 after the build (buffers,
  e.g. RoPE's ``inv_freq``, stay fp32); AdamW then steps bf16 parameters: not what would ship, only
  the speed of "no copies and no casts at all".

Each variant runs in its own child process (no CUDA_LAUNCH_BLOCKING), on a real one-rank NCCL group,
building the preset through ``build_sharded_model`` (as ``bench/gpu/step_isolate.py``) and running
rayft's ``train_step`` on packed rows of random documents. Per variant: ok, step times (the
median over steps 4..end), tokens/s (``mb * seq / median``), peak memory, the step-1 loss and
gradient norm; a failed variant's last output lines. ``--device cpu`` runs the same code on gloo
(no liger, no compile; use a tiny preset) to check the patching without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

VARIANTS = ("fsdp", "fsdp-noreshard", "nofsdp-autocast", "nofsdp-bf16")


def child(a: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import rayft.train.model as rmodel
    import rayft.train.step as rstep
    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.data.packing import collate
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    v = a.variant
    if v not in VARIANTS:
        raise ValueError(f"unknown variant {v!r}: one of {VARIANTS}")
    on_gpu = a.device == "cuda"
    dev = torch.device("cuda:0" if on_gpu else "cpu")
    if on_gpu:
        torch.cuda.set_device(dev)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=0, world_size=1)

    nofsdp = v.startswith("nofsdp")
    if nofsdp:
        calls = []

        def no_fully_shard(module, **kw):  # the module stays a plain nn.Module
            calls.append(type(module).__name__)
            return module

        rmodel.fully_shard = no_fully_shard
    if v == "nofsdp-autocast":
        plain_loss = rstep.micro_batch_loss

        def autocast_loss(model, batch):  # forward and loss under autocast; backward (in forward_backward) outside
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                return plain_loss(model, batch)

        rstep.micro_batch_loss = autocast_loss  # forward_backward looks it up in rayft.train.step at each call

    # FSDP2 over the one rank in every variant (the spike predates parallel.single_worker, whose
    # one-GPU default skips FSDP2 the shippable way: rayft.train.compute_copy); the nofsdp variants
    # patch fully_shard out themselves
    par = ParallelConfig(reshard_after_forward=v != "fsdp-noreshard", single_worker="fsdp2")
    overrides = {"num_hidden_layers": a.layers} if a.layers else {}
    t_build = time.perf_counter()
    model = build_sharded_model(
        ModelConfig(name_or_path=a.preset, attn_implementation="auto", init_device="gpu", config_overrides=overrides),
        par,
        device=dev,
        activation_checkpointing=False,
        compile_layers=on_gpu,
        seed=0,
        liger_kernels=on_gpu,
        cross_entropy="auto",
    )
    build_s = time.perf_counter() - t_build
    from torch.distributed.fsdp import FSDPModule

    is_fsdp = isinstance(model.module, FSDPModule)
    assert is_fsdp != nofsdp, f"{v}: FSDPModule={is_fsdp}"
    if nofsdp:
        model.module.set_requires_gradient_sync = lambda *args, **kw: None  # FSDP2's method, called by forward_backward
    if v == "nofsdp-bf16":
        with torch.no_grad():
            for p in model.module.parameters():  # tied embeddings: one parameter, cast once
                p.data = p.data.to(torch.bfloat16)
    dtypes = sorted({str(p.dtype) for p in model.module.parameters()})
    opt = build_optimizer(model.module, TrainConfig(lr=1e-5), dev)
    vocab = model.module.config.vocab_size
    rng = np.random.default_rng(0)

    class Docs:  # collate's dataset: example(i) -> (tokens, trainable)
        def __init__(self, n: int):
            self.docs = []
            for _ in range(n):
                n_tok = int(rng.integers(40, a.seq // a.docs * 2))
                tok = rng.integers(0, min(vocab, 150000), n_tok).astype(np.int32)
                train = np.zeros(n_tok, bool)
                train[n_tok // 3 :] = True
                self.docs.append((tok, train))

        def example(self, i: int):
            return self.docs[i]

    ds = Docs(a.mb * a.docs * (a.steps + 1))
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    times, losses, norms, fwd_bwd, optim = [], [], [], [], []
    for step in range(a.steps):
        rows, used = [], step * a.mb * a.docs
        for _ in range(a.mb):  # greedy: documents until the row is full
            row, length = [], 0
            while used < len(ds.docs) and length + len(ds.docs[used][0]) <= a.seq:
                row.append(used)
                length += len(ds.docs[used][0])
                used += 1
            rows.append(row or [used - 1])
        batch = {k: v_.to(dev) for k, v_ in collate(ds, rows, a.seq, 0, fixed_len=True).items()}
        sync()
        t = time.perf_counter()
        res = train_step(model, opt, [batch], float(batch["num_trainable"]), 1.0)
        sync()
        times.append(time.perf_counter() - t)
        losses.append(res.loss)
        norms.append(res.grad_norm)
        fwd_bwd.append(res.fwd_bwd_s)
        optim.append(res.optim_s)
        print(f"[spike] {v} step {step + 1} loss {res.loss:.4f} grad_norm {res.grad_norm:.4f} {times[-1]:.3f}s", flush=True)
    tail = times[3:] or times
    med = statistics.median(tail)
    rec = {
        "ok": True,
        "fsdp_module": is_fsdp,
        "fully_shard_calls_skipped": len(calls) if nofsdp else 0,
        "param_dtypes": dtypes,
        "attn_implementation": model.attn_implementation,
        "loss_impl": model.loss.impl,
        "build_s": round(build_s, 1),
        "step_s": [round(x, 4) for x in times],
        "median_step_s_4_to_end": round(med, 4),
        "tokens_per_s": round(a.mb * a.seq / med, 1),
        "fwd_bwd_s_median_4_to_end": round(statistics.median(fwd_bwd[3:] or fwd_bwd), 4),
        "optim_s_median_4_to_end": round(statistics.median(optim[3:] or optim), 4),
        "loss": [round(x, 5) for x in losses],
        "step1_loss": round(losses[0], 5),
        "step1_grad_norm": round(norms[0], 5),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if on_gpu else None,
    }
    if on_gpu:
        from importlib.metadata import version

        def ver(name: str) -> str | None:
            try:
                return version(name)
            except Exception:
                return None

        rec["env"] = {
            "gpu": torch.cuda.get_device_name(dev),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": ver("transformers"),
            "liger_kernel": ver("liger-kernel") or ver("liger_kernel"),
            "python": sys.version.split()[0],
        }
    print("RESULT " + json.dumps(rec), flush=True)
    dist.destroy_process_group()


def run_child(argv: list[str], timeout: float) -> tuple[str, int | str]:
    """The child's output and exit status ('timeout' when killed at ``timeout``: its whole process
    group, so Inductor's compile workers go with it)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        return out, p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return out or "", "timeout"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the preset's own)")
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=8, help="documents per packed row, roughly")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--timeout", type=int, default=150, help="seconds per variant at most")
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds by which every variant must end (0: none)")
    ap.add_argument("--commit", default="", help="the commit measured (the GPU host's copy has no .git)")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.variant:
        return child(a)
    results, env = {}, None
    t_all = time.perf_counter()
    for v in a.variants.split(","):
        timeout = a.timeout
        if a.deadline:
            timeout = min(timeout, a.deadline - time.time() - 3)
        if timeout < 20:
            results[v] = {"ok": False, "rc": "skipped", "tail": [f"skipped: {timeout:.0f} s left before the deadline"]}
            print(f"=== {v}: skipped (no time left)", flush=True)
            continue
        argv = [sys.executable, __file__, "--variant", v, *sys.argv[1:]]
        t = time.perf_counter()
        out, rc = run_child(argv, timeout)
        for line in out.splitlines():
            if line.startswith("[spike]") or "Error" in line or "error" in line:
                print(f"  {v} | {line[:400]}", flush=True)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        rec = json.loads(line[7:]) if line else {"ok": False, "rc": rc, "tail": [x for x in out.splitlines() if x.strip()][-30:]}
        rec["wall_s"] = round(time.perf_counter() - t, 1)
        rec["timeout_s"] = round(timeout, 1)
        env = env or rec.pop("env", None)
        rec.pop("env", None)
        results[v] = rec
        print(f"=== {v}: {json.dumps(rec)[:3000]}", flush=True)
        base = results.get("fsdp", {}).get("median_step_s_4_to_end")
        if a.out:
            for r in results.values():
                if base and r.get("ok"):
                    r["speedup_vs_fsdp"] = round(base / r["median_step_s_4_to_end"], 4)
            with open(a.out, "w") as f:
                json.dump(
                    {
                        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                        "commit": a.commit,
                        "preset": a.preset,
                        "layers": a.layers,
                        "micro_batch": a.mb,
                        "seq": a.seq,
                        "steps": a.steps,
                        "docs_per_row": a.docs,
                        "device": a.device,
                        "settings": "liger kernels on, torch.compile per layer on, no activation checkpointing, "
                        "attn_implementation auto, cross_entropy auto, max_grad_norm 1.0, AdamW lr 1e-5",
                        "env": env,
                        "wall_s": round(time.perf_counter() - t_all, 1),
                        "variants": results,
                    },
                    f,
                    indent=1,
                )
    print("SUMMARY", flush=True)
    base = results.get("fsdp", {}).get("median_step_s_4_to_end")
    for v, r in results.items():
        if r.get("ok"):
            ratio = f"{base / r['median_step_s_4_to_end']:.3f}x" if base else "-"
            print(
                f"{v:18s} median {r['median_step_s_4_to_end']:.4f} s  {r['tokens_per_s']:>10,.0f} tok/s  "
                f"vs fsdp {ratio}  peak {r['peak_gib']} GiB  loss1 {r['step1_loss']}",
                flush=True,
            )
        else:
            print(f"{v:18s} FAILED rc={r.get('rc')}", flush=True)


if __name__ == "__main__":
    main()

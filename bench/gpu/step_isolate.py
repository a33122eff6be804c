"""Find which switch makes rayft's training step fail on a GPU: each variant in its own process.

    python3 bench/gpu/step_isolate.py --preset qwen3-8b --layers 4 --mb 4 \
        --variants "ac+liger+compile,liger+compile,ac+compile,ac+liger" --out $OUT/isolate.json

A variant is a ``+``-joined set of switches: ``ac`` (activation checkpointing on every layer),
``liger`` (liger kernels as rayft routes them; ``liger-norm``, ``liger-rope``, ``liger-mlp``: with
that kernel off; ``liger-all``: every kernel on, past rayft's routing — the 2026-12-02 results ran
before that routing existed, so their ``liger`` is today's ``liger-all``), ``norm-newgrad`` (liger's RMSNorm computing its input gradient into a new buffer instead of over
the incoming gradient, liger's default), ``compile`` (torch.compile per layer); the switches left out are off.
Each variant runs in a child process (a CUDA fault poisons its process's context) with
``CUDA_LAUNCH_BLOCKING=1``, on one rank (a real one-rank NCCL group), building the preset through
rayft's ``build_sharded_model`` with ``--layers`` decoder layers (``model.config_overrides``), and
runs ``--steps`` steps of rayft's ``train_step`` on packed rows of random documents (``--docs``
per row, lengths drawn at random, prompt tokens untrained), as ``rayft train`` packs alpaca. It
records per variant: ok, the error's last lines, the step times and peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def child(a: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.data.packing import collate
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    sw = set(a.variant.split("+"))
    # liger-norm, liger-rope, liger-mlp: that kernel off; liger-all: every kernel on, past rayft's routing
    # (which leaves some off for some families under checkpointing + compile: rayft.train.families)
    drop = {x.split("-", 1)[1] for x in sw if x.startswith("liger-")}
    if drop:
        import rayft.train.families as fam

        plain = fam.liger_call

        def without(model_type: str, *rest):
            name, kw = plain(model_type) if "all" in drop else plain(model_type, *rest)
            for k in list(kw):
                if ("norm" in drop and k == "rms_norm") or ("rope" in drop and k == "rope") or ("mlp" in drop and k in ("swiglu", "geglu")):
                    kw[k] = False
            return name, kw

        fam.liger_call = without
        sw.add("liger")
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1)
    overrides = {"num_hidden_layers": a.layers} if a.layers else {}
    model = build_sharded_model(
        ModelConfig(name_or_path=a.preset, attn_implementation="auto", init_device="gpu", config_overrides=overrides),
        ParallelConfig(),
        device=dev,
        activation_checkpointing="ac" in sw,
        compile_layers="compile" in sw,
        seed=0,
        liger_kernels="liger" in sw,
        cross_entropy="auto",
    )
    if "norm-newgrad" in sw:  # liger's RMSNorm computing its input gradient in a new buffer (liger writes it over the incoming one)
        for m in model.module.modules():
            if getattr(m, "in_place", None) is True and hasattr(m, "casting_mode"):
                m.in_place = False
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
    times = []
    for step in range(a.steps):
        rows, used = [], step * a.mb * a.docs
        for _ in range(a.mb):  # greedy: documents until the row is full
            row, length = [], 0
            while used < len(ds.docs) and length + len(ds.docs[used][0]) <= a.seq:
                row.append(used)
                length += len(ds.docs[used][0])
                used += 1
            rows.append(row or [used - 1])
        batch = {k: v.to(dev) for k, v in collate(ds, rows, a.seq, 0, fixed_len=True).items()}
        torch.cuda.synchronize()
        t = time.perf_counter()
        res = train_step(model, opt, [batch], float(batch["num_trainable"]), 1.0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        print(f"[isolate] {a.variant} step {step + 1} loss {res.loss:.4f} {times[-1]:.2f}s", flush=True)
    print(
        "RESULT "
        + json.dumps({"ok": True, "step_s": [round(x, 3) for x in times], "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}),
        flush=True,
    )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-8b")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (0: the preset's own)")
    ap.add_argument("--mb", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=8, help="documents per packed row, roughly")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variants", default="ac+liger+compile")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.variant:
        return child(a)
    results = {}
    for v in a.variants.split(","):
        argv = [sys.executable, __file__, "--variant", v, *sys.argv[1:]]
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
        t = time.perf_counter()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout, env=env)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or b"").decode() + (e.stderr or b"").decode() if isinstance(e.stdout, bytes) else str(e), "timeout"
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        rec = json.loads(line[7:]) if line else {"ok": False, "rc": rc, "tail": [x for x in out.splitlines() if x.strip()][-25:]}
        rec["wall_s"] = round(time.perf_counter() - t, 1)
        results[v] = rec
        print(f"=== {v}: {json.dumps(rec)[:3000]}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"preset": a.preset, "layers": a.layers, "mb": a.mb, "seq": a.seq, "variants": results}, f, indent=1)


if __name__ == "__main__":
    main()

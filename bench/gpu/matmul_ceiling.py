"""How fast this card multiplies bf16 matrices for seconds on end, for Qwen2.5-1.5B's shapes.

    python3 bench/gpu/matmul_ceiling.py --tokens 32768 --seconds 20 [--squares 4096,8192,16384] --out $OUT/matmul-ceiling.json

Issue 4 takes ≈ 790 TFLOP/s as the H200's bf16 matrix rate. A training step multiplies for
hundreds of milliseconds without a pause, so the rate that bounds it is the one the card holds
once its clock has settled under its power limit, not the one of a short burst. Three parts, each
timed with CUDA events over windows of about one second:

1. a square n³ product for each n in ``--squares`` (default 8192) repeated for ``--seconds``: the
   rate in each window (the first window is the burst, the last ones the sustained rate);
2. one decoder layer's matrix products (q, k, v, o, gate, up, down; each as forward ``x·Wᵀ``,
   input gradient ``dy·W`` and weight gradient ``dyᵀ·x``) plus one 4,096-token chunk of the LM
   head in the same three forms, repeated for ``--seconds``: the FLOP-weighted rate per window;
3. right after, with the card as hot as in a step, each of those products alone (median of 20).

The SM clock and board power are sampled by ``nvidia-smi`` (a read-only query) every 100 ms into
``<out>.smi.csv``; each window carries its wall-clock span so the two can be joined.
"""

import argparse
import json
import statistics
import subprocess
import time

import torch

HIDDEN, INTER, KV, VOCAB = 1536, 8960, 256, 151936  # Qwen2.5-1.5B: hidden, MLP, k/v width (2 heads × 128), vocabulary


def products(tokens: int, dev: torch.device) -> list[tuple[str, float, object]]:
    """(name, FLOPs, callable) for each matrix product of one layer and one LM-head chunk."""
    linears = {
        "q": (HIDDEN, HIDDEN),
        "k": (HIDDEN, KV),
        "v": (HIDDEN, KV),
        "o": (HIDDEN, HIDDEN),
        "gate": (HIDDEN, INTER),
        "up": (HIDDEN, INTER),
        "down": (INTER, HIDDEN),
        "lm_head_chunk": (HIDDEN, VOCAB),
    }
    out = []
    for name, (k, n) in linears.items():
        m = 4096 if name == "lm_head_chunk" else tokens
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        out += [
            (f"{name}.fwd", flops, lambda x=x, w=w: x @ w.t()),
            (f"{name}.dgrad", flops, lambda dy=dy, w=w: dy @ w),
            (f"{name}.wgrad", flops, lambda dy=dy, x=x: dy.t() @ x),
        ]
    return out


def windows(fns: list, flops: float, seconds: float) -> list[dict]:
    """Repeat ``fns`` in order for ``seconds``; TFLOP/s per window of about one second."""
    res, t_end = [], time.time() + seconds
    while time.time() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, reps = time.time(), 0
        a.record()
        while True:
            for f in fns:
                f()
            reps += 1
            if reps % 4 == 0:
                torch.cuda.synchronize()
                if time.time() - t0 > 1.0:
                    break
        b.record()
        torch.cuda.synchronize()
        ms = a.elapsed_time(b)
        res.append({"t0": round(t0, 2), "t1": round(time.time(), 2), "tflops": round(reps * flops / ms / 1e9, 1)})
    return res


def median_tflops(fn, flops: float, n: int = 20) -> float:
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()  # noqa: E702
        ts.append(a.elapsed_time(b))
    return round(flops / statistics.median(ts) / 1e9, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--squares", default="8192", help="comma-separated sizes n of the n³ square products")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda:0")
    smi = subprocess.Popen(
        [
            "nvidia-smi",
            "-i",
            "0",
            "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active",
            "--format=csv,nounits",
            "-lms",
            "100",
        ],
        stdout=open(a.out + ".smi.csv", "w"),
    )
    res = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tokens": a.tokens,
        "t_start": time.time(),
    }
    time.sleep(3)  # idle clocks first
    for n in (int(v) for v in a.squares.split(",")):
        x, y = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
        res[f"square_{n}"] = windows([lambda: x @ y], 2.0 * n**3, a.seconds)
        x = y = None
        print(f"square {n}", [w["tflops"] for w in res[f"square_{n}"]], flush=True)
        time.sleep(3)
    ops = products(a.tokens, dev)
    total = sum(f for _, f, _ in ops)
    res["layer_and_head_chunk"] = windows([fn for _, _, fn in ops], total, a.seconds)
    print("layer", [w["tflops"] for w in res["layer_and_head_chunk"]], flush=True)
    res["each_hot"] = {name: median_tflops(fn, fl) for name, fl, fn in ops}
    print(json.dumps(res["each_hot"]), flush=True)
    res["t_end"] = time.time()
    time.sleep(1)
    smi.terminate()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

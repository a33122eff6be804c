"""How long the async saves' pinned staging buffers take to allocate, and what allocating them on a
thread costs the GPU work running meanwhile (issue 23, NOTES §19).

    python3 bench/gpu/staging_alloc.py --preset qwen2.5-1.5b --out $OUT/staging-alloc.json

The buffers are rayft's own (:func:`rayft.train.staging_buffers.empty_host_like`, pinned) for one
rank holding the preset's whole state: every parameter's shape three times in fp32 (weights and
AdamW's two moments), as on one GPU. Each case runs in a fresh process, since the pinned memory
stays cached by PyTorch's host allocator once freed and ``PYTORCH_CUDA_ALLOC_CONF`` is read when
CUDA starts:

- ``alone``: the allocation on the main thread, nothing else running;
- ``background``: a loop of bf16 products (20 × 8192³ then a synchronize, ~30 ms) timed for 3 s,
  then again while :class:`~rayft.train.staging_buffers.BackgroundStaging` allocates: the loop's
  mean and worst iteration during the allocation against its median before.

for two host-allocator settings: PyTorch's default (``cudaHostAlloc``) and
``pinned_use_cuda_host_register:True,pinned_num_register_threads:8`` (pages faulted in by 8
threads, then registered with ``cudaHostRegister``).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"default": "", "register8": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"}


def state_like(preset: str) -> dict:
    """Meta tensors shaped like one rank's whole training state of ``preset`` (fp32 ×3 per parameter)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.model import load_model_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(load_model_config(ModelConfig(name_or_path=preset)))
    params = {n: p.float() for n, p in model.named_parameters()}
    return {"model": params, "optim": {n: {"exp_avg": p, "exp_avg_sq": p} for n, p in params.items()}}


def case(preset: str, mode: str) -> dict:
    import torch

    from rayft.train.staging_buffers import BackgroundStaging, empty_host_like

    state = state_like(preset)
    nbytes = 3 * 4 * sum(t.numel() for t in state["model"].values())
    torch.cuda.init()
    if mode == "alone":
        t0 = time.perf_counter()
        empty_host_like(state, pin=True)
        return {"bytes": nbytes, "alloc_s": time.perf_counter() - t0}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def iteration() -> float:
        t = time.perf_counter()
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
        return time.perf_counter() - t

    for _ in range(5):
        iteration()
    before, t_end = [], time.perf_counter() + 3
    while time.perf_counter() < t_end:
        before.append(iteration())
    staging = BackgroundStaging(state)
    during = []
    while not staging.done():
        during.append(iteration())
    staging.result()
    base = statistics.median(before)
    return {
        "bytes": nbytes,
        "alloc_s": staging.finished - staging.started,
        "iteration_median_before_s": base,
        "iteration_mean_during_s": statistics.fmean(during) if during else None,
        "iteration_max_during_s": max(during, default=None),
        "iterations_during": len(during),
        "slowdown_during": statistics.fmean(during) / base if during else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", nargs=2, metavar=("SETTING", "MODE"), help=argparse.SUPPRESS)  # one child process
    args = ap.parse_args()
    if args.case:
        print(json.dumps(case(args.preset, args.case[1])))
        return
    rows = {}
    for setting, conf in SETTINGS.items():
        for mode in ("alone", "background"):
            env = dict(os.environ)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(filter(None, [env.get("PYTORCH_CUDA_ALLOC_CONF"), conf]))
            p = subprocess.run([sys.executable, __file__, "--preset", args.preset, "--out", "-", "--case", setting, mode],
                               env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
            rows[f"{setting}/{mode}"] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-2000:]}
            print(setting, mode, rows[f"{setting}/{mode}"], flush=True)
    from rayft.benchmarks.record import write_result

    write_result(args.out, f"python3 bench/gpu/staging_alloc.py --preset {args.preset}", {"settings": SETTINGS, "cases": rows})


if __name__ == "__main__":
    main()

"""The GPU's sustained bf16 matrix-product rate, measured in the call whose figures are read against it.

    python -m rayft.benchmarks.ceiling --seconds 15 --out ceiling.json [--n 8192] [--device 0]

Why: a card's datasheet rate is not what it holds for minutes. The H200 this project measures on
multiplies bf16 matrices at ~796 TFLOP/s for a 10-product burst but 610–690 TFLOP/s once its clock
has settled under its 700 W power limit (issue 23's measurements; bench/NOTES.md §9: 641–670 on
products run back to back), and where in that range depends on the card and the hour. ``rayft bench train`` runs this first, on the GPU its recipes then use, and
states every recipe's model FLOP rate as a share of what this card sustained in the same call.

What: an ``n × n`` by ``n × n`` bf16 product (default n = 8,192: large enough that the product, not
its launch, sets the time) repeated for ``seconds`` in windows of about one second, each timed with
CUDA events, after a few untimed products (cuBLAS's first-call set-up). Alongside, ``nvidia-smi``
samples that GPU's SM clock, board power, power limit and active clock-event reasons every 100 ms
(a read-only query; nothing is changed on the card). The sustained rate is the median of the
windows in the second half. The first window starts from idle clocks, but a one-second window is no
burst on a power-capped card: on the H200 the cap holds the clock down within its first second
(windows 2–15 of the first call ran at 654–663 TFLOP/s, its first at 589.6 before the warm-up
products were added, 670.0 after: NOTES §21).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

#: nvidia-smi's query fields, in the order :func:`parse_smi_line` reads them.
SMI_FIELDS = ("clocks.sm", "power.draw", "power.limit", "clocks_throttle_reasons.active")
#: The clock-event reason bit nvidia-smi sets while the board holds its clock down to stay under its
#: power limit ("SW power cap").
POWER_CAP_BIT = 0x4


class CeilingError(RuntimeError):
    """The rate could not be measured (no CUDA GPU, no window timed)."""


def sustained_tflops(windows: list[dict[str, Any]]) -> float:
    """The median TFLOP/s of the windows in the second half of the loop (the clock settled).

    Args:
        windows: ``[{"tflops": float, ...}, ...]`` in time order, as :func:`square_windows` returns.
    Raises:
        CeilingError: no window.
    """
    if not windows:
        raise CeilingError("no window was timed")
    return float(statistics.median(w["tflops"] for w in windows[len(windows) // 2 :]))


def parse_smi_line(line: str) -> dict[str, float | int | None] | None:
    """One line of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``:
    ``{"sm_mhz", "power_w", "power_limit_w", "reasons"}`` (a field nvidia-smi reports as ``[N/A]``
    is None), or None for a line that is not one (a header, an error message).

    >>> parse_smi_line("1485, 699.12, 700.00, 0x0000000000000004")
    {'sm_mhz': 1485.0, 'power_w': 699.12, 'power_limit_w': 700.0, 'reasons': 4}
    """
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != len(SMI_FIELDS):
        return None

    def num(v: str, conv):
        try:
            return conv(v)
        except ValueError:
            return None

    sm, power, limit = (num(v, float) for v in parts[:3])
    reasons = num(parts[3], lambda v: int(v, 16))
    if sm is None and power is None and reasons is None:
        return None
    return {"sm_mhz": sm, "power_w": power, "power_limit_w": limit, "reasons": reasons}


def smi_summary(samples: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """What ``nvidia-smi`` saw between ``t0`` and ``t1`` (seconds since the epoch): the median SM
    clock (MHz) and board power (W), the power limit (W), the share of samples with the power-cap
    reason set, and every reason value seen (hex strings). ``samples``: ``{"t": seconds, **parse_smi_line(...)}``."""
    span = [s for s in samples if t0 <= s["t"] <= t1]

    def median(key: str) -> float | None:
        vals = [s[key] for s in span if s.get(key) is not None]
        return float(statistics.median(vals)) if vals else None

    reasons = [s["reasons"] for s in span if s.get("reasons") is not None]
    return {
        "samples": len(span),
        "sm_mhz_median": median("sm_mhz"),
        "power_w_median": median("power_w"),
        "power_limit_w": median("power_limit_w"),
        "power_cap_share": (sum(1 for r in reasons if r & POWER_CAP_BIT) / len(reasons)) if reasons else None,
        "reasons_seen": sorted({f"0x{r:x}" for r in reasons}),
    }


class SmiSampler:
    """``nvidia-smi`` sampling one GPU every ``interval_ms`` on a thread while the block runs; each
    sample stamped with its arrival time. Without ``nvidia-smi`` it samples nothing and says why
    (``error``): the rate is still measured."""

    def __init__(self, device_index: int, interval_ms: int = 100):
        self.cmd = [
            "nvidia-smi",
            "-i",
            str(device_index),
            f"--query-gpu={','.join(SMI_FIELDS)}",
            "--format=csv,noheader,nounits",
            "-lms",
            str(interval_ms),
        ]
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> SmiSampler:
        if shutil.which("nvidia-smi") is None:
            self.error = "nvidia-smi is not on PATH: no clock or power samples"
            return self
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            s = parse_smi_line(line)
            if s is not None:
                self.samples.append({"t": time.time(), **s})

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.thread is not None:
                self.thread.join(timeout=5)
            if not self.samples:
                self.error = f"nvidia-smi gave no sample (exit {self.proc.returncode})"


def square_windows(n: int, seconds: float, device) -> list[dict[str, Any]]:
    """``n × n`` bf16 products on ``device`` for ``seconds``, timed in windows of about one second:
    ``[{"t0": s, "t1": s, "tflops": float}, ...]`` (epoch seconds; TFLOP/s = 2n³ × products ÷ time)."""
    import torch

    x, y = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):  # untimed: cuBLAS's first-call set-up (without them the first call's first window ran at 589.6, the rest 654-663)
        x @ y
    torch.cuda.synchronize(device)
    flops, res, t_end = 2.0 * n**3, [], time.time() + seconds
    while time.time() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, reps = time.time(), 0
        start.record()
        while True:
            for _ in range(4):
                x @ y
            reps += 4
            torch.cuda.synchronize(device)
            if time.time() - t0 > 1.0:
                break
        stop.record()
        torch.cuda.synchronize(device)
        res.append({"t0": round(t0, 3), "t1": round(time.time(), 3), "tflops": round(reps * flops / start.elapsed_time(stop) / 1e9, 1)})
    return res


def measure(seconds: float = 15.0, n: int = 8192, device_index: int = 0) -> dict[str, Any]:
    """The first-window and sustained bf16 matrix rates of one GPU, with what ``nvidia-smi`` saw meanwhile.

    Returns:
        ``{"gpu", "n", "seconds", "first_window_tflops", "sustained_tflops", "windows", "smi",
        "smi_error", "torch", "cuda"}``; ``smi``: :func:`smi_summary` over the sustained half.
    Raises:
        CeilingError: no CUDA GPU, or ``seconds`` too short for one window.
    """
    import torch

    if not torch.cuda.is_available():
        raise CeilingError("no CUDA GPU: the matrix rate is measured on GPUs only")
    if seconds < 2:
        raise CeilingError(f"--seconds {seconds:g}: at least 2 (windows of one second, the second half is the sustained rate)")
    device = torch.device("cuda", device_index)
    with SmiSampler(device_index) as smi:
        windows = square_windows(n, seconds, device)
    sustained = sustained_tflops(windows)
    half = windows[len(windows) // 2 :]
    return {
        "gpu": torch.cuda.get_device_name(device),
        "n": n,
        "seconds": seconds,
        "first_window_tflops": windows[0]["tflops"],
        "sustained_tflops": sustained,
        "windows": windows,
        "smi": smi_summary(smi.samples, half[0]["t0"], half[-1]["t1"]),
        "smi_error": smi.error,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def share_of_ceiling(tokens_per_s_per_gpu: float | None, flops_per_token: float | None, ceiling: dict[str, Any] | None) -> float | None:
    """A run's model FLOP rate (tokens/s/GPU × training FLOPs per token) as a fraction of the
    measured sustained rate: MFU's formula (:func:`rayft.train.metrics.mfu`) with that rate as the
    peak; None when any of the three is unknown (CPU runs, a failed measurement)."""
    from rayft.train.metrics import mfu

    sustained = (ceiling or {}).get("sustained_tflops")
    if not sustained or not tokens_per_s_per_gpu or not flops_per_token:
        return None
    return mfu(tokens_per_s_per_gpu, flops_per_token, sustained * 1e12)


def describe(ceiling: dict[str, Any]) -> str:
    """One sentence for a results table: what was measured, or why not (``status`` other than ``ok``)."""
    if ceiling.get("status") != "ok":
        why = ceiling.get("reason") or (ceiling.get("error") or "").strip().split("\n")[0] or "no reason recorded"
        return f"This GPU's matrix rate was not measured in this call: {why}."
    smi = ceiling.get("smi") or {}
    parts = []  # a field nvidia-smi did not report ([N/A]) is left out
    if smi.get("sm_mhz_median") is not None:
        parts.append(f"SM clock {smi['sm_mhz_median']:,.0f} MHz")
    if smi.get("power_w_median") is not None:
        parts.append(f"{smi['power_w_median']:.0f} W" + (f" of {smi['power_limit_w']:.0f} W" if smi.get("power_limit_w") else ""))
    if smi.get("power_cap_share") is not None:
        parts.append(f"power cap in {100 * smi['power_cap_share']:.0f}% of samples")
    if ceiling.get("smi_error"):
        parts.append(ceiling["smi_error"])
    seen = "; " + ", ".join(parts) if parts else ""
    first = ceiling.get("first_window_tflops", ceiling.get("burst_tflops"))  # the key's name before 2026-12-03
    return (
        f"This GPU's sustained bf16 matrix rate in this call: {ceiling['sustained_tflops']:,.1f} TFLOP/s "
        f"({ceiling['n']}² products for {ceiling['seconds']:g} s, median of the second half; first second "
        f"{first:,.1f}{seen})."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rayft.benchmarks.ceiling", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="how long the products run (default 15)")
    ap.add_argument("--n", type=int, default=8192, help="the square matrices' size (default 8192)")
    ap.add_argument("--device", type=int, default=0, help="the CUDA device index (default 0)")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    a = ap.parse_args(argv)
    try:
        res = measure(a.seconds, a.n, a.device)
    except CeilingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    smi = res["smi"]
    clock = "".join(
        f", {fmt.format(smi[k])}"
        for k, fmt in (("sm_mhz_median", "SM clock {:.0f} MHz"), ("power_w_median", "{:.0f} W"))
        if smi.get(k) is not None
    )
    print(
        f"{res['gpu']}: {res['sustained_tflops']:.1f} TFLOP/s sustained (first second {res['first_window_tflops']:.1f}){clock}", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a profiled step's GPU time goes, by kernel category, from torch.profiler Chrome traces.

    python -m rayft.benchmarks.trace_kernels LABEL=TRACE [LABEL=TRACE ...] [--top 12]

``TRACE``: a ``.json`` or ``.json.gz`` trace as torch.profiler exports it (rayft's
``train.profile_steps`` writes ``RUN/profile/rank<N>.trace.json.gz``; torchtitan's
``--profiling.enable_profiling`` writes ``profile_traces/iteration_<N>/rank<N>_trace.json``).
Prints a Markdown table of milliseconds per step per category for every trace side by side, the
GPU's busy share of the traced steps and its idle milliseconds per step, the CPU's CUDA runtime and
driver calls per step (launches, copies, syncs: what a step costs the CPU to issue), and each
trace's largest kernels.

Only the GPU's own events count (``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``; ``ts`` and
``dur`` in microseconds), inside the steps' GPU-side ``ProfilerStep#N`` ranges where the trace has
them; steps are the trace's ``ProfilerStep#N`` names (1 when it has none).
Categories are read from kernel names (:data:`CATEGORIES`, first match wins); what matches none is
``other``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

#: (category, pattern on the kernel's name), tried in order
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("collectives (NCCL)", r"nccl"),
    ("attention", r"flash|fmha|attn|attention"),
    ("matmul (cuBLAS/CUTLASS)", r"gemm|nvjet|cutlass|xmma|cublas|splitk|Kernel2"),
    ("optimizer (foreach/fused)", r"multi_tensor|adam|foreach|fused_optim"),
    ("Inductor (Triton)", r"^triton_"),  # before liger's: Inductor names its kernels after the ops they fuse
    ("liger kernels", r"liger|_rms_norm_|_swiglu_|_geglu_|_rope_|_cross_entropy_kernel|element_mul_kernel"),
    ("copies, casts, fills", r"memcpy|memset|copy|cast|CatArray|fill|direct_copy|to_copy|chunk_cat|split_with_sizes"),
    ("elementwise/reduce (eager)", r"elementwise|vectorized|reduce_kernel|reduction"),
)


@dataclass
class TraceSummary:
    """One trace's GPU time: ``ms_per_step`` by category, ``steps``, ``span_ms`` (the traced steps'
    GPU-side length, all steps), ``busy_ms`` (the union of kernel intervals in it), ``runtime_calls``
    (CUDA runtime and driver calls from the CPU: launches, copies, syncs; whole trace), ``top``:
    (name, ms per step, calls per step) of the largest kernels (:func:`summarize`)."""

    steps: int
    ms_per_step: dict[str, float]
    span_ms: float
    busy_ms: float
    runtime_calls: int = 0
    top: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def kernel_ms_per_step(self) -> float:
        return sum(self.ms_per_step.values())

    @property
    def idle_ms_per_step(self) -> float:
        return (self.span_ms - self.busy_ms) / self.steps

    @property
    def busy_share(self) -> float:
        return self.busy_ms / self.span_ms if self.span_ms else 0.0


def category(name: str) -> str:
    """The :data:`CATEGORIES` label of a GPU event's name (``other`` when none matches)."""
    for label, pattern in CATEGORIES:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def load_events(path: str | Path) -> list[dict]:
    """The trace's ``traceEvents`` (a list of dicts).

    Raises:
        ValueError: the file holds JSON that is not a trace. (OSError, gzip.BadGzipFile and
            json.JSONDecodeError pass through for a missing, damaged or non-JSON file.)
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        doc = json.load(f)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{p}: no traceEvents list: not a torch.profiler Chrome trace")
    return events


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals, in their unit."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def step_ranges(events: list[dict]) -> list[tuple[float, float, str]]:
    """The steps' GPU-side ranges ``(start µs, end µs, "ProfilerStep#N")`` (``gpu_user_annotation``;
    Kineto writes one per stream a step ran on); empty for a trace without them."""
    return [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"])
        for e in events
        if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]


def step_of(event: dict, ranges: list[tuple[float, float, str]]) -> str | None:
    """The name of the step range ``event`` starts in (None: in none)."""
    return next((n for a, b, n in ranges if a <= float(event["ts"]) < b), None)


def gpu_events(events: list[dict], ranges: list[tuple[float, float, str]]) -> list[dict]:
    """The GPU's own events (:data:`GPU_CATS`) by start time, only those inside ``ranges`` when there are any."""
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: float(e["ts"]))
    return [e for e in gpu if step_of(e, ranges) is not None] if ranges else gpu


def summarize(events: list[dict], top: int = 12) -> TraceSummary:
    """GPU time per step of a trace's events (``ts``/``dur`` in µs; the summary in ms).

    Steps: the distinct ``ProfilerStep#N`` names (1 when there are none). Where the trace has the
    steps' GPU-side ranges (``gpu_user_annotation`` ``ProfilerStep#N``: first to last kernel of
    each step), only the GPU events inside them count, and the span is their total length: what
    ran between two traced steps (the next batch's copies, an evaluation, a checkpoint) stays out.
    Without them, every GPU event counts and the span runs from the first to the last. Kineto
    draws a step's GPU range from the kernels launched directly under the step's annotation: a step
    whose first or last kernels come from a nested ``record_function`` (an FSDP hook's, say) may
    have a shorter range, and those kernels then fall outside it.
    """
    steps = len({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}) or 1
    named = step_ranges(events)
    ranges = [(a, b) for a, b, _ in named]
    gpu = gpu_events(events, named)
    by_cat: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in gpu:
        us, label = float(e.get("dur", 0.0)), category(e["name"])
        by_cat[label] = by_cat.get(label, 0.0) + us
        by_name.setdefault(e["name"], []).append(us)
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in gpu]
    if ranges:
        span = _union_us(ranges)
    else:
        span = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
    largest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return TraceSummary(
        steps=steps,
        ms_per_step={k: v / 1000 / steps for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        span_ms=span / 1000,
        busy_ms=_union_us(spans) / 1000,  # kernels on several streams overlap
        top=[(name, sum(d) / 1000 / steps, len(d) / steps) for name, d in largest],
        # launches through the runtime (cudaLaunchKernel, copies, syncs) and the driver (cuLaunchKernel: Triton's)
        runtime_calls=sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")),
    )


def table(summaries: dict[str, TraceSummary]) -> str:
    """Markdown: categories as rows, traces as columns (ms per step), then the totals."""
    labels = list(summaries)
    cats = sorted(
        {c for s in summaries.values() for c in s.ms_per_step}, key=lambda c: -max(s.ms_per_step.get(c, 0) for s in summaries.values())
    )
    lines = ["| GPU time per step (ms) | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for c in cats:
        lines.append(f"| {c} | " + " | ".join(f"{summaries[k].ms_per_step.get(c, 0.0):.1f}" for k in labels) + " |")
    lines.append("| **all kernels** | " + " | ".join(f"**{summaries[k].kernel_ms_per_step:.1f}**" for k in labels) + " |")
    lines.append("| GPU busy share of the traced steps | " + " | ".join(f"{100 * summaries[k].busy_share:.1f}%" for k in labels) + " |")
    lines.append(
        "| GPU idle within the traced steps, ms per step | " + " | ".join(f"{summaries[k].idle_ms_per_step:.1f}" for k in labels) + " |"
    )
    lines.append(
        "| CUDA runtime and driver calls per step (CPU) | "
        + " | ".join(f"{summaries[k].runtime_calls / summaries[k].steps:,.0f}" for k in labels)
        + " |"
    )
    lines.append("| steps traced | " + " | ".join(str(summaries[k].steps) for k in labels) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", metavar="LABEL=TRACE")
    ap.add_argument("--top", type=int, default=12, help="largest kernels listed per trace")
    a = ap.parse_args(argv)
    summaries = {}
    for item in a.traces:
        label, sep, path = item.partition("=")
        if not sep:
            ap.error(f"{item}: give LABEL=TRACE")
        summaries[label] = summarize(load_events(path), a.top)
    print(table(summaries))
    for label, s in summaries.items():
        print(f"\n{label}: largest kernels (ms per step, calls per step)")
        for name, ms, calls in s.top:
            print(f"  {ms:8.2f} ms  {calls:6.1f}×  [{category(name)}]  {name[:110]}")


if __name__ == "__main__":
    main()

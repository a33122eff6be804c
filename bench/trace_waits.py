"""Where a profiled step's GPU waits, from a torch.profiler Chrome trace (bench/NOTES.md §24).

    python bench/trace_waits.py TRACE [TRACE ...]

For each trace, within the steps' GPU-side ``ProfilerStep#N`` ranges (whole trace without them):
the GPU's idle gaps between kernels by length; the largest gaps with the CPU operators that were
launching the kernel after each (the launch found through the trace's ``correlation`` ids); and
every host synchronisation (``cuda*Synchronize``, a blocking copy's included) with how long the
CPU waited, the operators it was called from, and the GPU's gap after it (for a sync at a step's
end, that gap is the time between two steps, not idle time inside one). Times in ms.
"""

from __future__ import annotations

import sys
from collections import defaultdict

from rayft.benchmarks.trace_kernels import gpu_events, load_events, step_of, step_ranges

BUCKETS = ((10, "< 10 µs"), (50, "10–50 µs"), (200, "50–200 µs"), (1000, "0.2–1 ms"), (float("inf"), "> 1 ms"))


def cpu_stacks(events: list[dict]) -> dict[int, list[dict]]:
    """CPU-side events (operators, annotations) per thread, by start time."""
    by_tid: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            by_tid[e["tid"]].append(e)
    for es in by_tid.values():
        es.sort(key=lambda e: e["ts"])
    return by_tid


def stack_at(by_tid: dict[int, list[dict]], tid: int, ts: float, depth: int = 5) -> str:
    inside = [e["name"][:45] for e in by_tid.get(tid, []) if e["ts"] <= ts <= e["ts"] + e["dur"]]
    return " > ".join(inside[-depth:]) or "(no operator)"


def report(path: str) -> None:
    ev = load_events(path)
    ranges = step_ranges(ev)
    steps = max(len({n for _, _, n in ranges}), 1)
    gpu = gpu_events(ev, ranges)
    if not gpu:
        print(f"\n{path}\n  no GPU events in the traced steps")
        return
    launches = {
        e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    by_tid = cpu_stacks(ev)
    gaps, end, prev_step = [], gpu[0]["ts"] + gpu[0]["dur"], step_of(gpu[0], ranges)
    for e in gpu[1:]:  # between kernels of the same step only
        s = step_of(e, ranges)
        if e["ts"] > end and s == prev_step:
            gaps.append((e["ts"] - end, e))
        end, prev_step = (max(end, e["ts"] + e["dur"]) if s == prev_step else e["ts"] + e["dur"]), s
    print(f"\n{path}\n  {steps} step(s); GPU idle gaps inside them, per step:")
    lo = 0.0
    for hi, label in BUCKETS:
        sel = [d for d, _ in gaps if lo <= d < hi]
        print(f"    {label:10s} {len(sel) / steps:8.1f} gaps  {sum(sel) / 1000 / steps:6.2f} ms")
        lo = hi
    print("  largest gaps (ms), and what the CPU was in when it launched the kernel after:")
    for d, e in sorted(gaps, key=lambda g: -g[0])[:10]:
        launch = launches.get(e.get("args", {}).get("correlation"))
        where = stack_at(by_tid, launch["tid"], launch["ts"]) if launch else "(launch not in trace)"
        print(f"    {d / 1000:6.2f}  before {e['name'][:40]:40s}  launched in: {where}")
    print("  host synchronisations (CPU wait ms, GPU gap after ms, called from):")
    first = gpu[0]["ts"] if gpu else 0
    last = max(e["ts"] + e["dur"] for e in gpu) if gpu else 0
    starts = [e["ts"] for e in gpu]
    for e in sorted((x for x in ev if x.get("cat") == "cuda_runtime" and "Synchronize" in x.get("name", "")), key=lambda x: x["ts"]):
        done = e["ts"] + e["dur"]
        if not first <= done <= last:
            continue
        nxt = next((t for t in starts if t >= done), None)
        gap = (nxt - done) / 1000 if nxt is not None else float("nan")
        print(f"    {e['name'][:21]:21s} {e['dur'] / 1000:7.2f}  {gap:6.2f}  {stack_at(by_tid, e['tid'], e['ts'])}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)

"""`rayft bench train`: the same model, data and GPUs trained by several recipes, side by side.

Recipes (docs/bench-train.md says what each one is):

* ``sample-recipe``: the AWS sample's training function (FSDP1, bf16 weights and AdamW, padded rows),
  :mod:`rayft.benchmarks.recipes`;
* ``trl-default``: TRL ``SFTTrainer`` + FSDP with its defaults (padding per batch), under ``torchrun``;
* ``trl-best``: the same with TRL's packing (padding-free) and liger-kernel;
* ``rayft``: ``python -m rayft.cli train`` with ``train.compile=true``, ``train.cross_entropy=auto``,
  ``model.attn_implementation=auto``, ``data.packing=true`` (the user's ``--set`` still wins, then
  ``--rayft-set``, which only the rayft recipes get: e.g. their own micro-batch size);
* ``rayft-fp8`` (not in the default list): ``rayft`` plus ``train.float8=true``, reported as its own
  row; when both ran on a workload, the results carry ``float8_check``, its per-step loss against
  ``rayft``'s (same data order and initial weights);
* ``torchtitan`` / ``torchtitan-fp8`` (by name; GPU only; ``pip install torchtitan==0.2.2``):
  torchtitan's own trainer on the same rows, padded one per row, compiled, with its own seeded init
  of the same architecture (the presets with a torchtitan flavour), under ``torchrun``,
  :mod:`rayft.benchmarks.torchtitan_recipe`;
* ``llamafactory`` (by name; ``pip install llamafactory==0.9.5``): LLaMA-Factory's SFT stage (full
  fine-tuning) launched on Ray by LLaMA-Factory, with its neat packing of the same rows and
  liger-kernel, :mod:`rayft.benchmarks.llamafactory_recipe`.

Workloads: ``random`` (random full-length rows, :func:`rayft.data.synthetic.random_dataset`; every
recipe gets the same ids) and ``real`` (the config's data files, tokenized once by rayft's pipeline
and given to every recipe as the same token ids; only non-padding tokens count).

Each recipe × workload runs in a fresh subprocess with a time limit; a failure is recorded with
the tail of its log and the others go on. Figures per run (steps after ``warmup_steps``):

* tokens/s/GPU: median over steps of (global non-padding tokens ÷ step wall time ÷ GPUs);
* MFU: :func:`rayft.train.metrics.mfu` with :func:`~rayft.train.metrics.flops_per_token` of the
  model's matmul parameters and the measured attention span Σ len² / Σ len;
* peak GPU memory (GiB, max over ranks and steps); step time p10 / p50 / p90 (s);
* cost per 1M trained tokens (USD) = (instance On-Demand USD/hour ÷ its GPUs) ÷ (tokens/s/GPU ×
  3600) × 1e6, the instance being the one carrying the detected GPU model (:data:`GPU_INSTANCE`),
  its price and date from :mod:`rayft.cluster.instances`' catalog.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shlex
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console
from rich.text import Text

from rayft.benchmarks import ceiling as gpu_ceiling
from rayft.benchmarks.fabric import gpu_label
from rayft.benchmarks.logged_run import LoggedCommand, log_tail, run_logged
from rayft.benchmarks.torchtitan_recipe import (
    TORCHTITAN_RECIPES,
    TorchtitanRecipeError,
    check_preset_shape,
    profiling_args,
    torchtitan_model,
)

RECIPES = ("sample-recipe", "trl-default", "trl-best", "rayft", "rayft-fp8", "torchtitan", "torchtitan-fp8", "llamafactory")
#: What ``--recipes`` defaults to (``rayft-fp8``, the torchtitan recipes, which need
#: ``pip install torchtitan==0.2.2``, and ``llamafactory`` are asked for by name).
DEFAULT_RECIPES = ("sample-recipe", "trl-default", "trl-best", "rayft")
RAYFT_RECIPES = ("rayft", "rayft-fp8")
WORKLOADS = ("random", "real")
DEFAULT_STEPS = 30
DEFAULT_WARMUP = 5
#: Seconds of bf16 products that measure the GPU's sustained matrix rate before the recipes run
#: (:mod:`rayft.benchmarks.ceiling`); 0 skips it.
DEFAULT_CEILING_S = 15.0

#: GPU model (as in ``torch.cuda.get_device_name``, whole word) → the EC2 instance whose price is used.
GPU_INSTANCE = {
    "H200": "p5en.48xlarge",
    "H100": "p5.48xlarge",
    "A100": "p4d.24xlarge",
    "L4": "g6.12xlarge",
    "L40S": "g6e.12xlarge",
    "A10G": "g5.12xlarge",
    "T4": "g4dn.12xlarge",
    "B200": "p6-b200.48xlarge",
}

#: Config keys the benchmark sets on the rayft recipes itself (after the user's): ``--rayft-set``
#: refuses them rather than have them silently overridden.
BENCH_FIXED = (
    "train.max_steps",
    "train.warmup_steps",
    "train.num_workers",
    "train.grad_accum_steps",
    "train.eval_every",
    "train.float8",
    "data.synthetic",
    "data.train_files",
    "data.validation_files",
    "data.validation_fraction",
    "checkpoint",
    "ray.max_failures",
)

# Settings each recipe adds to the user's config (before the user's --set, which win).
RAYFT_BEST = ["train.compile=true", "train.cross_entropy=auto", "model.attn_implementation=auto", "data.packing=true"]


NOT_RUN = "not run"
SKIPPED = "skipped: no time left"
#: Seconds kept free before ``--deadline-s`` (writing the results), and the least a run is started with.
DEADLINE_MARGIN_S = 10.0
MIN_RUN_S = 30.0


class BenchTrainError(RuntimeError):
    """The benchmark cannot start (bad arguments or config); single runs fail without it."""


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C: the results of the runs done so far were written (the others "not run").
    A ``KeyboardInterrupt`` so that no per-run ``except Exception`` records it as a run failure."""


#: The clock of ``--deadline-s`` (tests replace it).
_clock = time.monotonic


Timeouts = float | dict[str, float] | None


def parse_timeouts(text: str | None) -> Timeouts:
    """``--timeout-s``: seconds for every run (``300``), or per recipe (``rayft=200,trl-default=120``;
    a recipe not named has no limit but the deadline).

    Raises:
        BenchTrainError: not a finite number, an unknown recipe, or a limit <= 0.
    """
    if text is None or not text.strip():
        return None

    def seconds(v: str, what: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise BenchTrainError(f"--timeout-s {what}: {v!r} is not a number of seconds") from None
        if not math.isfinite(x):
            raise BenchTrainError(f"--timeout-s {what}: {v!r} is not a finite number of seconds")
        if x <= 0:
            raise BenchTrainError(f"--timeout-s {what}: {v} must be > 0")
        return x

    if "=" not in text:
        return seconds(text.strip(), "")
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, v = part.partition("=")
        if not sep or name.strip() not in RECIPES:
            raise BenchTrainError(f"--timeout-s: {part!r} is not RECIPE=SECONDS with RECIPE one of {', '.join(RECIPES)}")
        out[name.strip()] = seconds(v.strip(), name.strip())
    return out


def format_timeouts(t: Timeouts) -> str:
    if isinstance(t, dict):
        return ",".join(f"{k}={v:g}" for k, v in t.items())
    return "" if t is None else f"{t:g}"


def run_timeout(t: Timeouts, recipe: str) -> float | None:
    """The per-run cap of ``recipe`` (None: none)."""
    return t.get(recipe) if isinstance(t, dict) else t


# ------------------------------------------------------------------------------ figures


def merge_ranks(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-rank step records → global ones: tokens and Σ len² summed, step time and peak memory the
    max over ranks, loss the mean of the ranks' losses (where logged; not weighted by their tokens). Where every rank logged ``report_s``
    (the sample recipe's per-step ``ray.train.report``), ``report_s`` is its max over ranks and
    ``step_time_excl_report_s`` the max over ranks of step time less report time. Only steps every
    rank logged are kept."""
    by_step: dict[int, list[dict]] = {}
    for recs in per_rank:
        for r in recs:
            by_step.setdefault(int(r["step"]), []).append(r)
    out = []
    for step in sorted(by_step):
        rs = by_step[step]
        if len(rs) != len(per_rank):
            continue
        peaks = [r["peak_mem_gib"] for r in rs if r.get("peak_mem_gib") is not None]
        rec = {
            "step": step,
            "step_time_s": max(r["step_time_s"] for r in rs),
            "tokens": sum(r["tokens"] for r in rs),
            "attn_tokens_sq": sum(r["attn_tokens_sq"] for r in rs),
            "peak_mem_gib": max(peaks) if peaks else None,
        }
        if all(r.get("loss") is not None for r in rs):
            rec["loss"] = sum(r["loss"] for r in rs) / len(rs)
        if all(r.get("report_s") is not None for r in rs):
            rec["report_s"] = max(r["report_s"] for r in rs)
            rec["step_time_excl_report_s"] = max(r["step_time_s"] - r["report_s"] for r in rs)
        out.append(rec)
    return out


def read_step_files(run_dir: Path) -> list[dict[str, Any]]:
    """The merged records of a recipe run's ``steps.rank*.jsonl``.

    Raises:
        BenchTrainError: no step file.
    """
    files = sorted(run_dir.glob("steps.rank*.jsonl"))
    if not files:
        raise BenchTrainError(f"{run_dir}: no steps.rank*.jsonl written")
    return merge_ranks([[json.loads(x) for x in f.read_text().splitlines() if x.strip()] for f in files])


def rayft_records(metrics_file: Path) -> list[dict[str, Any]]:
    """A ``rayft_metrics.jsonl`` (global figures per step) as step records (with the one-off
    ``setup_s`` / ``setup_model_build_s`` of the first step where the run reported them)."""
    rows = [json.loads(x) for x in metrics_file.read_text().splitlines() if x.strip()]
    out = []
    for r in rows:
        rec = {
            "step": r["step"],
            "step_time_s": r["step_time_s"],
            "tokens": r["tokens"],
            "attn_tokens_sq": r.get("attn_tokens_sq"),
            "peak_mem_gib": r.get("peak_mem_gib"),
            "loss": r.get("loss"),
        }
        rec.update({k.removeprefix("time_"): r[k] for k in ("time_setup_s", "time_setup_model_build_s") if k in r})
        out.append(rec)
    return out


def float8_check(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload where both ``rayft`` and ``rayft-fp8`` ran: the float8 run's loss against the
    bf16 run's, step by step (same data order and initial weights).

    Returns:
        ``{workload: {"steps", "loss_bf16", "loss_fp8" (per step), "max_abs_diff", "max_rel_diff",
        "final_rel_diff"}}``; empty when no workload has both.
    """
    out: dict[str, Any] = {}
    for w in WORKLOADS:
        got = {r["recipe"]: r for r in runs if r["workload"] == w and r.get("status") == "ok" and r["recipe"] in RAYFT_RECIPES}
        if len(got) < 2:
            continue
        a = {s["step"]: s.get("loss") for s in got["rayft"]["steps"]}
        b = {s["step"]: s.get("loss") for s in got["rayft-fp8"]["steps"]}
        steps = sorted(k for k in a.keys() & b.keys() if a[k] is not None and b[k] is not None)
        if not steps:
            continue
        rel = [abs(b[k] - a[k]) / abs(a[k]) for k in steps]
        out[w] = {
            "steps": steps,
            "loss_bf16": [a[k] for k in steps],
            "loss_fp8": [b[k] for k in steps],
            "max_abs_diff": max(abs(b[k] - a[k]) for k in steps),
            "max_rel_diff": max(rel),
            "final_rel_diff": rel[-1],
        }
    return out


def summarize(
    records: list[dict[str, Any]], warmup_steps: int, world: int, flops_fn: Callable[[float], float] | None, peak_flops: float | None
) -> dict[str, Any]:
    """Figures of one run from its global step records (``step`` counted from 1).

    Args:
        warmup_steps: leading steps left out.
        world: GPUs (workers) of the run.
        flops_fn: training FLOPs per token as a function of the attention span (tokens).
        peak_flops: the GPU's dense bf16 peak, FLOP/s (None: no MFU).

    Returns:
        tokens/s/GPU (median), ``tokens_per_s_per_gpu_window`` (the measured steps as a whole:
        their tokens ÷ their summed step time ÷ ``world``; a slow step, such as a recompilation,
        counts in full here where the median leaves it out), MFU, peak memory, step-time
        percentiles; ``excluding_report``
        (tokens/s/GPU and MFU over step time less ``ray.train.report`` time, and the median report
        seconds) when every measured step has ``step_time_excl_report_s``.
    Raises:
        BenchTrainError: no step after the warm-up.
    """
    from rayft.train.metrics import mfu

    steady = [r for r in records if r["step"] > warmup_steps]
    if not steady:
        raise BenchTrainError(f"{len(records)} steps logged, none after the {warmup_steps} warm-up steps")
    rates = [r["tokens"] / r["step_time_s"] / world for r in steady]
    times = [r["step_time_s"] for r in steady]
    tps = statistics.median(rates)
    tokens = sum(r["tokens"] for r in steady)
    sq = [r["attn_tokens_sq"] for r in steady]
    span = sum(sq) / tokens if tokens and all(s is not None for s in sq) else None
    fpt = flops_fn(span) if flops_fn is not None and span is not None else None
    peaks = [r["peak_mem_gib"] for r in records if r.get("peak_mem_gib") is not None]
    p10, p50, p90 = np.percentile(times, [10, 50, 90])  # linear interpolation
    excl = None
    if all(r.get("step_time_excl_report_s") for r in steady):
        tps_ex = statistics.median(r["tokens"] / r["step_time_excl_report_s"] / world for r in steady)
        excl = {
            "tokens_per_s_per_gpu": tps_ex,
            "mfu": mfu(tps_ex, fpt, peak_flops) if fpt else None,
            "report_s_median": statistics.median(r["report_s"] for r in steady),
        }
    return {
        "steps_logged": len(records),
        "steps_measured": len(steady),
        "tokens_per_s_per_gpu": tps,
        "tokens_per_s_per_gpu_window": window_rate(steady, world),
        "tokens_per_step_median": statistics.median(r["tokens"] for r in steady),
        "attn_span_tokens": span,
        "flops_per_token": fpt,
        "mfu": mfu(tps, fpt, peak_flops) if fpt else None,
        "peak_mem_gib": max(peaks) if peaks else None,
        "step_time_s": {"p10": float(p10), "p50": float(p50), "p90": float(p90), "min": min(times), "max": max(times)},
        **({"excluding_report": excl} if excl else {}),
    }


def window_rate(steps: list[dict[str, Any]], world: int) -> float:
    """Tokens/s/GPU over ``steps`` as a whole: Σ tokens ÷ Σ step_time_s ÷ ``world``.

    Raises:
        ValueError: a step whose ``step_time_s`` is not a positive finite number, or whose
            ``tokens`` is not a finite number >= 0.
    """
    for r in steps:
        t, n = r["step_time_s"], r["tokens"]
        if not finite_number(t) or not t > 0:
            raise ValueError(f"step {r.get('step')}: step_time_s must be a positive number of seconds, got {t!r}")
        if not finite_number(n) or n < 0:
            raise ValueError(f"step {r.get('step')}: tokens must be a number >= 0, got {n!r}")
    return sum(r["tokens"] for r in steps) / sum(r["step_time_s"] for r in steps) / world


def finite_number(v: Any) -> bool:
    """A real number (not a bool) that is finite, ints beyond float's range included as not."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond float's range
        return False


def run_window_rate(run: dict[str, Any], warmup_steps: int | None, world: int | None) -> float | None:
    """A run's whole-window rate: stored by :func:`summarize`, else (results files written before
    it) computed from the run's step records after ``warmup_steps``; None without step records, or
    when the file does not say ``warmup_steps`` or ``world``.

    Raises:
        ValueError: a stored rate that is not a positive finite number, ``warmup_steps`` not an
            integer >= 0, ``world`` not an integer >= 1, or a malformed step record (:func:`window_rate`).
    """
    stored = run.get("tokens_per_s_per_gpu_window")
    if stored is not None:
        if not finite_number(stored) or stored <= 0:
            raise ValueError(f"tokens_per_s_per_gpu_window must be a positive number, got {stored!r}")
        return float(stored)
    if warmup_steps is None or world is None:
        return None
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"figures.warmup_steps must be an integer >= 0, got {warmup_steps!r}")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"figures.world_size must be an integer >= 1, got {world!r}")
    steady = [r for r in run.get("steps") or [] if r["step"] > warmup_steps]
    return window_rate(steady, world) if steady else None


def gpu_price(gpu_model: str | None, instance: str | None = None, usd_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """The per-GPU On-Demand price used for cost, with where it comes from.

    ``usd_per_gpu_hour`` (given by the user) wins; else the catalog price of ``instance`` (default:
    :data:`GPU_INSTANCE` of the GPU model) ÷ its GPU count.

    Returns:
        ``instance``, ``instance_usd_per_hour``, ``gpus_per_instance``, ``usd_per_gpu_hour`` (None when
        unknown), ``source``, ``date``, ``note``.
    """
    from rayft.cluster.instances import UnknownInstanceTypeError, get_instance

    if usd_per_gpu_hour is not None:
        return {
            "instance": instance,
            "instance_usd_per_hour": None,
            "gpus_per_instance": None,
            "usd_per_gpu_hour": usd_per_gpu_hour,
            "source": "given on the command line (--usd-per-gpu-hour)",
            "date": dt.date.today().isoformat(),
            "note": None,
        }
    if instance is None:
        instance = next((inst for key, inst in GPU_INSTANCE.items() if re.search(rf"\b{key}\b", gpu_model or "")), None)
    none = {
        "instance": instance,
        "instance_usd_per_hour": None,
        "gpus_per_instance": None,
        "usd_per_gpu_hour": None,
        "source": None,
        "date": None,
    }
    if instance is None:
        return {**none, "note": f"no instance mapped to GPU {gpu_model!r} (GPU_INSTANCE); give --instance or --usd-per-gpu-hour"}
    try:
        it = get_instance(instance)
    except UnknownInstanceTypeError as e:
        return {**none, "note": str(e)}
    src = it.sources.get("on_demand_usd_per_hour")
    base = {**none, "gpus_per_instance": it.gpu_count, "source": src.source if src else None, "date": src.date if src else None}
    if it.on_demand_usd_per_hour is None:
        return {**base, "note": f"the catalog has no On-Demand price for {instance}; give --usd-per-gpu-hour"}
    return {
        **base,
        "instance_usd_per_hour": it.on_demand_usd_per_hour,
        "usd_per_gpu_hour": it.on_demand_usd_per_hour / it.gpu_count,
        "note": None,
    }


def usd_per_million_tokens(usd_per_gpu_hour: float | None, tokens_per_s_per_gpu: float | None) -> float | None:
    """USD per 1,000,000 trained (non-padding) tokens: price per GPU-hour ÷ tokens per GPU-hour × 1e6."""
    if not usd_per_gpu_hour or not tokens_per_s_per_gpu:
        return None
    return usd_per_gpu_hour / (tokens_per_s_per_gpu * 3600.0) * 1e6


# ------------------------------------------------------------------------------ table and chart


def _fmt(v: Any, spec: str, none: str = "—") -> str:
    return none if v is None else format(v, spec)


def status_text(status: str, error: str | None) -> str:
    """A run's status for a table: ``failed`` gets the first line of its error (80 characters at most)."""
    return f"failed: {error.splitlines()[0][:80]}" if status == "failed" and error else status


def _run_lines(r: dict[str, Any], fig: dict[str, Any]) -> tuple[str, str | None, tuple[str, str, float] | None, str | None]:
    """One run's table row, settings line, whole-window rate and report-free line (None where absent).

    Raises:
        KeyError: a field the row needs is missing (``recipe``, ``workload``, ``status``, ...).
        ValueError, TypeError, AttributeError, IndexError: a field of the wrong kind or value
            (e.g. :func:`run_window_rate`'s checks, a number that is not one).
    """
    recipe, workload, status = (_text(r, k) for k in ("recipe", "workload", "status"))
    name = _text(r, "label") if r.get("label") else recipe
    mb = r.get("micro_batch_size", fig.get("micro_batch_size"))
    st = r.get("settings")
    settings = f"- {name} × {workload}: " + ", ".join(f"{k} {v}" for k, v in st.items()) if st else None
    if status != "ok":
        return f"| {name} | {workload} | {mb} | — | — | — | — | — | {md_cell(status_text(status, r.get('error')))} |", settings, None, None
    _number(r, "tokens_per_s_per_gpu", positive=True)
    for key in ("mfu", "peak_mem_gib", "usd_per_1m_tokens"):
        _number(r, key, optional=True)
    st_s = r["step_time_s"]
    for key in ("p10", "p50", "p90"):
        _number(st_s, key, positive=True, where="step_time_s.")
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "—"
    row = (
        f"| {name} | {workload} | {mb} | {r['tokens_per_s_per_gpu']:,.0f} | {mfu} | {_fmt(r.get('peak_mem_gib'), '.1f')} | "
        f"{st_s['p10']:.3f} / {st_s['p50']:.3f} / {st_s['p90']:.3f} | {_fmt(r.get('usd_per_1m_tokens'), '.4f')} | ok |"
    )
    v = run_window_rate(r, fig.get("warmup_steps"), fig.get("world_size"))
    ex, excl = r.get("excluding_report"), None
    if ex:
        mfu_ex = f", MFU {100 * ex['mfu']:.1f}%" if ex.get("mfu") is not None else ""
        excl = (
            f"{name} × {workload} without its per-step `ray.train.report` "
            f"(median {ex['report_s_median']:.2f} s a call, part of every step above): "
            f"{ex['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU{mfu_ex}."
        )
    return row, settings, (None if v is None else (name, workload, v)), excl


def _text(r: dict[str, Any], key: str) -> str:
    """``r[key]`` as table text: a string (KeyError when missing, ValueError when not a string),
    its ``|`` escaped and its whitespace folded so that it stays in its cell."""
    v = r[key]
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {v!r:.40}")
    return md_cell(v)


def md_cell(v: str) -> str:
    """Text for one Markdown table cell: whitespace folded to single spaces, ``|`` escaped."""
    return " ".join(v.split()).replace("|", "\\|")


def _number(r: dict[str, Any], key: str, *, positive: bool = False, optional: bool = False, where: str = "") -> None:
    """Check ``r[key]``: a finite number, > 0 when ``positive``, else >= 0; None allowed when ``optional``.

    Raises:
        KeyError: missing and not ``optional``. ValueError: anything else.
    """
    v = r.get(key) if optional else r[key]
    if v is None and optional:
        return
    ok = finite_number(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise ValueError(
            f"{where}{key} must be a {'positive' if positive else 'non-negative'} finite number{' or null' if optional else ''}, got {v!r:.40}"
        )


def markdown_table(doc: dict[str, Any]) -> str:
    """The results file(s) ``doc`` (one results JSON, as written by :func:`run_bench`) as Markdown.

    Raises:
        ValueError: a malformed run, named by its index (``figures.runs[i]``) and what is wrong.
        KeyError, TypeError, ValueError, AttributeError, IndexError: a malformed document outside
            the runs (``figures``, ``float8_check``, ``price``).
    """
    fig = doc["figures"]
    env = doc.get("environment", {})
    lines = [
        "| recipe | workload | micro-batch | tokens/s/GPU | MFU | peak GiB | step s p10 / p50 / p90 | USD / 1M tokens | status |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"
    ]
    settings, windows, excluded = [], [], []
    if not isinstance(fig["runs"], list):
        raise ValueError(f"figures.runs must be a list, got {fig['runs']!r:.40}")
    for i, r in enumerate(fig["runs"]):
        try:
            row, st, win, ex = _run_lines(r, fig)
        except KeyError as e:
            raise ValueError(f"figures.runs[{i}]: no {e.args[0]!r} field") from None
        except ValueError as e:
            raise ValueError(f"figures.runs[{i}]: {e}") from None
        except (TypeError, AttributeError, IndexError, OverflowError) as e:
            raise ValueError(f"figures.runs[{i}]: {type(e).__name__}: {e}") from None
        lines.append(row)
        settings += [st] if st else []
        windows += [win] if win else []
        excluded += [ex] if ex else []
    lines += ["", *settings, ""]
    lines.append(
        f"{fig.get('world_size')} × {env.get('gpu_model', '?')}, model {fig.get('model')}, seq {fig.get('seq_len')}, "
        f"micro-batch {fig.get('micro_batch_size')} rows/GPU unless the table says otherwise, {fig.get('steps')} steps (median over steps after "
        f"{fig.get('warmup_steps')}); tokens = non-padding tokens; commit {str(doc.get('git_commit'))[:12]}."
    )
    if windows:
        lines.append(
            "The measured steps as a whole (their tokens ÷ their summed time; slow steps count in full): "
            + ", ".join(f"{n} × {w} {v:,.0f}" for n, w, v in windows)
            + " tokens/s/GPU."
        )
    lines += excluded
    if fig.get("use_gpu") and fig.get("ceiling") and fig["ceiling"].get("status") != NOT_RUN:
        lines.append(gpu_ceiling.describe(fig["ceiling"]))
        shares = [
            f"{_text(r, 'label') if r.get('label') else _text(r, 'recipe')} × {_text(r, 'workload')} {100 * r['of_ceiling']:.1f}%"
            for r in fig["runs"]
            if r.get("status") == "ok" and r.get("of_ceiling") is not None
        ]
        if shares:
            lines.append(
                "Each run's model FLOP rate (tokens/s/GPU × FLOPs per token) as a share of it (float8 runs too, against this bf16 rate): "
                + ", ".join(shares)
                + "."
            )
    price = fig.get("price", {})
    for w, chk in (fig.get("float8_check") or {}).items():
        lines.append(
            f"Float8 check ({w}): rayft-fp8's loss vs rayft's over {len(chk['steps'])} steps: max relative difference "
            f"{100 * chk['max_rel_diff']:.2f}%, at the last step {100 * chk['final_rel_diff']:.2f}% "
            f"({chk['loss_bf16'][-1]:.4f} bf16, {chk['loss_fp8'][-1]:.4f} float8)."
        )
    if price.get("usd_per_gpu_hour"):
        per = (
            f"{price['instance']} ${price['instance_usd_per_hour']:.4g}/h ÷ {price['gpus_per_instance']} GPUs = "
            if price.get("instance_usd_per_hour")
            else ""
        )
        lines.append(f"Cost: {per}${price['usd_per_gpu_hour']:.4g} per GPU-hour ({price.get('source')}, {price.get('date')}).")
    else:
        lines.append(f"Cost: not computed: {price.get('note')}")
    return "\n".join(lines)


def bar_chart(doc: dict[str, Any], out: Path) -> Path | None:
    """A PNG bar chart of tokens/s/GPU per recipe and workload; None when matplotlib is missing or
    no run succeeded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = [r for r in doc["figures"]["runs"] if r["status"] == "ok"]
    if not runs:
        return None
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in runs)]
    recipes = [rc for rc in RECIPES if any(r["recipe"] == rc for r in runs)] + sorted({r["recipe"] for r in runs} - set(RECIPES))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(workloads))
    for i, w in enumerate(workloads):
        vals = [next((r["tokens_per_s_per_gpu"] for r in runs if r["recipe"] == rc and r["workload"] == w), 0) for rc in recipes]
        bars = ax.bar([x + i * width for x in range(len(recipes))], vals, width, label=w)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in vals], fontsize=7)
    ax.set_xticks([x + width * (len(workloads) - 1) / 2 for x in range(len(recipes))], recipes)
    ax.set_ylabel("non-padding tokens/s per GPU (median)")
    env = doc.get("environment", {})
    ax.set_title(f"{doc['figures'].get('model')} on {doc['figures'].get('world_size')} × {env.get('gpu_model', '?')}")
    ax.legend(title="workload")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def write_table_files(results: Path, console: Console | None = None) -> tuple[Path, Path | None]:
    """Regenerate ``<results>.md`` (and ``.png``) beside a results JSON; returns their paths. The
    ``.md`` is written last, so a file that fails gets none.

    Raises:
        OSError, ValueError (also JSON's), KeyError, TypeError, AttributeError, IndexError,
        OverflowError, RecursionError: an unreadable or malformed results file (:func:`markdown_table`).
    """
    doc = json.loads(results.read_text())
    md, text = results.with_suffix(".md"), markdown_table(doc) + "\n"
    png = bar_chart(doc, results.with_suffix(".png"))
    md.write_text(text)  # last: a file that fails anywhere above gets no table
    if png is None and console is not None and any(r["status"] == "ok" for r in doc["figures"]["runs"]):
        console.print("matplotlib is not installed: no PNG chart (in a clone: pip install -e '.[bench]')", highlight=False, markup=False)
    return md, png


# ------------------------------------------------------------------------------ running


@dataclass
class Plan:
    """What the benchmark runs (resolved from the config and options)."""

    config: Path
    overrides: list[str]
    recipes: list[str]
    workloads: list[str]
    steps: int
    warmup_steps: int
    work_dir: Path
    timeout_s: Timeouts
    deadline_s: float | None = None
    rayft_overrides: list[str] = field(default_factory=list)  # --rayft-set: the rayft recipes only


def _prepare_model_and_data(cfg, plan: Plan, world: int, console: Console) -> dict[str, Any]:
    """Write the shared inputs under ``work_dir``: the initial model (an HF directory that every
    recipe, rayft included, loads: one seeded init, on the GPU where there is one), the tokenizer,
    and one ``data.npz`` per workload. The model is written only when a recipe other than rayft
    runs; rayft alone starts from its own seeded init of the preset."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.benchmarks.recipes import save_dataset
    from rayft.data.synthetic import random_dataset
    from rayft.train.driver import load_run_data
    from rayft.train.model import is_preset, load_full_model, load_model_config, matmul_params, preset_init_device
    from rayft.train.preset_init import largest_unit_params

    conf = load_model_config(cfg.model, "sdpa")
    shared: dict[str, Any] = {"model_dir": str(plan.work_dir / "model"), "tokenizer_dir": str(plan.work_dir / "tokenizer"), "data": {}}
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(conf)
    if {"sample-recipe", "trl-default", "trl-best", "llamafactory"} & set(plan.recipes):
        # one init, which every recipe (rayft too: see recipe_command) loads from model_dir
        init = "cpu"
        if torch.cuda.is_available() and is_preset(cfg.model.name_or_path):
            # the device rayft's own build picks for the same preset (the same seed gives the same weights there)
            init = preset_init_device(torch.device("cuda", 0), largest_unit_params(meta), cfg.model.init_device)
        model = load_full_model(cfg.model, conf, cfg.train.seed, init)
        model.config.dtype = "bfloat16"  # what the published Qwen2.5 checkpoints declare
        model.save_pretrained(shared["model_dir"])
        shared["model_written"] = True  # by this bench: rayft loads it too (a directory left by an earlier bench is not used)
        del model
        if init != "cpu":
            torch.cuda.empty_cache()
    if set(TORCHTITAN_RECIPES) & set(plan.recipes):
        try:  # torchtitan builds its own model: the same shape or no run
            check_preset_shape(cfg.model.name_or_path, conf)
        except TorchtitanRecipeError as e:
            raise BenchTrainError(str(e)) from None
    shared["matmul_params"] = matmul_params(meta)
    shared["decoder_layer_cls"] = type(meta.model.layers[0]).__name__
    shared["num_layers"], shared["hidden"], shared["vocab_size"] = conf.num_hidden_layers, conf.hidden_size, conf.vocab_size
    rows_per_step = world * cfg.train.micro_batch_size
    for w in plan.workloads:
        if w == "random":
            ds = random_dataset(plan.steps * rows_per_step, cfg.data.seq_len, conf.vocab_size, cfg.data.seed)
        else:
            if cfg.data.synthetic is not None:
                raise BenchTrainError("workload real needs data.train_files in the config (it has data.synthetic)")
            d = load_run_data(cfg, console)
            ds = d.train.to_dataset()  # the store's selected examples, in memory (flat arrays for every recipe)
            d.tokenizer.save_pretrained(shared["tokenizer_dir"])
        path = plan.work_dir / f"{w}-data.npz"
        save_dataset(ds, path)
        shared["data"][w] = {"file": str(path), "examples": len(ds), "tokens": int(len(ds.tokens))}
    if not Path(shared["tokenizer_dir"]).exists():
        from rayft.data.tokenizer import load_tokenizer
        from rayft.train.model import default_tokenizer

        load_tokenizer(default_tokenizer(cfg.model)).save_pretrained(shared["tokenizer_dir"])
    return shared


def recipe_command(recipe: str, workload: str, plan: Plan, cfg, world: int, use_gpu: bool, shared: dict, run_dir: Path) -> list[str]:
    """The subprocess command line of one recipe × workload (writes the spec file it needs)."""
    py = sys.executable
    if recipe in RAYFT_RECIPES:
        # recipe best settings, then the user's overrides and --rayft-set, then the workload's data
        # (which must win over a user's data.train_files), then the bench's fixed settings.
        sets = list(RAYFT_BEST) + list(plan.overrides) + list(plan.rayft_overrides)
        if recipe == "rayft-fp8":
            sets.append("train.float8=true")
        if workload == "random":
            from rayft.config import load_config

            rows = plan.steps * world * load_config(plan.config, sets).train.micro_batch_size
            sets += [
                "data.train_files=[]",
                "data.validation_files=null",
                "data.validation_fraction=null",
                f"data.synthetic={{rows: {rows}, seed: {cfg.data.seed}}}",
            ]
        else:
            sets += ["data.synthetic=null"]
        if shared.get("model_written"):  # the other recipes' initial weights, written by this bench
            sets += [f"model.name_or_path={shared['model_dir']}", f"model.tokenizer={shared['tokenizer_dir']}"]
        sets += [
            f"train.max_steps={plan.steps}",
            "train.warmup_steps=0",
            f"train.num_workers={world}",
            "train.grad_accum_steps=1",
            f"checkpoint.storage_path={run_dir}",
            "checkpoint.name=rayft",
            "checkpoint.every_steps=null",
            "checkpoint.every_minutes=null",
            "checkpoint.export_hf=false",
            "checkpoint.save_final=false",
            "ray.max_failures=0",
            "train.eval_every=null",
        ]
        return [py, "-m", "rayft.cli", "train", str(plan.config), *(a for s in sets for a in ("--set", s))]
    ac = cfg.train.activation_checkpointing
    if ac not in (True, False, 1):
        raise BenchTrainError(
            f"train.activation_checkpointing={ac} (every {ac}th layer): recipe {recipe} checkpoints every layer or none; "
            "set true or false to compare like with like"
        )
    spec = {
        "recipe": recipe,
        "workload": workload,
        "data": shared["data"][workload]["file"],
        "model_dir": shared["model_dir"],
        "tokenizer_dir": shared["tokenizer_dir"],
        "decoder_layer_cls": shared["decoder_layer_cls"],
        "seq_len": cfg.data.seq_len,
        "micro_batch_size": cfg.train.micro_batch_size,
        "steps": plan.steps,
        "num_workers": world,
        "use_gpu": use_gpu,
        "lr": cfg.train.lr,
        "seed": cfg.train.seed,
        "activation_checkpointing": bool(ac),
        "pad_id": shared["pad_id"],
        "out_dir": str(run_dir),
    }
    if recipe in TORCHTITAN_RECIPES:
        from rayft.benchmarks.torchtitan_recipe import command

        # train.profile_steps (--set): rayft's runs trace those steps, torchtitan's the same through its own profiler
        spec |= {
            "preset": cfg.model.name_or_path,
            "float8": recipe == "torchtitan-fp8",
            "compile": True,
            "profile_steps": cfg.train.profile_steps,
        }
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_file = run_dir / "spec.json"
    spec_file.write_text(json.dumps(spec, indent=2))
    if recipe in TORCHTITAN_RECIPES:
        return command(spec_file, world)
    if recipe == "llamafactory":
        from rayft.benchmarks.llamafactory_recipe import command as llamafactory_command

        return llamafactory_command(spec_file)
    if recipe == "sample-recipe":
        return [py, "-m", "rayft.benchmarks.recipes", "sample", str(spec_file)]
    return [
        py,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world}",
        "-m",
        "rayft.benchmarks.recipes",
        "trl",
        str(spec_file),
    ]


#: What ``sample-recipe`` runs (fixed by the AWS sample's code).
SAMPLE_SETTINGS = {
    "attention": "sdpa",
    "padding_free": False,
    "liger": False,
    "gradient_checkpointing": False,
    "fsdp": 1,
    "cross_entropy": "transformers (full logits)",
}


def recipe_settings(recipe: str, run_dir: Path, cmd: list[str], config: Path) -> dict[str, Any]:
    """The effective settings of one run: attention, padding_free, liger, gradient_checkpointing, fsdp
    (version; None without FSDP), cross_entropy; rayft also compile, float8, micro_batch_size, fused_loss_chunk_mem and
    gpu_memory_limit_gib. Before the run: what is planned; after it, what the run reported
    (TRL: its ``settings.json``; rayft: the first line of ``rayft_metrics.jsonl``)."""
    if recipe == "sample-recipe":
        return dict(SAMPLE_SETTINGS)
    if recipe in RAYFT_RECIPES:
        from rayft.config import load_config

        c = load_config(config, [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"])
        out = {
            "attention": c.model.attn_implementation,
            "padding_free": c.data.packing,
            "liger": c.train.liger_kernels,
            "gradient_checkpointing": c.train.activation_checkpointing,
            # one GPU without FSDP2 by default (parallel.single_worker): the weights' compute copies
            # (num_workers auto: known once the run reports it below)
            "fsdp": 2 if c.train.num_workers == "auto" or c.parallel.uses_fsdp2(c.train.num_workers, "cuda") else None,
            "cross_entropy": c.train.cross_entropy,
            "compile": c.train.compile,
            "float8": c.train.float8,
            "micro_batch_size": c.train.micro_batch_size,
            "fused_loss_chunk_mem": c.train.fused_loss_chunk_mem,
            "gpu_memory_limit_gib": c.train.gpu_memory_limit_gib,
        }
        metrics = run_dir / "rayft" / "rayft_metrics.jsonl"
        try:
            first = json.loads(metrics.read_text().splitlines()[0])
            out["attention"], out["cross_entropy"] = first["attn_implementation"], first["cross_entropy"]
            if "fused_loss_chunk_mem" in first:  # what the loss got (None: not applied)
                out["fused_loss_chunk_mem"] = first["fused_loss_chunk_mem"]
            if "weights" in first:  # fsdp2, compute_copy or plain, as the run resolved it
                out["fsdp"] = 2 if first["weights"] == "fsdp2" else None
        except (OSError, IndexError, KeyError, ValueError):
            pass
        return out
    from rayft.benchmarks.recipes import SETTINGS_FILE

    try:  # what the run wrote (rank 0: what it used; trl-best's with "label" when it fell back to sdpa)
        return json.loads((run_dir / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return planned_recipe_settings(recipe, json.loads((run_dir / "spec.json").read_text()))


def planned_recipe_settings(recipe: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The settings a torchtitan, llamafactory or TRL run was planned with (its ``spec.json``), for
    a run that wrote none of its own."""
    if recipe in TORCHTITAN_RECIPES:
        from rayft.benchmarks.torchtitan_recipe import planned_settings

        return planned_settings(spec)
    if recipe == "llamafactory":
        from rayft.benchmarks import llamafactory_recipe

        return llamafactory_recipe.planned_settings(spec)
    from rayft.benchmarks.recipes import trl_planned_settings

    planned = trl_planned_settings(spec)
    del planned["label"]
    if recipe == "trl-best" and spec["use_gpu"]:
        planned["attention"] = "auto (rayft varlen on CUDA with torch varlen_attn and a TRL passing cu_seq_lens_q, else sdpa)"
    return planned


def run_bench(
    config: str | os.PathLike,
    overrides: list[str] | None = None,
    recipes: list[str] | None = None,
    workloads: list[str] | None = None,
    steps: int = DEFAULT_STEPS,
    warmup_steps: int = DEFAULT_WARMUP,
    out: str | os.PathLike | None = None,
    work_dir: str | os.PathLike | None = None,
    timeout_s: Timeouts = None,
    usd_per_gpu_hour: float | None = None,
    instance: str | None = None,
    console: Console | None = None,
    runner: LoggedCommand = run_logged,
    deadline_s: float | None = None,
    rayft_overrides: list[str] | None = None,
    ceiling_s: float = DEFAULT_CEILING_S,
) -> tuple[Path, dict[str, Any]]:
    """Run every recipe × workload, write the results JSON (+ ``.md`` and ``.png`` beside it).

    Args:
        config: a rayft training config (model, data, seq_len, micro_batch_size, num_workers, lr).
        overrides: ``--set`` overrides for the config; passed to the ``rayft`` recipe after its own settings.
        rayft_overrides: ``--rayft-set``: overrides for the rayft recipes only, after ``overrides``
            (e.g. ``train.micro_batch_size=16``: each run's micro-batch is in its results entry).
        steps: optimizer steps per run; warmup_steps: leading steps left out of every figure.
        work_dir: where the shared inputs, the runs and their logs go (default ``<storage_path>/bench-train-<time>``).
        timeout_s: limit per run, seconds: one for all, or ``{recipe: seconds}`` (:func:`parse_timeouts`).
        deadline_s: the whole benchmark's time budget from the call, seconds: each run gets at most
            what is left less :data:`DEADLINE_MARGIN_S`; a run with less than :data:`MIN_RUN_S` left
            is not started (status :data:`SKIPPED`).
        usd_per_gpu_hour / instance: the price to use instead of the catalog's for the detected GPU.
        ceiling_s: on GPUs, seconds of bf16 products first (:mod:`rayft.benchmarks.ceiling`, in its
            own process through ``runner``): the figures' ``ceiling``, and each run's ``of_ceiling``
            (its model FLOP rate as a fraction of that sustained rate); 0 skips it.
        runner: runs one subprocess into a log (tests replace it).

    The results JSON and its Markdown table are rewritten after every run; runs not started yet are
    listed with status :data:`NOT_RUN`. On SIGTERM or Ctrl-C the results so far are written and
    :class:`BenchInterrupted` raised.

    Returns:
        ``(results file, figures)``.
    Raises:
        BenchTrainError: bad options or config (a failed run is recorded, not raised).
        BenchInterrupted: SIGTERM / KeyboardInterrupt (after writing the partial results).
    """
    t0 = _clock()
    import torch

    from rayft.benchmarks.record import environment, write_result
    from rayft.config import ConfigError, load_config
    from rayft.train.metrics import flops_per_token, peak_for_name

    console = console or Console(stderr=True)
    overrides = list(overrides or [])
    rayft_overrides = list(rayft_overrides or [])
    if recipes is not None and not recipes:
        raise BenchTrainError(f"--recipes is empty; choose from {', '.join(RECIPES)}")
    recipes = list(recipes or DEFAULT_RECIPES)
    if len(set(recipes)) != len(recipes):
        raise BenchTrainError(f"--recipes names a recipe twice: {','.join(recipes)}")
    workloads = list(workloads or WORKLOADS)
    for r in recipes:
        if r not in RECIPES:
            raise BenchTrainError(f"unknown recipe {r!r}; choose from {', '.join(RECIPES)}")
    for w in workloads:
        if w not in WORKLOADS:
            raise BenchTrainError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if steps <= warmup_steps:
        raise BenchTrainError(f"--steps {steps} leaves no step after --warmup-steps {warmup_steps}")
    if not (ceiling_s == 0 or 2 <= ceiling_s <= 600):
        raise BenchTrainError(f"--ceiling-s {ceiling_s:g}: 0 (not measured) or 2 to 600 seconds")
    try:
        cfg = load_config(Path(config), overrides)
    except ConfigError as e:
        raise BenchTrainError(f"config error: {e}") from None
    if cfg.train.grad_accum_steps != 1:
        raise BenchTrainError("the benchmark runs one micro-batch per step on every recipe: set train.grad_accum_steps=1")
    if rayft_overrides and not set(recipes) & set(RAYFT_RECIPES):
        raise BenchTrainError(f"--rayft-set is for the rayft recipes ({', '.join(RAYFT_RECIPES)}), and none runs")
    for kv in rayft_overrides:
        key = kv.partition("=")[0].strip()
        if any(key == f or key.startswith(f + ".") or f.startswith(key + ".") for f in BENCH_FIXED):
            raise BenchTrainError(
                f"--rayft-set {kv}: the benchmark sets {key} itself (fixed: {', '.join(BENCH_FIXED)}; float8 runs as the rayft-fp8 recipe)"
            )
    if set(recipes) & set(RAYFT_RECIPES):  # the rayft recipes' own settings with the user's: valid before anything runs
        try:
            rcfg = load_config(Path(config), list(RAYFT_BEST) + overrides + rayft_overrides)
        except ConfigError as e:
            where = "--rayft-set" if rayft_overrides else "the rayft recipes' settings (" + " ".join(RAYFT_BEST) + ")"
            raise BenchTrainError(f"{where}: {str(e).replace('(from --set)', '(from --set/--rayft-set)')}") from None
        if rcfg.train.grad_accum_steps != 1:
            raise BenchTrainError("--rayft-set: the benchmark runs one micro-batch per step: keep train.grad_accum_steps=1")
        if rcfg.train.float8:
            raise BenchTrainError(
                "train.float8 is set for every rayft run (config or --set): the rayft recipe is the bf16 "
                "baseline; run float8 as the rayft-fp8 recipe"
            )
    use_gpu = torch.cuda.is_available() if cfg.train.use_gpu == "auto" else bool(cfg.train.use_gpu)
    if cfg.train.profile_steps and cfg.train.profile_steps[1] > steps:
        raise BenchTrainError(
            f"train.profile_steps={list(cfg.train.profile_steps)} but each run has --steps {steps}: nothing would be traced"
        )
    if set(recipes) & set(TORCHTITAN_RECIPES):
        try:
            torchtitan_model(cfg.model.name_or_path)
            if cfg.train.profile_steps:
                profiling_args(*cfg.train.profile_steps, steps=steps)
        except TorchtitanRecipeError as e:
            raise BenchTrainError(str(e)) from None
        if not use_gpu:
            raise BenchTrainError("the torchtitan recipes run on CUDA GPUs only (torchtitan's trainer): this config trains on CPU")
    world = cfg.train.num_workers if cfg.train.num_workers != "auto" else (torch.cuda.device_count() if use_gpu else 1)
    if "llamafactory" in recipes:
        from rayft.benchmarks.llamafactory_recipe import LlamaFactoryRecipeError, check_world

        try:
            check_world(use_gpu, world)
        except LlamaFactoryRecipeError as e:
            raise BenchTrainError(str(e)) from None
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    wd = Path(work_dir) if work_dir else Path(cfg.checkpoint.storage_path) / f"bench-train-{stamp}"
    wd.mkdir(parents=True, exist_ok=True)
    if isinstance(timeout_s, str):
        timeout_s = parse_timeouts(timeout_s)
    plan = Plan(Path(config), overrides, recipes, workloads, steps, warmup_steps, wd, timeout_s, deadline_s, rayft_overrides)
    shared = _prepare_model_and_data(cfg, plan, world, console)
    from rayft.data.tokenizer import load_tokenizer

    shared["pad_id"] = load_tokenizer(shared["tokenizer_dir"]).pad_token_id
    env_info = environment()
    gpu_model = env_info.get("gpu_model") if use_gpu else "cpu"
    peak = peak_for_name(gpu_model or "") if use_gpu else None
    price = (
        gpu_price(gpu_model, instance, usd_per_gpu_hour)
        if use_gpu or usd_per_gpu_hour
        else {"usd_per_gpu_hour": None, "note": "CPU workers: no GPU price"}
    )

    def flops_fn(span: float) -> float:
        return flops_per_token(shared["matmul_params"], shared["num_layers"], shared["hidden"], span)

    if out is None:
        label = gpu_label(gpu_model, world)
        out = (
            Path("bench/results")
            / f"{dt.date.today():%Y-%m-%d}-train-{re.sub(r'[^a-z0-9.]+', '-', cfg.model.name_or_path.lower())}-{label}.json"
        )
    command = " ".join(
        [
            "rayft bench train",
            shlex.quote(str(config)),
            "--recipes",
            ",".join(recipes),
            "--workload",
            workloads[0] if len(workloads) == 1 else "both",
            "--steps",
            str(steps),
            "--warmup-steps",
            str(warmup_steps),
            *(["--timeout-s", shlex.quote(format_timeouts(timeout_s))] if timeout_s is not None else []),
            *(["--deadline-s", f"{deadline_s:g}"] if deadline_s is not None else []),
            *(a for s in overrides for a in ("--set", shlex.quote(s))),
            *(a for s in rayft_overrides for a in ("--rayft-set", shlex.quote(s))),
            *(["--ceiling-s", f"{ceiling_s:g}"] if ceiling_s != DEFAULT_CEILING_S else []),
        ]
    )
    versions = {}
    for mod in ("trl", "datasets", "accelerate", "torchtitan"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    todo = [(r, w) for w in workloads for r in recipes]
    runs: list[dict[str, Any]] = []
    ceiling: dict[str, Any] = {"status": NOT_RUN}

    def write(final: bool) -> tuple[Path, dict[str, Any]]:
        """The results so far (runs not started: status "not run"), JSON + Markdown (+ PNG when final)."""
        pending = [{"recipe": r, "workload": w, "status": NOT_RUN} for r, w in todo[len(runs) :]]
        figures = {
            "model": cfg.model.name_or_path,
            "seq_len": cfg.data.seq_len,
            "micro_batch_size": cfg.train.micro_batch_size,
            "world_size": world,
            "use_gpu": use_gpu,
            "steps": steps,
            "warmup_steps": warmup_steps,
            "peak_flops": peak,
            "matmul_params": shared["matmul_params"],
            "price": price,
            "rayft_settings": RAYFT_BEST + rayft_overrides,
            "timeout_s": timeout_s,
            "deadline_s": deadline_s,
            "complete": final and not pending,
            "workloads": {w: shared["data"][w] for w in workloads},
            "runs": runs + pending,
            "float8_check": float8_check(runs),
            "ceiling": ceiling,
        }
        path = write_result(out, command, figures, versions=versions)
        if final:
            write_table_files(path, console)
        else:
            path.with_suffix(".md").write_text(markdown_table(json.loads(path.read_text())) + "\n")
        return path, figures

    def on_sigterm(signum, frame):
        raise BenchInterrupted(f"signal {signum}")

    write(False)  # every run "not run" yet: a results file exists from the start
    old_handler = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is threading.main_thread() else None
    try:
        ceiling = measure_ceiling(plan, use_gpu, ceiling_s, runner, console, t0)
        for r, w in todo:
            run = _one_run(r, w, plan, cfg, world, use_gpu, shared, runner, console, t0, flops_fn, peak, price)
            if run["status"] == "ok":
                run["of_ceiling"] = gpu_ceiling.share_of_ceiling(run["tokens_per_s_per_gpu"], run.get("flops_per_token"), ceiling)
            runs.append(run)
            write(False)
    except (KeyboardInterrupt, BenchInterrupted) as e:
        why = str(e) or "KeyboardInterrupt"
        path, _ = write(True)
        raise BenchInterrupted(f"interrupted ({why}) after {len(runs)} of {len(todo)} runs; partial results in {path}") from None
    finally:
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
    return write(True)


def measure_ceiling(
    plan: Plan, use_gpu: bool, seconds: float, runner: LoggedCommand, console: Console, t0: float | None = None
) -> dict[str, Any]:
    """The GPU's sustained bf16 matrix rate (:mod:`rayft.benchmarks.ceiling`, its own process, on CUDA
    device 0 of those this process sees, the recipes' first) with ``status`` ``ok``; or why it was
    not measured (``not measured``: CPU workers, ``seconds`` 0, or too little time left before
    ``--deadline-s``, counted from ``t0``; ``failed``: its error and log tail). Never raises for a
    failed measurement: the recipes run anyway."""
    if not use_gpu:
        return {"status": "not measured", "reason": "CPU workers"}
    if not seconds:
        return {"status": "not measured", "reason": "--ceiling-s 0"}
    limit = seconds + 120  # the products, and the process's start and CUDA set-up
    if plan.deadline_s is not None and t0 is not None:
        left = plan.deadline_s - (_clock() - t0) - DEADLINE_MARGIN_S
        if left < seconds + 30:
            return {"status": "not measured", "reason": f"{max(0.0, left):.0f} s left before --deadline-s {plan.deadline_s:g}"}
        limit = min(limit, left)
    out, log = plan.work_dir / "ceiling.json", plan.work_dir / "ceiling.log"
    cmd = [sys.executable, "-m", "rayft.benchmarks.ceiling", "--seconds", f"{seconds:g}", "--out", str(out)]
    console.print(f"[ceiling] {seconds:g} s of bf16 products → {log}", highlight=False, markup=False)
    try:
        rc = runner(cmd, dict(os.environ, PYTHONUNBUFFERED="1"), log, limit)
        if rc != 0:
            raise BenchTrainError(f"exit {rc}")
        res = json.loads(out.read_text())
        figures = {
            "status": "ok",
            **{k: v for k, v in res.items() if k != "windows"},
            "windows_tflops": [w["tflops"] for w in res["windows"]],
        }
    except Exception as e:  # noqa: BLE001 -- recorded, the recipes run anyway
        console.print(Text.assemble(("[ceiling] failed", "bold red"), f": {e}"), highlight=False)
        return {"status": "failed", "error": f"{e}\n{log_tail(log, 15)}", "log": str(log)}
    console.print(f"[ceiling] {figures['sustained_tflops']:,.1f} TFLOP/s sustained", highlight=False, markup=False)
    return {**figures, "log": str(log)}


def _one_run(
    r: str,
    w: str,
    plan: Plan,
    cfg,
    world: int,
    use_gpu: bool,
    shared: dict,
    runner: LoggedCommand,
    console: Console,
    t0: float,
    flops_fn,
    peak,
    price,
) -> dict[str, Any]:
    """Run one recipe × workload; its results entry (a failure of any kind is recorded, not raised)."""
    wd = plan.work_dir
    run_dir = wd / f"{r}-{w}"
    log = wd / f"{r}-{w}.log"
    entry: dict[str, Any] = {"recipe": r, "workload": w, "log": str(log), "run_dir": str(run_dir)}
    cap = run_timeout(plan.timeout_s, r)
    limit = cap
    if plan.deadline_s is not None:
        left = plan.deadline_s - (_clock() - t0) - DEADLINE_MARGIN_S
        if left < MIN_RUN_S:
            console.print(f"[{r} × {w}] skipped: {max(0.0, left):.0f} s left before the deadline", highlight=False, markup=False)
            return {
                **entry,
                "status": SKIPPED,
                "error": f"{max(0.0, left):.0f} s left before --deadline-s {plan.deadline_s:g} (needs {MIN_RUN_S} s)",
            }
        limit = left if cap is None else min(cap, left)
    entry["timeout_s"] = limit
    try:
        cmd = recipe_command(r, w, plan, cfg, world, use_gpu, shared, run_dir)
        entry["cmd"] = " ".join(shlex.quote(c) for c in cmd)
        entry["settings"] = recipe_settings(r, run_dir, cmd, plan.config)
    except Exception as e:  # noqa: BLE001 - recorded per run
        return {**entry, "status": "failed", "error": f"could not prepare the run: {e}"}
    entry["micro_batch_size"] = entry["settings"].get("micro_batch_size", cfg.train.micro_batch_size)
    console.print(f"[{r} × {w}] {plan.steps} steps, limit {_fmt(limit, '.0f', 'none')} s → {log}", highlight=False, markup=False)
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    t_run = time.monotonic()
    try:
        rc = runner(cmd, env, log, limit)
    except Exception as e:  # noqa: BLE001 - the runner itself failed: this run's failure
        console.print(Text.assemble((f"[{r} × {w}] failed", "bold red"), f": runner error {e!r}"), highlight=False)
        return {**entry, "status": "failed", "error": f"runner error: {e!r}\n{log_tail(log, 25)}"}
    entry["wall_s"] = round(time.monotonic() - t_run, 1)
    entry["settings"] = recipe_settings(r, run_dir, cmd, plan.config)  # what the run reported it used
    if entry["settings"].get("label"):
        entry["label"] = entry["settings"].pop("label")
    try:
        if rc != 0:
            raise BenchTrainError(f"exit {rc}" + (f" (time limit {limit:.0f} s)" if rc == 124 and limit else ""))
        recs = rayft_records(run_dir / "rayft" / "rayft_metrics.jsonl") if r in RAYFT_RECIPES else read_step_files(run_dir)
        figs = summarize(recs, plan.warmup_steps, world, flops_fn, peak)
        if recs and "setup_s" in recs[0]:  # rayft: worker start to the first step (model build and weight load within)
            figs["setup_s"], figs["setup_model_build_s"] = recs[0]["setup_s"], recs[0].get("setup_model_build_s")
        if r in RAYFT_RECIPES:  # where the run's wall time went (rayft.train.summary.wall_timeline)
            try:
                figs["wall_breakdown_s"] = json.loads((run_dir / "rayft" / "rayft_summary.json").read_text()).get("wall_s")
            except (OSError, ValueError):
                figs["wall_breakdown_s"] = None
    except (BenchTrainError, OSError, KeyError, ValueError) as e:
        console.print(Text.assemble((f"[{r} × {w}] failed", "bold red"), f": {e}"), highlight=False)
        return {**entry, "status": "failed", "exit_code": rc, "error": f"{e}\n{log_tail(log, 25)}"}
    figs["usd_per_1m_tokens"] = usd_per_million_tokens(price.get("usd_per_gpu_hour"), figs["tokens_per_s_per_gpu"])
    console.print(f"[{r} × {w}] {figs['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU", highlight=False, markup=False)
    return {**entry, "status": "ok", **figs, "steps": recs}

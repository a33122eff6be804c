"""The figures and the results document of `rayft bench train` (:mod:`rayft.benchmarks.train`).

Figures of one run from its step records (:func:`summarize`: tokens/s/GPU as the median over the
steps after the warm-up and as the window's whole rate, MFU, peak memory, step-time percentiles),
the float8 run's loss against the bf16 run's (:func:`float8_check`), the price per GPU-hour and the
cost per million tokens (:func:`gpu_price`, :func:`usd_per_million_tokens`), and the results JSON
as a Markdown table and a PNG bar chart (:func:`markdown_table`, :func:`write_table_files`), which
``rayft bench readme`` reads too. The recipe and workload names and the layer's error type live
here, where both the runner and the table need them.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console

from rayft.benchmarks import ceiling as gpu_ceiling
from rayft.benchmarks.choices import RAYFT_RECIPES, RECIPES, WORKLOADS

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

NOT_RUN = "not run"


class BenchTrainError(RuntimeError):
    """The benchmark cannot start (bad arguments or config); single runs fail without it."""


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
    """The results file(s) ``doc`` (one results JSON, as written by :func:`rayft.benchmarks.train.run_bench`) as Markdown.

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

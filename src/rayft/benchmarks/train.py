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
  3600) × 1e6, the instance being the one carrying the detected GPU model (:data:`rayft.benchmarks.train_results.GPU_INSTANCE`),
  its price and date from :mod:`rayft.cluster.instances`' catalog.

This module runs the benchmark (:func:`run_bench`); what each recipe runs is
:mod:`rayft.benchmarks.train_recipes`, the figures and the results' table and chart
:mod:`rayft.benchmarks.train_results`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from rayft.benchmarks import ceiling as gpu_ceiling
from rayft.benchmarks.choices import (
    DEFAULT_CEILING_S,
    DEFAULT_RECIPES,
    DEFAULT_STEPS,
    DEFAULT_WARMUP,
    RAYFT_RECIPES,
    RECIPES,
    TRL_RECIPES,
    WORKLOADS,
)
from rayft.benchmarks.fabric import gpu_label
from rayft.benchmarks.logged_run import LoggedCommand, log_tail, run_logged
from rayft.benchmarks.torchtitan_recipe import TORCHTITAN_RECIPES, TorchtitanRecipeError, profiling_args, torchtitan_model
from rayft.benchmarks.train_recipes import RAYFT_BEST, Plan, Timeouts, prepare_model_and_data, recipe_command, recipe_settings
from rayft.benchmarks.train_results import (
    NOT_RUN,
    BenchTrainError,
    float8_check,
    gpu_price,
    markdown_table,
    rayft_records,
    read_step_files,
    summarize,
    usd_per_million_tokens,
    write_table_files,
)

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

SKIPPED = "skipped: no time left"
#: Seconds kept free before ``--deadline-s`` (writing the results), and the least a run is started with.
DEADLINE_MARGIN_S = 10.0
MIN_RUN_S = 30.0


class BenchInterrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C: the results of the runs done so far were written (the others "not run").
    A ``KeyboardInterrupt`` so that no per-run ``except Exception`` records it as a run failure."""


#: The clock of ``--deadline-s`` (tests replace it).
_clock = time.monotonic


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


# ------------------------------------------------------------------------------ running


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
    trl_compile: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Run every recipe × workload, write the results JSON (+ ``.md`` and ``.png`` beside it).

    Args:
        config: a rayft training config (model, data, seq_len, micro_batch_size, num_workers, lr).
        overrides: ``--set`` overrides for the config; passed to the ``rayft`` recipe after its own settings.
        rayft_overrides: ``--rayft-set``: overrides for the rayft recipes only, after ``overrides``
            (e.g. ``train.micro_batch_size=16``: each run's micro-batch is in its results entry).
        trl_compile: ``--trl-compile``: the TRL recipes run with ``SFTConfig(torch_compile=True)``
            (the Trainer compiles the whole model; their rows are labelled ``+ compile``).
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
    from rayft.config import ConfigError
    from rayft.config_load import load_config
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
    if trl_compile and not set(recipes) & set(TRL_RECIPES):
        raise BenchTrainError(f"--trl-compile is for the TRL recipes ({', '.join(TRL_RECIPES)}), and none runs")
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
    plan = Plan(Path(config), overrides, recipes, workloads, steps, warmup_steps, wd, timeout_s, deadline_s, rayft_overrides, trl_compile)
    shared = prepare_model_and_data(cfg, plan, world, console)
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
            *(["--trl-compile"] if trl_compile else []),
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
            "trl_compile": trl_compile,  # --trl-compile: the TRL recipes ran torch.compile'd
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
    console.print(
        f"[{r} × {w}] {plan.steps} steps, limit {'none' if limit is None else format(limit, '.0f')} s → {log}",
        highlight=False,
        markup=False,
    )
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

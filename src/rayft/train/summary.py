"""The run's summary on the driver: the figures of the last and median steps, where the wall
time went, and the table printed at the end."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rayft.train.errors import TrainError


def wall_timeline(marks: dict[str, float], history: list[dict]) -> dict[str, float] | None:
    """Where a run's wall time went, in seconds, from the driver's clock marks (unix seconds:
    ``start``; ``ray_wait`` and ``ray_ready``, the driver's wait for Ray; ``checks_start``;
    ``fit_called``; ``fit_returned``) and the first and last step's metrics (``worker_entry_unix``,
    ``worker_args_unix``, ``time_setup_s``, ``step_time_s``, ``unix_time``). The phases add up to
    ``total``; up to ``fit`` the driver's thread goes through the data phase, the wait for Ray and the
    checks in an order of the run's (:mod:`rayft.train.worker_launch`), and where the workers start
    from inside the data phase, its tokenization runs beside their start and is in no phase (the
    summary's ``data_timings_s`` has the data phase's parts).

    Returns:
        ``data`` (the driver's thread until ``fit``, but for the next two: the data phase's imports,
        the tokenizer, the token store's lookup, and on a store hit or a Ray Data ingest all of it),
        ``ray`` (the wait for Ray: what was left of the embedded Ray's start, which runs on a thread
        from the run's start, :mod:`rayft.train.ray_start`; or joining a cluster), ``checks`` (from
        Ray to ``fit``: the workers' resources, the GPU memory check, the run's actor, where the data
        came first the step plan and the run directory, the trainer's build), ``workers_start`` (fit called → rank 0 ready to train: the Ray Train
        controller, worker processes, process group, the loop's imports), ``data_wait`` (rank 0 ready
        → its arguments arrived: the data phase beyond the workers' start), ``worker_setup`` (model
        build, weight load, optimizer, resume), ``first_step`` (with compilation),
        ``checkpoint_buffers`` (after the first step: the loop's share of the pinned host buffers
        async checkpoint saves reuse, which a thread allocates while the steps run; 0 without),
        ``steps`` (the other steps, with checkpoint saves and evaluations), ``end`` (last step's end →
        fit returns: the final save, export, shutdown), ``total``; None when the metrics lack the
        marks (a run of an older rayft). Clocks of other nodes are compared as they are: on a
        cluster, differences carry their clock offset.
    """
    if not history or "worker_entry_unix" not in history[0] or "unix_time" not in history[-1]:
        return None
    first, last = history[0], history[-1]
    ready = first["worker_entry_unix"]
    ray = marks["ray_ready"] - marks["ray_wait"]
    checks = marks["fit_called"] - marks["checks_start"]
    return {
        "data": marks["fit_called"] - marks["start"] - ray - checks,
        "ray": ray,
        "checks": checks,
        "workers_start": ready - marks["fit_called"],
        "data_wait": first.get("worker_args_unix", ready) - ready,
        "worker_setup": first["time_setup_s"],
        "first_step": first["step_time_s"],
        "checkpoint_buffers": first.get("time_prestage_s", 0.0),
        "steps": last["unix_time"] - first["unix_time"],
        "end": marks["fit_returned"] - last["unix_time"],
        "total": marks["fit_returned"] - marks["start"],
    }


def build_summary(
    history: list[dict],
    extra: dict,
    run_dir: str,
    total: int,
    console: Console,
    wall: dict | None = None,
    stop: dict | None = None,
    clock: dict | None = None,
) -> dict:
    """The run's summary (``rayft_summary.json``), printed as a table.

    ``history``: the reported steps' metrics; ``extra``: :meth:`RunProgress.extra`; ``wall``:
    :func:`wall_timeline`; ``stop``: the driver's ``stopped`` record when a signal stopped the run
    (then a run that reported no step gets a summary too); ``clock``: the wall clock (unix s) where
    ``wall_s``'s timeline starts and ends (``start``, ``end``), which a caller timing the whole
    process compares with its own start and end (the CLI's imports before, Ray's shutdown after).

    Raises:
        TrainError: the run ended without reporting a step (and was not stopped).
    """
    if not history and stop is not None:
        summary = {
            "run_dir": run_dir,
            "steps": 0,
            "total_steps": total,
            "checkpoints": extra["checkpoints"],
            "resumes": extra["resumes"],
            "failures": extra.get("failures", []),
            "wall_s": wall,
            "timeline_unix": clock,
            "stopped": stop,
        }
        t = Table(title="rayft run summary", show_header=False)
        t.add_row("stopped", stop_line(stop))
        print_table(console, t, run_dir, None)
        return summary
    if not history:
        raise TrainError("training finished without reporting a step")
    last = history[-1]
    steady = history[min(3, len(history) - 1) :]
    steady = [h for h in steady if not h.get("profiled")] or steady  # the traced steps run slower (train.profile_steps)
    tps = sorted(h["tokens_per_s_per_gpu"] for h in steady)
    evals = [h for h in history if "eval_loss" in h]
    med = tps[len(tps) // 2]
    summary = {
        "run_dir": run_dir,
        "steps": last["step"],
        "total_steps": total,
        "first_loss": history[0]["loss"],
        "final_loss": last["loss"],
        "median_tokens_per_s_per_gpu": med,
        "median_mfu": sorted(h["mfu"] for h in steady)[len(steady) // 2] if last.get("mfu") is not None else None,
        "peak_mem_gib": max((h["peak_mem_gib"] or 0) for h in history) if last.get("peak_mem_gib") else None,
        "gpu": last["gpu"],
        "world_size": last["world_size"],
        "export": extra["export"],
        "checkpoints": extra["checkpoints"],
        "resumes": extra["resumes"],
        "failures": extra.get("failures", []),
        "eval_loss_initial": extra.get("eval_initial", {}).get("eval_loss"),
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
        "eval_step": evals[-1]["step"] if evals else None,
        "wall_s": wall,
        "timeline_unix": clock,
    }
    if stop is not None:
        summary["stopped"] = stop
    export = extra["export"]
    t = Table(title="rayft run summary", show_header=False)
    t.add_row("steps", f"{last['step']}/{total}")
    t.add_row("loss", f"{history[0]['loss']:.4f} → {last['loss']:.4f}")
    if evals:
        before = f"{summary['eval_loss_initial']:.4f} → " if summary["eval_loss_initial"] is not None else ""
        t.add_row("eval loss", f"{before}{evals[-1]['eval_loss']:.4f} (step {evals[-1]['step']})")
    t.add_row(f"tokens/s/{'GPU' if last['gpu'] != 'cpu' else 'worker'} (median)", f"{med:,.0f}")
    if summary["median_mfu"] is not None:
        t.add_row("MFU (median)", f"{100 * summary['median_mfu']:.1f}% of {last['peak_flops'] / 1e12:.0f} TFLOP/s")
    if summary["peak_mem_gib"]:
        t.add_row("peak GPU memory", f"{summary['peak_mem_gib']:.1f} GiB")
    t.add_row("workers", f"{last['world_size']} × {last['gpu']}")
    if wall:
        t.add_row(
            "wall time", f"{wall['total']:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in wall.items() if k != "total")
        )
    if export:
        vs = ", float8-trained model vs the export" if export.get("trained_float8") else ""
        t.add_row("HF export", export_line(export, vs))
    if stop is not None:
        t.add_row("stopped", stop_line(stop))
    print_table(console, t, run_dir, export.get("export_dir") if export else None)
    return summary


def print_table(console: Console, table, run_dir: str, export_dir: str | None) -> None:
    """Print the summary's table and paths. A console that fails here (its pipe closed: rich
    raises ``SystemExit(1)``, Console.on_broken_pipe) is made quiet instead of losing the summary,
    which the driver writes after this."""
    try:
        console.print(table)
        print_paths(console, run_dir, export_dir)
    except (Exception, SystemExit):  # printing only: the run's records and its exit status matter more
        console.quiet = True


def export_line(export: dict, vs: str) -> str:
    """The summary's export row: the weight check (sharded export) and the logit check or why it was skipped."""
    parts = []
    if export.get("export_max_abs_weight_diff") is not None:
        parts.append(f"weights max |Δ| {export['export_max_abs_weight_diff']:.2e} ({export.get('export_tensors', '?')} tensors)")
    if export.get("export_max_abs_logit_diff") is not None:
        parts.append(f"max |Δlogit| {export['export_max_abs_logit_diff']:.2e} vs the trained model{vs}")
    elif export.get("export_logit_check_skipped"):
        parts.append(f"logit check skipped: {export['export_logit_check_skipped']}")
    return "; ".join(parts)


# where Ray unpacks a submitted job's working_dir (under the session's temporary directory)
RAY_WORKING_DIR_MARK = "/runtime_resources/working_dir_files/"


def print_paths(console: Console, run_dir: str, export_dir: str | None) -> None:
    """The run directory and the HF export, under the table as whole lines (a table cell would cut
    a long path with an ellipsis in a log 80 columns wide), and a warning when they lie inside a
    submitted job's unpacked working_dir, which Ray deletes with its session."""
    console.print(f"run directory: {run_dir}", highlight=False, markup=False, soft_wrap=True)
    if export_dir:
        console.print(f"HF export: {export_dir}", highlight=False, markup=False, soft_wrap=True)
    if RAY_WORKING_DIR_MARK in run_dir:
        console.print(
            "warning: the run directory is inside this job's unpacked working_dir, which Ray deletes with its session: "
            "copy it out now, or set checkpoint.storage_path to s3://... or a shared file system",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def stop_record(
    signal_name: str, stopped, history: list[dict], checkpoint_step: int | None, forced: bool, reason: str | None = None
) -> dict:
    """The summary's ``stopped`` entry: ``signal`` (the driver's, or ``rayft stop``), ``steps_done``,
    ``checkpoint_step`` (None: nothing to resume from), ``forced`` (the driver stopped waiting for
    the workers), ``reason``. ``stopped``: the workers' :class:`StoppedEvent`, None when they sent
    none (they were still starting, or did not stop in time); ``reason``: the stop's reason then
    (else the signal's)."""
    steps_done = stopped.steps_done if stopped is not None else (history[-1]["step"] if history else 0)
    if stopped is not None and stopped.checkpoint_step is not None:
        checkpoint_step = stopped.checkpoint_step
    return {
        "signal": signal_name or "rayft stop",
        "steps_done": steps_done,
        "checkpoint_step": checkpoint_step,
        "forced": forced,
        "reason": stopped.reason if stopped is not None else (reason or f"{signal_name} to the driver"),
    }


def stop_line(stop: dict) -> str:
    """One line for a stopped run: signal, steps done, the checkpoint to resume from."""
    held = f"checkpoint of step {stop['checkpoint_step']}" if stop["checkpoint_step"] is not None else "no checkpoint to resume from"
    forced = " (the driver stopped waiting for the workers)" if stop["forced"] else ""
    return f"by {stop['signal']} after step {stop['steps_done']}{forced}; {held}"

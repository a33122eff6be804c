"""`rayft bench fabric`: the same training job over the fast interconnect and over TCP sockets.

Each of the two variants runs in fresh processes, so that each starts its own embedded Ray (or
joins the cluster) with its own environment:

1. ``python -m rayft.cli train CONFIG --set ...`` with ``NCCL_DEBUG=INFO`` and
   ``ray.log_to_driver=true``, its whole output (workers included) saved to a log file;
2. ``python -m rayft.benchmarks.collectives CONFIG --set ...`` (the bus-bandwidth sweep) under the
   same environment, its output saved too.

Then ``rayft doctor``'s verdicts (:mod:`rayft.nccl.doctor`) are read from both logs, and a run
whose transport is not the one its variant is meant to measure is rejected: a "fast" figure that
fell back to sockets, or a "sockets" figure that still used NVLink, would make the comparison a lie.

Variants (``--mode``):

* ``onehost`` (GPUs of one host): fast is NCCL's default, which must be P2P (NVLink) between the
  GPUs; sockets sets ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`` so that local GPUs talk through
  NCCL's network transport, which must be NET/Socket.
* ``efa`` (several hosts with EFA): fast is the default, which must be EFA between hosts;
  sockets sets ``NCCL_NET=Socket``, which must be NET/Socket everywhere.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rayft.benchmarks.choices import Mode
from rayft.benchmarks.logged_run import LoggedCommandWithDoneFile, log_tail, run_logged
from rayft.nccl.doctor import Expect, RankVerdict, check, verdicts_from_text

OPS = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_STEPS = 30


class FabricError(RuntimeError):
    """The benchmark cannot start, a run failed, or a run used the wrong transport (rejected)."""


@dataclass(frozen=True)
class Variant:
    """One side of the comparison: its name, the environment it adds, the transport it must use."""

    name: str
    env: dict[str, str]
    expect: Expect
    forced: dict[str, str] = field(default_factory=dict)  # the other side's switches, removed here


_DEBUG = {"NCCL_DEBUG": "INFO", "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
_ONEHOST_SOCKETS = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
_EFA_SOCKETS = {"NCCL_NET": "Socket"}


def variants(mode: Mode | str) -> tuple[Variant, Variant]:
    """The (fast, sockets) variants of ``mode`` (``onehost`` or ``efa``).

    Raises:
        ValueError: an unknown mode.
    """
    mode = Mode(mode)
    forced = _ONEHOST_SOCKETS if mode == Mode.ONEHOST else _EFA_SOCKETS
    fast_expect = Expect.NVLINK if mode == Mode.ONEHOST else Expect.EFA
    return (
        Variant("fast", dict(_DEBUG), fast_expect, forced=dict(forced)),
        Variant("sockets", {**_DEBUG, **forced}, Expect.SOCKET),
    )


def variant_env(base: dict[str, str], v: Variant) -> dict[str, str]:
    """``base`` (usually ``os.environ``) with ``v``'s variables set, and for the fast variant the
    sockets variant's switches removed where they carry the forcing value."""
    env = {k: val for k, val in base.items() if not (k in v.forced and val == v.forced[k])}
    env.update(v.env)
    return env


# ------------------------------------------------------------------------------------ verdicts


def transport_label(verdicts: list[RankVerdict]) -> str:
    """What the ranks used, in words: the distinct inter-node and intra-node transports."""
    parts: list[str] = []
    for v in verdicts:
        bits = []
        if v.inter_node.value not in ("none", "unknown"):
            bits.append(f"inter-node {v.inter_detail or v.inter_node.value}")
        if v.intra_node.value not in ("none", "unknown"):
            bits.append(f"intra-node {v.intra_detail or v.intra_node.value}")
        label = "; ".join(bits) or "unknown"
        if label not in parts:
            parts.append(label)
    return " | ".join(parts)


def check_log(text: str, expect: Expect | str, what: str) -> str:
    """Verify from one run's NCCL_DEBUG=INFO output that every rank used ``expect``.

    Args:
        text: the run's whole output (driver and workers).
        expect: ``nvlink``, ``efa`` or ``socket`` (see :class:`rayft.nccl.doctor.Expect`).
        what: the run's name for the message, e.g. ``fast training (log /tmp/x.log)``.

    Returns:
        The transport actually used, in words (:func:`transport_label`).
    Raises:
        FabricError: no NCCL line in the log, or the doctor's problems (the run is rejected).
    """
    expect = Expect(expect)
    verdicts = verdicts_from_text(text)
    if not verdicts:
        raise FabricError(
            f"{what}: no NCCL lines in the output, so its transport cannot be verified "
            "(NCCL_DEBUG=INFO not reaching the workers, or CPU workers with gloo)"
        )
    problems = check(verdicts, expect)
    if problems:
        raise FabricError(f"{what} rejected: expected {expect.value}, but " + "; ".join(problems))
    return transport_label(verdicts)


# ------------------------------------------------------------------------------------ metrics


def median_tokens_per_s(metrics_file: str | os.PathLike, skip_steps: int = 3) -> dict[str, Any]:
    """Median ``tokens_per_s_per_gpu`` of a run's ``rayft_metrics.jsonl`` over the steps after
    the first ``skip_steps`` (start-up: allocation, first NCCL connections, compilation).

    Returns:
        ``median_tokens_per_s_per_gpu`` (tokens/s per worker), ``steps_measured``, ``world_size``,
        ``gpu`` (from the last step).
    Raises:
        FabricError: a missing or unreadable file, or no step left after ``skip_steps``.
    """
    path = Path(metrics_file)
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise FabricError(f"cannot read the run's metrics {path}: {e}") from None
    steady = [r for r in rows if r.get("step", 0) > skip_steps and "tokens_per_s_per_gpu" in r]
    if not steady:
        raise FabricError(
            f"{path}: {len(rows)} steps logged, none after the first {skip_steps} (start-up); run more steps (--steps) than {skip_steps}"
        )
    return {
        "median_tokens_per_s_per_gpu": statistics.median(r["tokens_per_s_per_gpu"] for r in steady),
        "steps_measured": len(steady),
        "world_size": rows[-1].get("world_size"),
        "gpu": rows[-1].get("gpu"),
    }


def gpu_label(gpu: str | None, world_size: int | None) -> str:
    """``2xh200`` from ``NVIDIA H200`` and 2 (for results file names); ``2xcpu`` on CPU workers."""
    name = re.sub(r"^nvidia\s+", "", (gpu or "unknown").strip().lower())
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"
    return f"{world_size or '?'}x{name}"


def run_fabric(
    config: str | os.PathLike,
    overrides: list[str] | None = None,
    mode: Mode | str = Mode.ONEHOST,
    steps: int | None = None,
    out: str | os.PathLike | None = None,
    logs_dir: str | os.PathLike | None = None,
    skip_steps: int = 3,
    sweep_max_bytes: int | None = None,
    timeout_s: float | None = None,
    console: Console | None = None,
    runner: LoggedCommandWithDoneFile = run_logged,
) -> tuple[Path, dict[str, Any]]:
    """Run both variants (training + collectives sweep each), verify their transports, write the
    results file.

    Args:
        config: the training job's YAML.
        overrides: ``--set`` overrides passed to every run (before the benchmark's own:
            ``train.max_steps``, ``ray.log_to_driver=true``, ``checkpoint.name``).
        mode: ``onehost`` or ``efa`` (see the module doc).
        steps: optimizer steps per training run; default the config's ``train.max_steps`` (after
            ``overrides``), else 30.
        out: results file; default ``bench/results/<date>-fabric-<N>x<gpu>.json``.
        logs_dir: where the four logs and two sweep files go; default
            ``<checkpoint.storage_path>/fabric-<time>-logs``.
        skip_steps: leading steps left out of the tokens/s median.
        sweep_max_bytes: largest collective message (default: the sweep's own).
        timeout_s: limit per subprocess, in seconds.
        runner: runs one subprocess into a log (tests replace it).

    Returns:
        ``(results file, figures)``.
    Raises:
        FabricError: a bad config, a failed run (with the tail of its log), or a run whose
            NCCL transport was not the expected one (the run is rejected; nothing is written).
    """
    from rayft.benchmarks.record import write_result
    from rayft.config import ConfigError
    from rayft.config_load import load_config
    from rayft.train.run_dir import run_dir_of

    console = console or Console(stderr=True)
    mode = Mode(mode)
    overrides = list(overrides or [])
    try:
        if steps is None:
            steps = load_config(Path(config), overrides).train.max_steps or DEFAULT_STEPS
        if steps <= skip_steps:
            raise FabricError(f"{steps} steps leave no step after the {skip_steps} start-up steps (--steps, --skip-steps)")
        own = [f"train.max_steps={steps}", "ray.log_to_driver=true"]
        cfg = load_config(Path(config), overrides + own)
    except ConfigError as e:
        raise FabricError(f"config error: {e}") from None
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    if "://" in cfg.checkpoint.storage_path:
        raise FabricError(
            f"checkpoint.storage_path={cfg.checkpoint.storage_path}: the benchmark reads each run's "
            "metrics file, so it needs a local or mounted path (--set checkpoint.storage_path=/tmp/runs)"
        )
    logs = Path(logs_dir) if logs_dir else Path(cfg.checkpoint.storage_path) / f"fabric-{stamp}-logs"
    py = sys.executable
    runs: dict[str, dict[str, Any]] = {}
    for v in variants(mode):
        name = f"fabric-{stamp}-{v.name}"
        run_dir = Path(run_dir_of(cfg, name))
        if run_dir.exists():
            raise FabricError(f"{run_dir} already exists; wait a second and run again")
        sets = overrides + own + [f"checkpoint.name={name}"]
        set_args = [a for s in sets for a in ("--set", s)]
        env = variant_env(dict(os.environ), v)
        shown = " ".join(f"{k}={val}" for k, val in v.env.items() if k.startswith("NCCL_"))

        train_log = logs / f"{v.name}-train.log"
        console.print(f"[{v.name}] training {steps} steps ({shown}) → {train_log}", highlight=False, markup=False)
        rc = runner(
            [py, "-m", "rayft.cli", "train", str(config), *set_args], env, train_log, timeout_s, done_file=run_dir / "rayft_summary.json"
        )
        lingered = rc == 124 and (run_dir / "rayft_summary.json").is_file()
        if lingered:  # the run finished and wrote its summary; only its process outlived the limit
            console.print(
                f"[{v.name}] warning: training finished (its summary is written) but its process did not exit; "
                "stopped it and using the finished run",
                highlight=False,
                markup=False,
            )
        elif rc != 0:
            raise FabricError(f"{v.name} training failed (exit {rc}); end of {train_log}:\n{log_tail(train_log)}")
        train_transport = check_log(train_log.read_text(errors="replace"), v.expect, f"{v.name} training ({train_log})")
        tps = median_tokens_per_s(run_dir / "rayft_metrics.jsonl", skip_steps)

        sweep_log, sweep_json = logs / f"{v.name}-sweep.log", logs / f"{v.name}-sweep.json"
        console.print(f"[{v.name}] collectives sweep → {sweep_log}", highlight=False, markup=False)
        cmd = [py, "-m", "rayft.benchmarks.collectives", str(config), *set_args, "--out", str(sweep_json)]
        if sweep_max_bytes:
            cmd += ["--max-bytes", str(sweep_max_bytes)]
        rc = runner(cmd, env, sweep_log, timeout_s)
        if rc != 0:
            raise FabricError(f"{v.name} collectives sweep failed (exit {rc}); end of {sweep_log}:\n{log_tail(sweep_log)}")
        sweep_transport = check_log(sweep_log.read_text(errors="replace"), v.expect, f"{v.name} sweep ({sweep_log})")
        try:
            sweep = json.loads(sweep_json.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise FabricError(f"{v.name} sweep wrote no readable figures at {sweep_json}: {e}") from None

        runs[v.name] = {
            "train_process_outlived_limit": lingered,
            "env": v.env,
            "expect": v.expect.value,
            "transport": train_transport,
            "sweep_transport": sweep_transport,
            **tps,
            "run_dir": str(run_dir),
            "train_log": str(train_log),
            "sweep_log": str(sweep_log),
            "collectives": sweep,
        }
        console.print(
            f"[{v.name}] {v.expect.value} verified: {train_transport}; {tps['median_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU",
            highlight=False,
            markup=False,
        )

    fast, slow = runs["fast"], runs["sockets"]
    figures = {
        "mode": mode.value,
        "steps": steps,
        "skip_steps": skip_steps,
        "tokens_per_s_per_gpu_fast": fast["median_tokens_per_s_per_gpu"],
        "tokens_per_s_per_gpu_sockets": slow["median_tokens_per_s_per_gpu"],
        "tokens_per_s_ratio_fast_over_sockets": fast["median_tokens_per_s_per_gpu"] / slow["median_tokens_per_s_per_gpu"],
        "peak_busbw_GB_s": {name: r["collectives"]["peak_busbw_GB_s"] for name, r in runs.items()},
        "runs": runs,
    }
    if out is None:
        label = gpu_label(fast.get("gpu"), fast.get("world_size"))
        out = Path("bench/results") / f"{dt.date.today():%Y-%m-%d}-fabric-{label}.json"
    command = " ".join(
        [
            "rayft bench fabric",
            shlex.quote(str(config)),
            "--mode",
            mode.value,
            "--steps",
            str(steps),
            *(a for s in overrides for a in ("--set", shlex.quote(s))),
        ]
    )
    path = write_result(out, command, figures)
    return path, figures


def markdown_table(figures: dict[str, Any]) -> str:
    """The comparison as a Markdown table: transport, tokens/s/GPU and peak bus bandwidth per run."""
    head = "| run | transport (doctor) | tokens/s/GPU (median) | " + " | ".join(f"{op} busbw GB/s" for op in OPS) + " |"
    lines = [head, "|" + " --- |" * (3 + len(OPS))]
    for name, r in figures["runs"].items():
        bw = r["collectives"]["peak_busbw_GB_s"]
        lines.append(
            f"| {name} | {r['transport']} | {r['median_tokens_per_s_per_gpu']:,.0f} | " + " | ".join(f"{bw[op]:.1f}" for op in OPS) + " |"
        )
    lines.append("")
    lines.append(
        f"fast / sockets tokens/s/GPU: {figures['tokens_per_s_ratio_fast_over_sockets']:.2f}x "
        f"(median of steps {figures['skip_steps'] + 1}..{figures['steps']}; busbw: peak over message sizes)"
    )
    return "\n".join(lines)

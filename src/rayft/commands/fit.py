"""`rayft fit`: will this config fit its GPUs? The per-GPU memory predicted part by part
(:mod:`rayft.train.memory_plan`), a verdict and the largest micro-batch that fits."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit, print_error


def fit(
    config: ConfigArg,
    set_: SetOpt = None,
    gpus: Annotated[
        Optional[str],
        typer.Option(help="<count>x<GPU>, e.g. 8xL4, 16xH100 (default: the cluster: section's nodes × the instance's GPUs)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Predict one GPU's memory for this config (sharded state, gathered weights, activations, loss)
    and say whether it fits; exit 1 when it does not."""
    cfg = load_config_or_exit(config, set_)
    from rayft.train.memory_plan import capped, choose_single_worker, cluster_gpus, judge, model_dims, parse_gpus, train_shape
    from rayft.train.model_config import load_model_config

    try:
        target = parse_gpus(gpus) if gpus else cluster_gpus(cfg)
        if target is not None and not gpus:
            target = capped(target, cfg)  # train.num_workers and train.gpu_memory_limit_gib
    except ValueError as e:
        print_error("error", e)
        raise typer.Exit(2) from None
    if target is None:
        print_error("error", ValueError(f"{config}: no cluster: section with a GPU instance type; say which GPUs with --gpus, e.g. 8xL4"))
        raise typer.Exit(2)
    from rayft.train.hub import offline_when_unreachable

    offline_when_unreachable([cfg.model.name_or_path], lambda text: console.print(text, highlight=False, markup=False))
    try:
        conf = load_model_config(cfg.model)
    except (OSError, ValueError) as e:
        print_error("error", ValueError(f"{config}: model.name_or_path={cfg.model.name_or_path}: cannot read its config: {e}"))
        raise typer.Exit(2) from None
    # what `rayft train` runs on this GPU
    choose_single_worker(cfg, target, lambda text: console.print(text, highlight=False, markup=False))
    dims = model_dims(conf)
    shape = train_shape(cfg, target.count, conf)
    verdict = judge(dims, shape, target)
    if cfg.train.cross_entropy == "auto" and not shape.fused_loss:
        verdict.plan.notes.append(
            "train.cross_entropy: auto counted as the plain loss (whole logits): liger-kernel is not installed here or the "
            "model transforms its logits; --set train.cross_entropy=fused counts the fused loss the GPU workers would run"
        )
    g = 2**30
    if as_json:
        out = {
            "model": cfg.model.name_or_path,
            "params": dims.params,
            "gpus": {"count": target.count, "model": target.model, "memory_gib": target.memory / g, "source": target.source},
            "phase": verdict.plan.phase,
            "parts_gib": {k: v / g for k, v in verdict.plan.parts.items()},
            "peak_allocated_gib": verdict.plan.peak / g,
            "needed_gib": verdict.plan.needed() / g,
            "host_per_gpu_gib": verdict.plan.host_per_gpu / g,
            "fits": verdict.fits,
            "largest_micro_batch": verdict.largest_micro_batch,
            "advice": verdict.advice,
            "notes": verdict.plan.notes,
        }
        print(json.dumps(out, indent=2))
    else:
        from rich.table import Table

        t = Table(
            title=f"{cfg.model.name_or_path} ({dims.params / 1e9:.2f}B parameters) on {target.count}× {target.model}", title_justify="left"
        )
        t.add_column("per GPU, at the " + verdict.plan.phase)
        t.add_column("GiB", justify="right")
        for name, nbytes in verdict.plan.parts.items():
            t.add_row(name, f"{nbytes / g:.2f}")
        t.add_row("allocated peak (torch.cuda.max_memory_allocated)", f"{verdict.plan.peak / g:.2f}", style="bold")
        t.add_row("+ allocator slack, CUDA context, NCCL buffers", f"{(verdict.plan.needed() - verdict.plan.peak) / g:.2f}")
        t.add_row(f"GPU memory ({target.source})", f"{target.memory / g:.2f}")
        if verdict.plan.host_per_gpu:
            t.add_row("host memory per GPU (offloaded shards)", f"{verdict.plan.host_per_gpu / g:.2f}")
        console.print(t)
        for note in verdict.plan.notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        console.print(verdict.line(), highlight=False, markup=False)
    if not verdict.fits:
        raise typer.Exit(1)

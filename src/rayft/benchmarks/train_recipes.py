"""What each recipe of `rayft bench train` runs (:mod:`rayft.benchmarks.train`): the shared inputs
every recipe starts from (:func:`prepare_model_and_data`: one seeded initial model, the tokenizer,
the token ids of each workload), the subprocess command of one recipe × workload
(:func:`recipe_command`) and the settings it ran with (:func:`recipe_settings`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from rayft.benchmarks.choices import RAYFT_RECIPES, TRL_RECIPES
from rayft.benchmarks.torchtitan_recipe import TORCHTITAN_RECIPES, TorchtitanRecipeError, check_preset_shape
from rayft.benchmarks.train_results import BenchTrainError

Timeouts = float | dict[str, float] | None

# Settings each recipe adds to the user's config (before the user's --set, which win).
RAYFT_BEST = ["train.compile=true", "train.cross_entropy=auto", "model.attn_implementation=auto", "data.packing=true"]


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
    trl_compile: bool = False  # --trl-compile: the TRL recipes with SFTConfig(torch_compile=True)


def prepare_model_and_data(cfg, plan: Plan, world: int, console: Console) -> dict[str, Any]:
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
            from rayft.config_load import load_config

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
    if recipe in TRL_RECIPES:
        spec["compile"] = plan.trl_compile
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
        from rayft.config_load import load_config

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
    if planned["compile"]:  # the row still says it was the compiled run
        planned["label"] = f"{recipe} + compile"
    if recipe == "trl-best" and spec["use_gpu"]:
        planned["attention"] = "auto (rayft varlen on CUDA with torch varlen_attn and a TRL passing cu_seq_lens_q, else sdpa)"
    return planned

"""`rayft bench train`'s torchtitan recipes, ``torchtitan`` and ``torchtitan-fp8`` (issue 23's peer):
torchtitan's own ``Trainer`` (its train step, model, compile, float8 converter and optimizer) on the
bench's rows, run under ``torchrun`` from one run spec (JSON), writing the per-step records of
:mod:`rayft.benchmarks.recipes` (``steps.rank<R>.jsonl``).

What is torchtitan's and what is added here:

* torchtitan 0.2.2 from PyPI (``pip install torchtitan==0.2.2``): the last release built against a
  stable PyTorch (2.10, February 2026); 0.3.0 follows PyTorch nightlies. Its Qwen3 and Llama 3
  models (:data:`TORCHTITAN_MODELS`: which rayft preset is which torchtitan flavour; the preset's
  shape is checked against the flavour's before anything runs) with torchtitan's own seeded init:
  the weights differ from the other recipes' (the throughput does not depend on them).
* Its ``TrainSpec`` with one part replaced, through torchtitan's ``register_train_spec`` extension
  point: the data loader yields the bench's rows (the same ``data.npz`` every recipe reads), one
  example per row right-padded to ``seq_len`` (torchtitan's SDPA attention has no document
  masking, so no packing), inputs = the row, labels = the row shifted left by one with -100 on
  padding and on the last position (the same seq_len − 1 predicted tokens per full row as the
  Hugging Face recipes).
* A ``Trainer`` subclass that times each ``train_step`` (device synchronised at both ends) and
  writes the records; torchtitan's own logging stays on (``metrics.log_freq``).

Settings (``torchtitan_args``): ``compile.enable`` (model and loss, torchtitan's default
components), activation checkpointing ``none`` or ``full`` (the bench's
``train.activation_checkpointing``), AdamW (torchtitan's fused implementation) at the spec's lr with
1 warmup step, bf16 mixed precision with fp32 master weights (on one GPU torchtitan uses autocast
instead of FSDP2, which it applies from 2 data-parallel ranks up), float8 for ``torchtitan-fp8``
with torchtitan's float8 converter (tensorwise scaling, the output layer left in bf16 as rayft's
float8 leaves its LM head).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rayft.benchmarks.recipes import IGNORE_INDEX, StepLog, load_dataset, padded_batch, step_rows

TORCHTITAN_RECIPES = ("torchtitan", "torchtitan-fp8")
#: The torchtitan release these recipes are written against (its config flags and Trainer).
TORCHTITAN_VERSION = "0.2.2"
#: The name the recipe's ``TrainSpec`` is registered under.
SPEC_NAME = "rayft_bench_rows"

#: rayft preset → (torchtitan model, flavour, the flavour's shape as Hugging Face config fields).
#: The shape is what :func:`check_preset_shape` compares with the preset's config; torchtitan's own
#: args are compared again at run time (:func:`check_flavour_args`).
TORCHTITAN_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen3-0.6b": (
        "qwen3",
        "0.6B",
        dict(
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
    ),  # fmt: skip
    "qwen3-1.7b": (
        "qwen3",
        "1.7B",
        dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
    ),  # fmt: skip
    "qwen3-8b": (
        "qwen3",
        "8B",
        dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
    "llama-3.1-8b": (
        "llama3",
        "8B",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=False,
        ),
    ),  # fmt: skip
}


class TorchtitanRecipeError(RuntimeError):
    """A bench config the torchtitan recipes cannot run (a model torchtitan has no flavour for, a shape mismatch)."""


def torchtitan_model(preset: str) -> tuple[str, str]:
    """(torchtitan model name, flavour) of a rayft preset.

    Raises:
        TorchtitanRecipeError: the preset has no torchtitan flavour here (names the ones that do).
    """
    if preset not in TORCHTITAN_MODELS:
        raise TorchtitanRecipeError(
            f"model.name_or_path={preset!r}: the torchtitan recipes run the presets with a torchtitan flavour "
            f"({', '.join(TORCHTITAN_MODELS)}); torchtitan builds its own model, so a hub id or directory cannot be given to it"
        )
    name, flavour, _ = TORCHTITAN_MODELS[preset]
    return name, flavour


def check_preset_shape(preset: str, config: Any) -> None:
    """The preset's Hugging Face config has the flavour's shape (``config``: a ``PretrainedConfig``).

    Raises:
        TorchtitanRecipeError: a field differs (names it and both values).
    """
    torchtitan_model(preset)
    for key, want in TORCHTITAN_MODELS[preset][2].items():
        got = getattr(config, key, None)
        if got != want:
            raise TorchtitanRecipeError(f"preset {preset}: {key} is {got!r}, torchtitan's flavour has {want!r}")


def check_flavour_args(preset: str, args: Any) -> None:
    """torchtitan's model args (``Qwen3ModelArgs`` / ``TransformerModelArgs``) have the preset's shape.

    Raises:
        TorchtitanRecipeError: a field differs.
    """
    shape = TORCHTITAN_MODELS[preset][2]
    pairs = {
        "dim": shape["hidden_size"],
        "n_layers": shape["num_hidden_layers"],
        "n_heads": shape["num_attention_heads"],
        "n_kv_heads": shape["num_key_value_heads"],
        "vocab_size": shape["vocab_size"],
    }
    if "head_dim" in shape:
        pairs["head_dim"] = shape["head_dim"]
    if hasattr(args, "hidden_dim") and not hasattr(args, "ffn_dim_multiplier"):  # Qwen3: the MLP width itself
        pairs["hidden_dim"] = shape["intermediate_size"]
    for key, want in pairs.items():
        got = getattr(args, key, None)
        if got != want:
            raise TorchtitanRecipeError(
                f"torchtitan {TORCHTITAN_MODELS[preset][0]} {TORCHTITAN_MODELS[preset][1]}: {key} is {got!r}, preset {preset} has {want!r}"
            )


def torchtitan_args(spec: dict[str, Any]) -> list[str]:
    """torchtitan's command-line flags for one run (its ``ConfigManager`` reads them).

    ``spec`` keys used: ``preset``, ``seq_len``, ``micro_batch_size``, ``steps``, ``lr``, ``seed``,
    ``activation_checkpointing``, ``float8``, ``compile``, ``out_dir``, ``profile_steps`` (optional).
    """
    _, flavour = torchtitan_model(spec["preset"])
    args = [
        "--model.name", SPEC_NAME,
        "--model.flavor", flavour,
        "--training.seq_len", str(spec["seq_len"]),
        "--training.local_batch_size", str(spec["micro_batch_size"]),
        "--training.steps", str(spec["steps"]),
        "--training.max_norm", "1.0",
        "--optimizer.lr", str(spec["lr"]),
        "--lr_scheduler.warmup_steps", "1",
        "--activation_checkpoint.mode", "full" if spec["activation_checkpointing"] else "none",
        "--metrics.log_freq", "1",
        "--debug.seed", str(spec["seed"]),
        "--job.dump_folder", str(Path(spec["out_dir"]) / "torchtitan"),
    ]  # fmt: skip
    if spec["compile"]:
        args.append("--compile.enable")
    if spec["float8"]:
        args += ["--model.converters", "quantize.linear.float8", "--quantize.linear.float8.filter_fqns", "output"]
    if spec.get("profile_steps"):
        args += profiling_args(*spec["profile_steps"], steps=spec["steps"])
    return args


def profiling_args(first: int, last: int, steps: int) -> list[str]:
    """torchtitan's profiler over its training steps ``first``..``last`` (1-based, as rayft's
    ``train.profile_steps``) of a run of ``steps``: its schedule waits, warms up on the step before
    ``first`` and records ``last - first + 1`` steps, and writes
    ``profile_traces/iteration_<last>/rank<N>_trace.json``.

    Raises:
        TorchtitanRecipeError: ``first`` is 1 (without a warm-up step, leaving the profiler after
            the run saves a new, empty recording over the window's trace); ``steps`` goes past
            ``first + last - 2``: torchtitan's schedule repeats every ``last`` steps and would
            profile the following ones again (unmarked, and slowed by the trace's export); or
            ``last`` lies past the run.
    """
    if first < 2:
        # no warm-up step: the profiler's step after the last training step starts the next cycle's
        # recording, and leaving the profiler saves that one over iteration_<last>
        raise TorchtitanRecipeError(
            f"train.profile_steps=[{first}, {last}]: torchtitan's profiler needs FIRST >= 2 (a warm-up step before the window)"
        )
    warmup = 1
    longest = first + last - 2  # the next cycle warms up at the step after
    if not first <= last <= steps <= longest:
        raise TorchtitanRecipeError(
            f"train.profile_steps=[{first}, {last}] with {steps} steps: torchtitan's profiler traces steps {first}-{last} once "
            f"only in a run of {last} to {longest} steps (its schedule repeats every {last} steps)"
        )
    active = last - first + 1
    return [
        "--profiling.enable_profiling",
        "--profiling.save_traces_folder", "profile_traces",
        "--profiling.profile_freq", str(last),
        "--profiling.profiler_warmup", str(warmup),
        "--profiling.profiler_active", str(active),
    ]  # fmt: skip


def command(spec_file: str | os.PathLike, world: int) -> list[str]:
    """The recipe's subprocess command line: ``torchrun`` (one process per GPU) running :func:`main`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", "-m", __name__, str(spec_file)]


def planned_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The run's settings in the bench table's terms."""
    return {
        "attention": "sdpa (torchtitan)",
        "padding_free": False,
        "liger": False,
        "gradient_checkpointing": bool(spec["activation_checkpointing"]),
        "fsdp": 2 if spec["num_workers"] > 1 else "none (1 GPU: autocast)",
        "cross_entropy": "torchtitan (full logits, compiled)" if spec["compile"] else "torchtitan (full logits)",
        "compile": bool(spec["compile"]),
        "float8": bool(spec["float8"]),
        "micro_batch_size": spec["micro_batch_size"],
        "torchtitan": TORCHTITAN_VERSION,
    }


def shifted_rows(batch: dict[str, Any]) -> tuple[Any, Any]:
    """(inputs, labels) for torchtitan from :func:`~rayft.benchmarks.recipes.padded_batch`'s batch:
    inputs int64 [B, S] = the rows; labels int64 [B, S] = each row shifted left by one, -100 where
    the next token is padding and at the last position (torchtitan's loss does not shift)."""
    import torch

    ids, labels = batch["input_ids"], batch["labels"]
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    return ids, shifted


def register_spec(spec: dict[str, Any], rank: int, world: int, counts: list[tuple[int, float]]) -> None:
    """Register :data:`SPEC_NAME`: torchtitan's train spec of the preset's model with the bench's
    rows as its data loader (no tokenizer). Each batch's (tokens, Σ length²) goes to ``counts``."""
    import dataclasses

    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    name, _ = torchtitan_model(spec["preset"])
    base = get_train_spec(name)
    ds = load_dataset(spec["data"])
    mb, seq_len, pad_id = spec["micro_batch_size"], spec["seq_len"], spec["pad_id"]

    class BenchRows(BaseDataLoader):
        def __iter__(self):
            for step in range(spec["steps"]):
                b = padded_batch(ds, step_rows(len(ds), step, world * mb)[rank::world], seq_len, pad_id)
                counts.append((b["tokens"], b["attn_tokens_sq"]))
                inputs, labels = shifted_rows(b)
                yield {"input": inputs}, labels

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            pass

    def build_loader(**_):
        return BenchRows()

    register_train_spec(
        SPEC_NAME, dataclasses.replace(base, build_dataloader_fn=build_loader, build_tokenizer_fn=None, build_validator_fn=None)
    )


def main(argv: list[str] | None = None) -> None:
    """One process of a torchtitan recipe (under ``torchrun``): ``python -m rayft.benchmarks.torchtitan_recipe SPEC.json``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: torchrun ... -m rayft.benchmarks.torchtitan_recipe SPEC.json")
    spec = json.loads(Path(argv[0]).read_text())
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    # torchtitan's ConfigManager.parse_args reads sys.argv[1:] as its default argument, bound when
    # its module is imported: the flags go into sys.argv before the first torchtitan import
    sys.argv = [sys.argv[0], *torchtitan_args(spec)]
    import torch
    from torchtitan.train import Trainer
    from torchtitan.train import main as torchtitan_main

    counts: list[tuple[int, float]] = []  # FIFO: a batch is fetched inside train_step
    register_spec(spec, rank, world, counts)
    log = StepLog(spec["out_dir"], rank)

    class TimedTrainer(Trainer):
        def __init__(self, job_config):
            super().__init__(job_config)
            check_flavour_args(spec["preset"], self.model_args)
            if rank == 0:
                settings = {**planned_settings(spec), "torchtitan_flags": sys.argv[1:]}
                (Path(spec["out_dir"]) / "settings.json").write_text(json.dumps(settings, indent=2))
            torch.cuda.reset_peak_memory_stats(self.device)
            self.t_last: float | None = None
            # torchtitan resets the device's peak at every log (each step here): the peak since the
            # last record is kept before each of those resets
            self.peak_gib = 0.0
            monitor = self.metrics_processor.device_memory_monitor
            reset = monitor.reset_peak_stats

            def keep_peak_then_reset() -> None:
                self.peak_gib = max(self.peak_gib, torch.cuda.max_memory_allocated(self.device) / 2**30)
                reset()

            monitor.reset_peak_stats = keep_peak_then_reset

        def train_step(self, data_iterator):
            if self.t_last is None:
                torch.cuda.synchronize(self.device)
                self.t_last = time.perf_counter()
            super().train_step(data_iterator)
            torch.cuda.synchronize(self.device)
            now = time.perf_counter()
            tokens, sq = counts.pop(0) if counts else (0, 0.0)
            log.write(
                {
                    "step": self.step,
                    "step_time_s": now - self.t_last,
                    "tokens": tokens,
                    "attn_tokens_sq": sq,
                    "peak_mem_gib": max(self.peak_gib, torch.cuda.max_memory_allocated(self.device) / 2**30),
                }
            )
            self.t_last = now

    torchtitan_main(TimedTrainer)


if __name__ == "__main__":
    main()

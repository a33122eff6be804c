"""The recipes `rayft bench train` compares, other than `rayft` itself (which runs as
``python -m rayft.cli train``). Each runs in a fresh process from one run spec (JSON) and writes
per-step records ``steps.rank<R>.jsonl`` into the spec's ``out_dir``, one line per optimizer step:

``step``; ``step_time_s`` (wall seconds from the end of the previous step to the end of this one,
after a device synchronise); ``tokens`` (this rank's non-padding tokens in the step's batch);
``attn_tokens_sq`` (Σ document length² of those tokens, for the attention FLOPs term of
:func:`rayft.train.metrics.flops_per_token`); ``peak_mem_gib`` (``torch.cuda.max_memory_allocated``,
GiB, None on CPU); ``loss``.

* ``sample-recipe`` (``python -m rayft.benchmarks.recipes sample SPEC``): the training function of the
  AWS sample (aws-samples/sample-aws-deep-learning-containers, training/ray-train/code/train.py)
  rewritten here as a Ray Train ``TorchTrainer`` function: the model loaded in bf16, wrapped in FSDP1
  (``FullyShardedDataParallel``, ``size_based_auto_wrap_policy`` at ``min_num_params=1e7``, what the
  sample passes to ``ray.train.torch.prepare_model``), ``torch.optim.AdamW`` on the bf16 parameters,
  ``model(input_ids=..., labels=input_ids).loss`` (HF shifts the labels), ``ray.train.report`` every
  step. Rows are padded to the fixed sequence length, one example per row, no packing; padding has
  attention mask 0 and label -100 (the sample itself never pads: its rows are random full-length ids).
  FSDP1 gets ``device_id`` so that it also runs on CPU workers (gloo) for tests; on a GPU this is
  what ``prepare_model`` does with the model already on the device.
* ``trl-default`` / ``trl-best`` (``torchrun ... -m rayft.benchmarks.recipes trl SPEC``): TRL's
  ``SFTTrainer`` with FSDP (full_shard, auto-wrap on the decoder layer class, bf16), the same
  tokenized rows (TRL skips its own tokenization for a dataset with ``input_ids``), ``max_steps``, no
  evaluation or saving; a ``TrainerCallback`` writes the records. ``trl-best`` adds TRL's packing
  (``packing=True``; TRL's default BFD strategy turns padding-free batches on) and
  ``use_liger_kernel`` when liger-kernel is installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayft.data.tokenize import TokenizedDataset

IGNORE_INDEX = -100
DATA_FILE = "data.npz"
SETTINGS_FILE = "settings.json"  # a TRL run's effective settings (rank 0)


# ------------------------------------------------------------------------------ shared helpers


def save_dataset(ds: TokenizedDataset, path: str | os.PathLike) -> None:
    """Write a tokenized dataset (tokens, trainable mask, offsets) as an ``.npz``."""
    np.savez(path, tokens=ds.tokens, trainable=ds.trainable, offsets=ds.offsets)


def load_dataset(path: str | os.PathLike) -> TokenizedDataset:
    with np.load(path) as z:
        return TokenizedDataset(z["tokens"], z["trainable"], z["offsets"])


def step_rows(n_examples: int, step: int, rows_per_step: int) -> list[int]:
    """Example indices of global step ``step`` (0-based): consecutive, wrapping around the data."""
    return [(step * rows_per_step + j) % n_examples for j in range(rows_per_step)]


def rank_rows(n_examples: int, step: int, micro_batch: int, rank: int, world: int) -> list[int]:
    """Rank ``rank``'s example indices of global step ``step`` (0-based) in the sample recipe: the
    step's ``world × micro_batch`` consecutive examples (:func:`step_rows`), dealt out in turn."""
    return step_rows(n_examples, step, world * micro_batch)[rank::world]


def padded_batch(ds: TokenizedDataset, idx: list[int], seq_len: int, pad_id: int) -> dict[str, Any]:
    """One example per row, right-padded to ``seq_len`` (the sample recipe's batch).

    Returns:
        ``input_ids``, ``attention_mask``, ``labels`` int64 [B, seq_len] (labels = input ids, -100
        on padding; the model shifts them), ``tokens`` (non-padding count) and ``attn_tokens_sq``
        (Σ row length²).
    """
    import torch

    ids = torch.full((len(idx), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), seq_len), dtype=torch.long)
    n_tok, sq = 0, 0.0
    for b, i in enumerate(idx):
        tok = ds.example(i)[0][:seq_len]
        ids[b, : len(tok)] = torch.from_numpy(tok.astype(np.int64))
        mask[b, : len(tok)] = 1
        n_tok += len(tok)
        sq += float(len(tok)) ** 2
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "tokens": n_tok, "attn_tokens_sq": sq}


def batch_token_stats(batch: dict[str, Any]) -> tuple[int, float]:
    """(non-padding tokens, Σ document length²) of a collated batch, whatever its layout.

    Padding-free / packed batches carry ``position_ids`` that restart at 0 for each document (the
    right padding of a padding-free row, if any, is position 0 runs excluded by ``attention_mask`` or
    labels); padded batches carry ``attention_mask``, one document per row.
    """
    import torch

    mask = batch.get("attention_mask")
    pos = batch.get("position_ids")
    if pos is not None:
        lengths: list[int] = []
        for r in range(pos.shape[0]):
            row = pos[r]
            if mask is not None:
                row = row[mask[r].bool()]
            starts = torch.nonzero(row == 0).flatten().tolist() + [row.numel()]
            lengths += [b - a for a, b in zip(starts, starts[1:]) if b > a]
        return sum(lengths), float(sum(n * n for n in lengths))
    if mask is not None:
        per_row = mask.sum(dim=1).tolist()
        return int(sum(per_row)), float(sum(n * n for n in per_row))
    n = batch["input_ids"].shape[1]
    return int(batch["input_ids"].numel()), float(batch["input_ids"].shape[0] * n * n)


class StepLog:
    """Appends this rank's per-step records to ``out_dir/steps.rank<R>.jsonl``."""

    def __init__(self, out_dir: str | os.PathLike, rank: int):
        self.path = Path(out_dir) / f"steps.rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


# ------------------------------------------------------------------------------ sample-recipe


def sample_train_func(spec: dict[str, Any]) -> None:
    """Ray Train worker of ``sample-recipe`` (see the module doc). ``spec``: the run spec."""
    from functools import partial

    import ray.train
    import ray.train.torch
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    ds = load_dataset(spec["data"])
    mb, seq_len, pad_id = spec["micro_batch_size"], spec["seq_len"], spec["pad_id"]

    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.bfloat16)
    model.to(device)
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=partial(size_based_auto_wrap_policy, min_num_params=int(1e7)),
        device_id=device,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    log = StepLog(spec["out_dir"], rank)
    t_last = time.perf_counter()
    for step in range(spec["steps"]):
        rows = rank_rows(len(ds), step, mb, rank, world)
        b = padded_batch(ds, rows, seq_len, pad_id)
        optimizer.zero_grad()
        loss = model(input_ids=b["input_ids"].to(device), attention_mask=b["attention_mask"].to(device), labels=b["labels"].to(device)).loss
        loss.backward()
        optimizer.step()
        loss_val = loss.item()  # synchronises the device, as the sample's logging does
        peak = _peak_gib(device)
        t_report = time.perf_counter()
        ray.train.report({"step": step, "loss": loss_val, "peak_gpu_mem_gb": peak})
        now = time.perf_counter()
        log.write(
            {
                "step": step + 1,
                "step_time_s": now - t_last,
                "report_s": now - t_report,
                "tokens": b["tokens"],
                "attn_tokens_sq": b["attn_tokens_sq"],
                "peak_mem_gib": peak,
                "loss": loss_val,
            }
        )
        t_last = now


def run_sample(spec: dict[str, Any]) -> None:
    """Start (or join) Ray and run ``sample-recipe`` with ``spec['num_workers']`` workers."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, logging_level="ERROR", log_to_driver=True)
    trainer = TorchTrainer(
        sample_train_func,
        train_loop_config=spec,
        scaling_config=ray.train.ScalingConfig(num_workers=spec["num_workers"], use_gpu=spec["use_gpu"]),
        run_config=ray.train.RunConfig(
            name=f"bench-sample-{os.getpid()}-{time.time_ns()}",
            storage_path=str(Path(spec["out_dir"]).resolve() / "ray"),
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
        torch_config=TorchConfig(backend="nccl" if spec["use_gpu"] else "gloo"),
    )
    trainer.fit()


# ------------------------------------------------------------------------------ TRL


def trl_dataset(ds: TokenizedDataset, seq_len: int):
    """A ``datasets.Dataset`` with ``input_ids`` (cut to ``seq_len``) and ``completion_mask`` (the
    trainable mask) per example: TRL takes it as already tokenized."""
    import datasets

    ids, masks = [], []
    for i in range(len(ds)):
        tok, train = ds.example(i)
        ids.append(tok[:seq_len].astype(np.int64).tolist())
        masks.append(train[:seq_len].astype(np.int64).tolist())
    return datasets.Dataset.from_dict({"input_ids": ids, "completion_mask": masks})


def trl_config_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``SFTConfig`` fields of the run (also recorded in the results)."""
    import importlib.util

    best = spec["recipe"] == "trl-best"
    kw: dict[str, Any] = dict(
        output_dir=str(Path(spec["out_dir"]) / "trl"),
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["micro_batch_size"],
        gradient_accumulation_steps=1,
        learning_rate=spec["lr"],
        max_length=spec["seq_len"],
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        logging_steps=1,
        seed=spec["seed"],
        bf16=spec["use_gpu"],
        use_cpu=not spec["use_gpu"],
        disable_tqdm=True,
        # explicit: SFTConfig defaults it to True; the bench runs every recipe as the config says (TRL
        # checkpoints every layer or none: an every-k-th-layer setting is refused where the spec is built)
        gradient_checkpointing=bool(spec.get("activation_checkpointing", False)),
    )
    if spec["num_workers"] > 1:
        kw["fsdp"] = "full_shard auto_wrap"
        kw["fsdp_config"] = {"transformer_layer_cls_to_wrap": [spec["decoder_layer_cls"]]}
    if spec.get("workload") == "real":
        # the dataset has no prompt/completion columns: TRL would drop completion_mask and train on whole rows
        kw["completion_only_loss"] = True
    if best:
        kw["packing"] = True  # BFD packing: TRL turns padding-free batches on
        if spec["use_gpu"] and importlib.util.find_spec("liger_kernel") is not None:
            kw["use_liger_kernel"] = True
    if spec.get("compile"):  # `rayft bench train --trl-compile`: the Trainer wraps the whole model in torch.compile
        kw["torch_compile"] = True
    return kw


def trl_passes_boundaries() -> bool:
    """Whether the installed TRL's padding-free collator passes the documents' boundaries
    (``cu_seq_lens_q``), which rayft's variable-length attention reads: TRL 1.x does; TRL 0.24 (the
    one LLaMA-Factory 0.9.5 takes) passes position ids only, and varlen attention would then run each
    packed row as one document. False where TRL or its collator is not found."""
    try:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        out = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    except (ImportError, TypeError):
        return False
    return "cu_seq_lens_q" in out


def trl_attention(spec: dict[str, Any]) -> str:
    """The attention implementation of a TRL run: for ``trl-best`` on CUDA, rayft's variable-length
    FlashAttention (:data:`rayft.train.attention.VARLEN`, registered here; it reads the padding-free
    collator's ``cu_seq_lens_q``, so only where :func:`trl_passes_boundaries`), else ``sdpa`` (which
    runs a padding-free row with a dense block-diagonal mask built from its position ids)."""
    if spec["recipe"] != "trl-best" or not spec["use_gpu"]:
        return "sdpa"
    import torch

    from rayft.train.attention import resolve_attn_implementation

    if not torch.cuda.is_available() or not trl_passes_boundaries():
        return "sdpa"
    return resolve_attn_implementation("auto", torch.device("cuda", torch.cuda.current_device()))


def trl_label(recipe: str, attn: str, compiled: bool = False) -> str:
    """The run's name in the results: ``trl-best (sdpa)`` when trl-best fell back to sdpa; `` +
    compile`` after it when the Trainer compiled the model (``--trl-compile``)."""
    name = f"{recipe} (sdpa)" if recipe == "trl-best" and attn == "sdpa" else recipe
    return f"{name} + compile" if compiled else name


def trl_planned_settings(spec: dict[str, Any], attn: str = "sdpa") -> dict[str, Any]:
    """The effective settings of a TRL run from its spec and attention (the run writes them into
    ``SETTINGS_FILE`` with the attention it used)."""
    kw = trl_config_kwargs(spec)
    return {
        "label": trl_label(spec["recipe"], attn, bool(kw.get("torch_compile"))),
        "attention": attn,
        "compile": bool(kw.get("torch_compile")),
        "padding_free": bool(kw.get("packing")),
        "liger": bool(kw.get("use_liger_kernel")),
        "completion_only_loss": kw.get("completion_only_loss"),
        "gradient_checkpointing": kw["gradient_checkpointing"],
        "fsdp": 1 if "fsdp" in kw else None,
        "cross_entropy": "liger fused linear" if kw.get("use_liger_kernel") else "transformers (full logits)",
    }


def run_trl(spec: dict[str, Any]) -> None:
    """One process of a TRL recipe (under ``torchrun``; rank from ``RANK``)."""
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rank = int(os.environ.get("RANK", 0))
    ds = load_dataset(spec["data"])
    cfg = SFTConfig(**trl_config_kwargs(spec))
    attn = trl_attention(spec)
    cfg.model_init_kwargs = {"attn_implementation": attn}
    log = StepLog(spec["out_dir"], rank)
    counts: list[tuple[int, float]] = []  # FIFO: the loader may collate the next batch before this step ends

    class StepRecords(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if spec["use_gpu"] and torch.cuda.is_available():  # the peak of training, not of loading and sharding
                torch.cuda.reset_peak_memory_stats()

        def on_step_begin(self, args, state, control, **kw):
            if not hasattr(self, "t_last"):
                self.t_last = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            dev = (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and spec["use_gpu"] else torch.device("cpu")
            )
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            now = time.perf_counter()
            tokens, sq = counts.pop(0) if counts else (0, 0.0)
            log.write(
                {
                    "step": state.global_step,
                    "step_time_s": now - self.t_last,
                    "tokens": tokens,
                    "attn_tokens_sq": sq,
                    "peak_mem_gib": _peak_gib(dev),
                }
            )
            self.t_last = now

    trainer = SFTTrainer(
        model=spec["model_dir"],
        args=cfg,
        train_dataset=trl_dataset(ds, spec["seq_len"]),
        processing_class=AutoTokenizer.from_pretrained(spec["tokenizer_dir"]),
        callbacks=[StepRecords()],
    )
    collate = trainer.data_collator

    def counting_collator(examples):
        batch = collate(examples)
        counts.append(batch_token_stats(batch))
        return batch

    trainer.data_collator = counting_collator
    if rank == 0:
        used = {
            **trl_planned_settings(spec, attn),
            "padding_free": bool(getattr(trainer, "padding_free", False)),
            "liger": bool(cfg.use_liger_kernel),
            "gradient_checkpointing": bool(cfg.gradient_checkpointing),
            "completion_only_loss": getattr(trainer, "completion_only_loss", None),
            "compile": bool(cfg.torch_compile),
        }
        (Path(spec["out_dir"]) / SETTINGS_FILE).write_text(json.dumps(used, indent=2))
        print(f"[trl] settings {json.dumps(used)}", flush=True)
    trainer.train()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("sample", "trl"):
        sys.exit("usage: python -m rayft.benchmarks.recipes {sample|trl} SPEC.json")
    spec = json.loads(Path(argv[1]).read_text())
    (run_sample if argv[0] == "sample" else run_trl)(spec)


if __name__ == "__main__":
    main()

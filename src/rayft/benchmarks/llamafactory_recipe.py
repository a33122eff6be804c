"""`rayft bench train`'s ``llamafactory`` recipe: LLaMA-Factory 0.9.5's SFT stage (full fine-tuning)
launched on Ray by LLaMA-Factory itself, on the bench's model and rows, writing the per-step records
of :mod:`rayft.benchmarks.recipes` (``steps.rank<R>.jsonl``). One process runs it:
``python -m rayft.benchmarks.llamafactory_recipe SPEC.json`` (:func:`command`).

What is LLaMA-Factory's and what is added here:

* ``llamafactory.train.tuner.run_exp(args, callbacks=[...])`` with ``stage: sft``,
  ``finetuning_type: full`` and ``USE_RAY=1``: LLaMA-Factory starts ``ray_num_workers`` Ray actors
  itself (``ray.remote``, one GPU each, in a placement group), each running its SFT workflow (its
  ``CustomSeq2SeqTrainer``, a Hugging Face ``Seq2SeqTrainer``); the callbacks travel to the actors
  pickled, so :class:`StepRecords` is a module-level class holding plain values only. This process
  starts Ray first (one GPU per worker, enough CPUs for LLaMA-Factory's 10-CPU bundles) and gives
  LLaMA-Factory the node's address as ``master_addr`` (its own head-node look-up needs Ray's
  dashboard). On CPU (tests) LLaMA-Factory's Ray launcher cannot run: it asks for one 10-CPU bundle
  per CPU of the cluster, which never fits; there the recipe calls ``run_exp`` without Ray, one
  process (the same workflow, trainer and callbacks).
* The rows: rayft's tokenized examples (the ``data.npz`` every recipe reads, the same token ids and
  trainable masks), packed the way LLaMA-Factory's packed SFT processor packs and handed to it as a
  saved ``datasets`` dataset through ``tokenized_path`` (LLaMA-Factory then skips its own loading,
  template and packing). With packing LLaMA-Factory lowers ``cutoff_len`` by one, so a packed row
  holds at most ``seq_len - 1`` tokens of examples (:func:`pack_capacity`); the examples are cut to
  that, as the TRL recipes cut theirs to ``seq_len`` (LLaMA-Factory would drop a longer one) and
  grouped into rows by LLaMA-Factory's own ``greedy_knapsack``. A row is ``seq_len`` long: the
  examples one after the other, then padding (``pad_id``, label -100); ``position_ids`` restart at 0
  for each example (0 on padding); ``attention_mask`` holds each example's 1-based index in the row
  and 0 on padding, the layout of LLaMA-Factory's ``neat_packing`` (packing without attention
  across examples, as every other recipe attends). Labels: the token where it is trainable, else -100
  (the model shifts them).
* ``neat_packing: true``: LLaMA-Factory's collator turns the index mask into a 4-D block-diagonal
  causal mask for ``sdpa``; with FlashAttention-2 it takes one packed row per device batch, so
  ``fa2`` is asked for only where flash-attn is installed and the micro-batch is 1
  (:func:`attention_choice`); the attention the model got is recorded.
* ``enable_liger_kernel`` on CUDA when liger-kernel is installed (LLaMA-Factory applies liger's
  kernels, with its fused linear cross-entropy for SFT); bf16 on CUDA (LLaMA-Factory loads the
  weights in bf16 and upcasts the trainable ones to fp32: fp32 master weights under bf16 autocast);
  gradient checkpointing as the bench's ``train.activation_checkpointing`` (LLaMA-Factory turns it
  on unless told not to); the bench's micro-batch, ``max_steps``, lr and seed; no evaluation, no
  checkpoints; LLaMA-Factory's sampler (shuffled, seeded). From 2 workers on, FSDP ``full_shard
  auto_wrap`` on the decoder layer class as the TRL recipes (LLaMA-Factory's default is DDP).
  LLaMA-Factory's SFT stage always saves the final model into its ``output_dir`` when training ends:
  that time is in the run's wall time, not in any step.
* The model directory LLaMA-Factory loads is the bench's initial model with the bench's tokenizer
  files beside it (symbolic links): LLaMA-Factory reads the tokenizer from the model's path.
* :class:`StepRecords` (a ``TrainerCallback``) writes the records; it counts each step's tokens
  from the batch the model is called with (a forward pre-hook), and writes the run's effective
  settings into ``settings.json`` (rank 0); LLaMA-Factory's full arguments and the package versions
  go into ``llamafactory_args.json`` beside it.

LLaMA-Factory 0.9.5 declares transformers <= 5.6 and checks the versions of transformers, datasets,
accelerate, peft and trl when it is imported; the recipe sets ``DISABLE_VERSION_CHECK=1`` unless
the environment says otherwise (the settings record the versions that ran).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback

from rayft.benchmarks.recipes import IGNORE_INDEX, SETTINGS_FILE, StepLog, batch_token_stats, load_dataset

#: The LLaMA-Factory release this recipe is written against (its argument names, Ray launcher, collator).
LLAMAFACTORY_VERSION = "0.9.5"
#: The name given as LLaMA-Factory's ``dataset`` (it insists on one); never read: the rows come
#: from ``tokenized_path``, which LLaMA-Factory loads whenever that directory holds data.
DATASET_NAME = "rayft_bench_rows"
#: CPUs LLaMA-Factory 0.9.5 reserves per Ray worker (its placement-group bundle and actor).
CPUS_PER_WORKER = 10
#: The run's full LLaMA-Factory arguments and the package versions, beside ``settings.json``.
ARGS_FILE = "llamafactory_args.json"

Knapsack = Callable[[list[int], int], list[list[int]]]


class LlamaFactoryRecipeError(RuntimeError):
    """A bench config the llamafactory recipe cannot run (more than one CPU worker)."""


def check_world(use_gpu: bool, world: int) -> None:
    """The recipe runs on ``world`` CUDA workers through Ray, or on one CPU process.

    Raises:
        LlamaFactoryRecipeError: CPU workers and ``world`` > 1.
    """
    if not use_gpu and world > 1:
        raise LlamaFactoryRecipeError(
            f"the llamafactory recipe runs on CPU with one worker only (train.num_workers is {world}): "
            "LLaMA-Factory 0.9.5's Ray launcher places its workers on GPUs"
        )


def pack_capacity(seq_len: int) -> int:
    """Tokens of examples a packed row holds: LLaMA-Factory lowers ``cutoff_len`` (here ``seq_len``)
    by one when it packs, and pads every packed row to ``cutoff_len`` + 1 = ``seq_len``."""
    return seq_len - 1


def packed_rows(examples: list[tuple[Any, Any]], seq_len: int, pad_id: int, knapsack: Knapsack) -> dict[str, list[list[int]]]:
    """Rows in LLaMA-Factory's neat-packing layout (see the module doc).

    Args:
        examples: ``(token ids, trainable mask)`` per example (sequences of ints / bools); each is
            cut to :func:`pack_capacity` tokens.
        knapsack: groups lengths under a capacity (LLaMA-Factory's ``greedy_knapsack``:
            ``(lengths, capacity) -> [[length, ...], ...]``; it may reorder the list it is given).

    Returns:
        ``input_ids``, ``attention_mask`` (1-based example index, 0 on padding), ``position_ids``,
        ``labels`` (-100 where not trainable and on padding): lists of rows of ``seq_len`` ints.
    """
    cap = pack_capacity(seq_len)
    cut = [([int(t) for t in tok[:cap]], [bool(m) for m in train[:cap]]) for tok, train in examples]
    by_length: dict[int, deque[int]] = defaultdict(deque)
    for i, (tok, _) in enumerate(cut):
        by_length[len(tok)].append(i)
    rows: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "position_ids": [], "labels": []}
    for group in knapsack([len(tok) for tok, _ in cut], cap):
        ids, mask, pos, labels = [], [], [], []
        for k, n in enumerate(group, start=1):
            tok, train = cut[by_length[n].popleft()]
            ids += tok
            mask += [k] * n
            pos += list(range(n))
            labels += [t if m else IGNORE_INDEX for t, m in zip(tok, train)]
        pad = seq_len - len(ids)
        rows["input_ids"].append(ids + [pad_id] * pad)
        rows["attention_mask"].append(mask + [0] * pad)
        rows["position_ids"].append(pos + [0] * pad)
        rows["labels"].append(labels + [IGNORE_INDEX] * pad)
    return rows


def packed_batch_stats(position_ids: Any, attention_mask: Any = None) -> tuple[int, float]:
    """(non-padding tokens, Σ example length²) of a batch the model is called with:
    :func:`rayft.benchmarks.recipes.batch_token_stats` once the mask says, per position, token or padding.

    Args:
        position_ids: int [B, S], restarting at 0 for each example.
        attention_mask: None (every position is a token: FlashAttention's unpadded rows), the 2-D
            index mask (0 on padding), or LLaMA-Factory's 4-D additive mask [B, 1, S, S] (a position
            is padding where its own diagonal entry is masked, i.e. non-zero).
    """
    import torch

    batch = {"position_ids": position_ids.cpu()}  # one copy each: not a device sync per row
    if attention_mask is not None:
        if attention_mask.dim() == 4:
            attention_mask = torch.diagonal(attention_mask[:, 0], dim1=-2, dim2=-1) == 0
        batch["attention_mask"] = attention_mask.cpu()
    return batch_token_stats(batch)


def attention_choice(micro_batch_size: int, flash_attn_installed: bool) -> tuple[str, str]:
    """(LLaMA-Factory's ``flash_attn`` value, why): ``fa2`` where flash-attn is installed and the
    micro-batch is 1 (LLaMA-Factory's neat packing under FlashAttention-2 takes one row per device
    batch), else ``sdpa``."""
    if not flash_attn_installed:
        return "sdpa", "flash-attn is not installed"
    if micro_batch_size != 1:
        return "sdpa", f"LLaMA-Factory's neat packing under FlashAttention-2 takes 1 row per batch; the micro-batch is {micro_batch_size}"
    return "fa2", "flash-attn is installed"


def llamafactory_args(spec: dict[str, Any], model_path: str, data_path: str, flash_attn: str, liger: bool) -> dict[str, Any]:
    """LLaMA-Factory's arguments for the run (what ``run_exp`` parses; recorded in the settings).

    ``spec`` keys used: ``seq_len``, ``micro_batch_size``, ``steps``, ``lr``, ``seed``,
    ``num_workers``, ``use_gpu``, ``activation_checkpointing``, ``decoder_layer_cls``, ``out_dir``.
    ``model_path``: the model directory with the tokenizer; ``data_path``: the saved packed rows.
    """
    args: dict[str, Any] = {
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "full",
        "model_name_or_path": model_path,
        "template": "empty",  # the rows are tokenized already: no template touches them
        "dataset": DATASET_NAME,
        "tokenized_path": data_path,
        "cutoff_len": spec["seq_len"],
        "packing": True,
        "neat_packing": True,
        "flash_attn": flash_attn,
        "enable_liger_kernel": liger,
        "disable_gradient_checkpointing": not spec["activation_checkpointing"],
        "output_dir": str(Path(spec["out_dir"]) / "llamafactory" / "output"),
        "per_device_train_batch_size": spec["micro_batch_size"],
        "gradient_accumulation_steps": 1,
        "max_steps": spec["steps"],
        "learning_rate": spec["lr"],
        "seed": spec["seed"],
        "bf16": spec["use_gpu"],
        "use_cpu": not spec["use_gpu"],
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "plot_loss": False,
    }
    if spec["use_gpu"]:  # LLaMA-Factory reads use_ray from the environment (USE_RAY=1, set by run)
        args["ray_num_workers"] = spec["num_workers"]
    if spec["num_workers"] > 1:
        args["fsdp"] = "full_shard auto_wrap"
        args["fsdp_config"] = {"transformer_layer_cls_to_wrap": [spec["decoder_layer_cls"]]}
    return args


def planned_settings(spec: dict[str, Any], flash_attn: str = "sdpa", liger: bool | None = None) -> dict[str, Any]:
    """The run's settings in the bench table's terms, before it runs (``liger`` None: what the spec
    asks for, on CUDA when liger-kernel is installed here)."""
    if liger is None:
        liger = spec["use_gpu"] and importlib.util.find_spec("liger_kernel") is not None
    return {
        "attention": flash_attn,
        "padding_free": False,
        "packing": "neat (LLaMA-Factory's knapsack, rows padded to seq_len)",
        "liger": liger,
        "gradient_checkpointing": bool(spec["activation_checkpointing"]),
        "fsdp": 1 if spec["num_workers"] > 1 else None,
        "cross_entropy": "liger fused linear" if liger else "transformers (full logits)",
        "launcher": "LLaMA-Factory on Ray (use_ray)" if spec["use_gpu"] else "LLaMA-Factory in this process (CPU: no Ray)",
        "micro_batch_size": spec["micro_batch_size"],
        "llamafactory": LLAMAFACTORY_VERSION,
    }


def command(spec_file: str | os.PathLike) -> list[str]:
    """The recipe's subprocess command line (one driver process; LLaMA-Factory starts the workers)."""
    return [sys.executable, "-m", __name__, str(spec_file)]


class StepRecords(TrainerCallback):
    """Writes ``steps.rank<R>.jsonl`` (one record per optimizer step) and, on rank 0,
    ``settings.json`` (``planned`` with what the run reports it used). Holds plain values only until
    training begins: it is pickled to LLaMA-Factory's Ray workers.

    Record fields: ``step``; ``step_time_s`` (end of the previous step to the end of this one,
    device synchronised; the first from the first step's start); ``tokens`` and ``attn_tokens_sq``
    of the batch the model was called with (:func:`packed_batch_stats`); ``peak_mem_gib`` (CUDA
    peak since training began, None on CPU); ``loss`` (the step's logged loss; None when the trainer
    logged none for it).
    """

    def __init__(self, out_dir: str, planned: dict[str, Any], use_gpu: bool):
        self.out_dir, self.planned, self.use_gpu = out_dir, planned, use_gpu
        self.counts: list[tuple[int, float]] = []  # FIFO: one entry per forward call
        self.pending: dict[str, Any] | None = None
        self.t_last: float | None = None
        self.log: StepLog | None = None

    def _sync_now(self) -> float:
        import torch

        if self.use_gpu and torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    def _count_batch(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        pos = kwargs.get("position_ids")
        if pos is None and ids is not None:  # no position ids: one example per row
            import torch

            pos = torch.arange(ids.shape[-1], device=ids.device).expand(ids.shape[0], -1)
        self.counts.append(packed_batch_stats(pos, kwargs.get("attention_mask")) if pos is not None else (0, 0.0))

    def _flush(self) -> None:
        if self.pending is not None and self.log is not None:
            self.log.write(self.pending)
        self.pending = None

    def on_train_begin(self, args, state, control, model=None, **kw):
        import torch

        if self.use_gpu and torch.cuda.is_available():  # the peak of training, not of loading
            torch.cuda.reset_peak_memory_stats()
        self.log = StepLog(self.out_dir, args.process_index)
        if model is not None:
            model.register_forward_pre_hook(self._count_batch, with_kwargs=True)
        if args.process_index == 0:
            used = {**self.planned, **used_settings(args, model)}
            (Path(self.out_dir) / SETTINGS_FILE).write_text(json.dumps(used, indent=2))
            print(f"[llamafactory] settings {json.dumps(used)}", flush=True)

    def on_step_begin(self, args, state, control, **kw):
        if self.t_last is None:
            self.t_last = self._sync_now()

    def on_step_end(self, args, state, control, **kw):
        import torch

        self._flush()
        now = self._sync_now()
        if len(self.counts) != 1:  # one forward per step (no gradient accumulation here): else the counts are not this step's
            raise LlamaFactoryRecipeError(f"step {state.global_step}: {len(self.counts)} forward calls counted, expected 1")
        tokens, sq = self.counts.pop()
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.use_gpu and torch.cuda.is_available() else None
        start = self.t_last if self.t_last is not None else now
        self.pending = {
            "step": state.global_step,
            "step_time_s": now - start,
            "tokens": tokens,
            "attn_tokens_sq": sq,
            "peak_mem_gib": peak,
            "loss": None,
        }
        self.t_last = now

    def on_log(self, args, state, control, logs=None, **kw):
        if self.pending is not None and logs and "loss" in logs:
            self.pending["loss"] = float(logs["loss"])
            self._flush()

    def on_train_end(self, args, state, control, **kw):
        self._flush()


def used_settings(args: Any, model: Any) -> dict[str, Any]:
    """What the run reports it used: ``args`` (the Hugging Face ``TrainingArguments`` LLaMA-Factory
    built) and ``model`` (as the trainer holds it; None: not known). Keys: attention (the model
    config's attention implementation), liger (the model's forward is liger-kernel's),
    gradient_checkpointing, param_dtype, world_size, bf16, optim, fsdp, use_ray."""
    out: dict[str, Any] = {
        "world_size": args.world_size,
        "bf16": bool(args.bf16),
        "optim": str(getattr(args.optim, "value", args.optim)),
        "fsdp": (args.fsdp_config or {}).get("version", 1) if args.fsdp else None,
        "use_ray": os.environ.get("USE_RAY", "0").lower() in ("1", "true", "y"),
    }
    if model is not None:
        model = getattr(model, "module", model)  # under FSDP/DDP: the wrapped model's class and config
        attn = getattr(model.config, "_attn_implementation", None)
        liger = type(model).forward.__module__.startswith("liger_kernel")
        out |= {
            "attention": attn,
            "liger": liger,
            "cross_entropy": "liger fused linear" if liger else "transformers (full logits)",
            "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
            "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        }
    return out


def versions() -> dict[str, str | None]:
    """Installed versions of LLaMA-Factory and the packages it checks (None: not installed)."""
    out: dict[str, str | None] = {}
    for package in ("llamafactory", "transformers", "trl", "datasets", "accelerate", "peft", "liger-kernel"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


def model_with_tokenizer(model_dir: str | os.PathLike, tokenizer_dir: str | os.PathLike, dest: Path) -> Path:
    """``dest``: links to the model directory's files and to the tokenizer's (the model's win a
    clash): LLaMA-Factory loads both from one path. Returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in (Path(model_dir), Path(tokenizer_dir)):
        for f in src.iterdir():
            link = dest / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    return dest


def save_rows(spec: dict[str, Any], dest: Path) -> Path:
    """The bench's rows packed (:func:`packed_rows` with LLaMA-Factory's ``greedy_knapsack``) and
    saved as a ``datasets`` dataset at ``dest`` (LLaMA-Factory's ``tokenized_path``). Returns ``dest``."""
    import datasets
    from llamafactory.data.processor.processor_utils import greedy_knapsack

    ds = load_dataset(spec["data"])
    rows = packed_rows([ds.example(i) for i in range(len(ds))], spec["seq_len"], spec["pad_id"], greedy_knapsack)
    datasets.Dataset.from_dict(rows).save_to_disk(str(dest))
    return dest


def start_ray(world: int) -> str:
    """Start Ray here (``RAY_ADDRESS``: join that cluster) with ``world`` GPUs and enough CPUs for
    LLaMA-Factory's bundles; the node's address (LLaMA-Factory's ``master_addr``)."""
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=True)
        else:
            cpus = max(os.cpu_count() or 1, CPUS_PER_WORKER * world)
            ray.init(num_gpus=world, num_cpus=cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=True)
    return ray.util.get_node_ip_address()


def run(spec: dict[str, Any]) -> None:
    """The recipe's driver: prepare the model directory and rows, then LLaMA-Factory's ``run_exp``.

    Raises:
        LlamaFactoryRecipeError: CPU with more than one worker.
    """
    check_world(spec["use_gpu"], spec["num_workers"])
    # absolute: LLaMA-Factory's Ray workers need not share this process's working directory
    spec = {**spec, **{k: str(Path(spec[k]).resolve()) for k in ("out_dir", "model_dir", "tokenizer_dir")}}
    os.environ.setdefault("DISABLE_VERSION_CHECK", "1")  # before LLaMA-Factory is imported (see the module doc)
    work = Path(spec["out_dir"]) / "llamafactory"
    model_path = model_with_tokenizer(spec["model_dir"], spec["tokenizer_dir"], work / "model")
    data_path = save_rows(spec, work / "rows")
    flash_attn, why = attention_choice(spec["micro_batch_size"], importlib.util.find_spec("flash_attn") is not None)
    planned = {**planned_settings(spec, flash_attn), "attention_requested": f"{flash_attn} ({why})"}
    args = llamafactory_args(spec, str(model_path), str(data_path), flash_attn, planned["liger"])
    (Path(spec["out_dir"]) / SETTINGS_FILE).write_text(json.dumps(planned, indent=2))  # rank 0 rewrites it with what it used
    if spec["use_gpu"]:
        os.environ["USE_RAY"] = "1"
        args["master_addr"] = start_ray(spec["num_workers"])
    else:
        os.environ.pop("USE_RAY", None)
    (Path(spec["out_dir"]) / ARGS_FILE).write_text(json.dumps({"args": args, "versions": versions()}, indent=2))
    from llamafactory.train.tuner import run_exp

    run_exp(args, callbacks=[StepRecords(spec["out_dir"], planned, spec["use_gpu"])])


def main(argv: list[str] | None = None) -> None:
    """``python -m rayft.benchmarks.llamafactory_recipe SPEC.json``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m rayft.benchmarks.llamafactory_recipe SPEC.json")
    run(json.loads(Path(argv[0]).read_text()))


if __name__ == "__main__":
    main()

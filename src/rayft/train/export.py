"""The end-of-run Hugging Face export, checked against the trained model (collective).

On a run directory every rank sees (a local disk, a shared file system), each rank writes a share
of the export's files, the tensors of each gathered to its rank one at a time
(:func:`rayft.train.hf_weights.write_sharded_hf_weights`): no rank holds the whole model. Each rank then reads back its rows and compares them with its shards
(exact: the export is the fp32 master weights). Rank 0 also compares the exported model's logits with
the trained model's on a fixed batch, when the model fits next to what training holds (GPU memory
for GPU workers, host memory for CPU workers); beyond that the check is skipped with a note.

Two calls: :func:`prepare_export` makes what needs no file of the export (the trained model's
logits on the probe row; rank 0's tokenizer and base generation config) while the last checkpoint
is still being written; :func:`export_and_verify` writes and checks the files once it is complete.

A run directory on object storage (``s3://``) is exported by gathering the weights on rank 0 and
uploading its files: its ranks share no file system to assemble the files on. So is a model whose
checkpoint's tensor names transformers converted while loading (its ``save_pretrained`` converts
them back), and any model on a torch without DCP's Hugging Face writer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rayft.config import RayftConfig
from rayft.data.packing import collate
from rayft.train import checkpoint as ckpt_lib
from rayft.train.events import ExportEvent, ProgressChannel
from rayft.train.hf_weights import compare_export, write_sharded_hf_weights
from rayft.train.model import ShardedModel
from rayft.train.worker_args import WorkerArgs

#: headroom asked beyond the exported model's own bytes before rank 0 loads it for the logit check
#: (transformers' loading buffers, the probe's activations and logits)
LOGIT_CHECK_MARGIN = 1.25


@dataclass
class ExportInputs:
    """What the export needs that none of its files does (:func:`prepare_export`).

    ``probe``: the first packed row of the run's data (``input_ids``, ``position_ids``: int64
    ``[1, n]``); ``ref_logits``: the trained model's logits on it (fp32, CPU, ``[1, n, vocab]``);
    ``tokenizer`` and ``base_generation``: rank 0's, for the config files (None elsewhere;
    ``base_generation`` also None when the base model has no generation config); ``timings``:
    ``probe`` and ``config_inputs``, wall seconds."""

    probe: dict[str, torch.Tensor]
    ref_logits: torch.Tensor
    tokenizer: Any | None
    base_generation: Any | None
    timings: dict[str, float]


def prepare_export(model: ShardedModel, ds, cfg: RayftConfig, args: WorkerArgs, device: torch.device) -> ExportInputs:
    """Collective: the trained model's logits on the probe row and, on rank 0, the tokenizer and the
    base model's generation config. None of it reads or writes the export's files, so the loop runs
    it while the last checkpoint is still being written (``rayft.train.loop.train_func``), where it
    ran after that write before: the probe took 1.0 s of a 1.5B model's end on one H200 and the
    config files, mostly the tokenizer's load, 1.9 s (bench/NOTES.md §27).

    Raises:
        ExportError: on every rank, when rank 0 could not load the tokenizer (rank 0: its own error).
    """
    from rayft.data.tokenizer import load_tokenizer
    from rayft.train.generation import base_generation_config

    t0 = time.perf_counter()
    module = model.module
    probe = collate(ds, [[0]], cfg.data.seq_len, args.pad_id, fixed_len=False)
    module.eval()
    # eager: compiled layers would compile again for eval mode without grad for this one forward
    # (5.4 s of a 1.5B model's end: bench/results/2026-12-02-wall-time-cold-1xh200.json; 1.4 s
    # eager: 2026-12-03-wall-time-end-order-1xh200.json). Not with flex attention: its eager
    # fallback builds the whole score matrix, heads × seq_len², where the compiled kernel does not.
    stance = "default" if model.attn_implementation == "flex_attention" else "force_eager"
    with torch.no_grad(), torch.compiler.set_stance(stance), model.computing():
        ref = module(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
    t1 = time.perf_counter()
    tokenizer = base = None
    with every_rank_or_none("loading the tokenizer and the base model's generation config for the export", device):
        if dist.get_rank() == 0:
            tokenizer = load_tokenizer(args.tokenizer)
            base = base_generation_config(cfg.model.name_or_path, cfg.model.revision, say=_say)
    return ExportInputs(probe, ref, tokenizer, base, {"probe": t1 - t0, "config_inputs": time.perf_counter() - t1})


def export_and_verify(
    model: ShardedModel,
    model_conf,
    cfg: RayftConfig,
    args: WorkerArgs,
    device: torch.device,
    progress: ProgressChannel,
    inputs: ExportInputs,
) -> None:
    """Collective: write the HF export into ``RUN/hf``, check it, and (rank 0) write the check to
    ``rayft_export_check.json`` and send an :class:`ExportEvent`. ``inputs``: :func:`prepare_export`'s.

    The check: ``export_max_abs_weight_diff`` (every tensor against the trained fp32 shards) and
    ``export_max_abs_logit_diff`` (the exported model's logits against the trained model's on the
    probe row; None with ``export_logit_check_skipped`` saying why), and ``export_timings_s``: rank
    0's wall seconds per phase (``probe`` and ``config_inputs``, made before the last checkpoint was
    complete; ``write``, ``read_back``, ``config_files`` of a sharded export, ``gather_write`` of a
    gathered one, ``logit_check``)."""
    module = model.module
    model.release_compute_copies()  # training is over: their memory goes to the logit check's load
    timings = dict(inputs.timings)
    if "://" in args.run_dir or model.export_gathered:
        t1 = time.perf_counter()
        info = _export_gathered(model, model_conf, inputs, args)
        timings["gather_write"] = time.perf_counter() - t1
    else:
        info = _export_sharded(model, model_conf, inputs, args, device, timings)
    if dist.get_rank() == 0:
        t1 = time.perf_counter()
        info.update(_logit_check(info["export_dir_local"], inputs.probe, inputs.ref_logits, cfg, device))
        timings["logit_check"] = time.perf_counter() - t1
        info["export_timings_s"] = timings
        info["export_tied"] = exported_tied(info["export_dir_local"], module)
        # with train.float8 the trained model's matmuls ran in float8 and the export's run in bf16/fp32:
        # the logit gap then includes float8 rounding, not only the export's
        info["trained_float8"] = model.float8
        local = info.pop("export_dir_local")
        with open(os.path.join(local, "rayft_export_check.json"), "w") as f:
            json.dump(info, f, indent=2)
        if info.get("upload_to"):
            import pyarrow.fs

            pyarrow.fs.copy_files(local, info.pop("upload_to"))
            shutil.rmtree(Path(local).parent, ignore_errors=True)  # the temporary directory rank 0 wrote it in
        progress.send(ExportEvent(info), wait=True)
    dist.barrier()


def _export_sharded(
    model: ShardedModel, model_conf, inputs: ExportInputs, args: WorkerArgs, device: torch.device, timings: dict[str, float]
) -> dict:
    """Collective: every rank writes its part of ``RUN/hf`` (through ``RUN/hf.tmp``, renamed when
    whole) and compares it with its shards; ``timings`` gets each phase's wall seconds."""
    out = Path(args.run_dir) / "hf"
    tmp, old = out.with_name("hf.tmp"), out.with_name("hf.old")
    rank0 = dist.get_rank() == 0
    with every_rank_or_none("preparing the export directory", device):
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
    t = time.perf_counter()
    with every_rank_or_none(f"writing the export's weights to {tmp}", device):
        write_sharded_hf_weights(model.module, tmp)
    timings["write"], t = time.perf_counter() - t, time.perf_counter()
    check = {}
    with every_rank_or_none(f"reading the export back from {tmp}", device):
        check = compare_export(model.module, tmp, device)
    timings["read_back"], t = time.perf_counter() - t, time.perf_counter()
    with every_rank_or_none(f"writing config, generation config and tokenizer to {tmp}, then renaming it to {out}", device):
        if rank0:
            ckpt_lib.write_hf_config_files(model_conf, inputs.tokenizer, tmp, base_generation=inputs.base_generation, say=_say)
            # rename, not delete-then-rename: on NFS an open file (rayft chat on the old export) cannot be deleted
            shutil.rmtree(old, ignore_errors=True)
            if out.exists():
                os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
    timings["config_files"] = time.perf_counter() - t
    return {
        "export_dir": str(out),
        "export_dir_local": str(out),
        "export_written_by": "every rank (sharded)",
        "export_max_abs_weight_diff": check["max_abs_diff"],
        "export_tensors": check["tensors"],
    }


@contextlib.contextmanager
def every_rank_or_none(what: str, device: torch.device):
    """Collective: run the block on every rank, then all ranks learn whether every rank succeeded;
    if one failed, every rank raises (the failed one its own error, the others an ``ExportError``
    naming the step), instead of the others waiting in the next collective until the timeout."""
    ok = torch.ones(1, device=device)
    try:
        yield
    except BaseException:
        ok.zero_()
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        raise
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 0:
        raise ExportError(f"the HF export failed on another rank while {what} (that rank's error is in its log)")


class ExportError(RuntimeError):
    """The end-of-run export failed on some rank."""


def exported_tied(export_dir: str, module: torch.nn.Module) -> bool:
    """Whether the export keeps the LM head as the input embedding: the trained model ties them,
    the export's config says so, and its files hold no separate LM-head tensor."""
    from transformers import AutoConfig

    from rayft.train.hf_weights import output_embedding_key, safetensors_keys
    from rayft.train.model import tied_embeddings

    conf = AutoConfig.from_pretrained(export_dir)
    stored = safetensors_keys(export_dir) or {}
    return tied_embeddings(module) and bool(getattr(conf, "tie_word_embeddings", False)) and output_embedding_key(module) not in stored


def _export_gathered(model: ShardedModel, model_conf, inputs: ExportInputs, args: WorkerArgs) -> dict:
    """Collective: the weights gathered on rank 0's CPU and written by it: into ``RUN/hf`` on a file
    system (through ``RUN/hf.tmp``), or into a local temporary directory to be uploaded to
    ``RUN/hf`` on object storage."""
    sd = ckpt_lib.full_model_state_dict(model.module)
    if dist.get_rank() != 0:
        return {}
    dest = f"{args.run_dir.rstrip('/')}/hf"
    remote = "://" in args.run_dir
    out = os.path.join(tempfile.mkdtemp(prefix="rayft-hf-"), "hf") if remote else dest
    ckpt_lib.write_hf_model(sd, model_conf, inputs.tokenizer, out, base_generation=inputs.base_generation)
    info = {"export_dir": dest, "export_dir_local": out, "export_written_by": "rank 0 (gathered)"}
    return info | ({"upload_to": dest} if remote else {})


def _logit_check(export_dir: str, probe: dict, ref: torch.Tensor, cfg: RayftConfig, device: torch.device) -> dict:
    """Rank 0: the exported model's logits against the trained model's (``ref``, fp32 CPU), or why
    the check was skipped (the model does not fit beside training's memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" and cfg.parallel.param_dtype == "bfloat16" else torch.float32
    room = _room_for_logit_check(export_dir, dtype, device)
    if room is not None:
        return {"export_max_abs_logit_diff": None, "export_logit_check_skipped": room}
    conf = AutoConfig.from_pretrained(export_dir)
    hf = AutoModelForCausalLM.from_pretrained(export_dir, config=conf, dtype=dtype, device_map=str(device)).eval()
    with torch.no_grad():
        got = hf(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"export_max_abs_logit_diff": (got - ref).abs().max().item()}


def _room_for_logit_check(export_dir: str, dtype: torch.dtype, device: torch.device) -> str | None:
    """None when rank 0 can load the exported model in ``dtype`` on ``device`` beside training's
    memory (:data:`LOGIT_CHECK_MARGIN` × its bytes free), else why not."""
    from rayft.train.hf_weights import safetensors_keys

    shapes = safetensors_keys(export_dir) or {}
    need = LOGIT_CHECK_MARGIN * sum(torch.Size(s).numel() for s in shapes.values()) * torch.empty(0, dtype=dtype).element_size()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
        where = f"GPU {device.index}"
    else:
        free, where = available_host_memory(), "host memory"
    if need <= free:
        return None
    return (
        f"the exported model needs ~{need / 2**30:.1f} GiB in {str(dtype).removeprefix('torch.')}, {where} has {free / 2**30:.1f} GiB free"
    )


def available_host_memory() -> int:
    """Bytes of host memory available to new allocations (Linux ``MemAvailable``; else free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _say(s: str) -> None:
    print(f"[rayft] {s}", flush=True)

"""The end-of-run Hugging Face export, checked against the trained model (collective)."""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist

from rayft.config import RayftConfig
from rayft.data.packing import collate
from rayft.train import checkpoint as ckpt_lib
from rayft.train.events import ExportEvent, ProgressChannel
from rayft.train.model import ShardedModel, tied_embeddings
from rayft.train.worker_args import WorkerArgs


def export_and_verify(
    model: ShardedModel, model_conf, ds, cfg: RayftConfig, args: WorkerArgs, device: torch.device, progress: ProgressChannel
) -> None:
    """Collective: write the HF export from rank 0 into ``RUN/hf`` (uploaded there when the run
    directory is on object storage), then check that the exported model's logits equal the trained
    model's on a fixed batch (the first packed row of ``ds``); rank 0 writes the largest gap to
    ``rayft_export_check.json`` and sends an :class:`ExportEvent`."""
    from transformers import AutoModelForCausalLM

    from rayft.data.tokenizer import load_tokenizer
    from rayft.train.generation import base_generation_config

    module = model.module
    sd = ckpt_lib.full_model_state_dict(module)
    run_dir = args.run_dir
    remote = "://" in run_dir
    probe = collate(ds, [[0]], cfg.data.seq_len, args.pad_id, fixed_len=False)
    module.eval()
    with torch.no_grad():
        ref = module(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
    if dist.get_rank() == 0:
        out = os.path.join(tempfile.mkdtemp(prefix="rayft-hf-"), "hf") if remote else os.path.join(run_dir, "hf")
        assert tied_embeddings(module) == bool(getattr(model_conf, "tie_word_embeddings", False))
        base = base_generation_config(cfg.model.name_or_path, cfg.model.revision, say=lambda s: print(f"[rayft] {s}", flush=True))
        ckpt_lib.write_hf_model(sd, model_conf, load_tokenizer(args.tokenizer), out, base_generation=base)
        dtype = torch.bfloat16 if device.type == "cuda" and cfg.parallel.param_dtype == "bfloat16" else torch.float32
        hf = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).to(device).eval()
        with torch.no_grad():
            got = hf(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
        diff = (got - ref).abs().max().item()
        # with train.float8 the trained model's matmuls ran in float8 and the export's run in bf16/fp32:
        # the gap then includes float8 rounding, not only the export's
        info = {"export_dir": out, "export_max_abs_logit_diff": diff, "export_tied": tied_embeddings(hf), "trained_float8": model.float8}
        with open(os.path.join(out, "rayft_export_check.json"), "w") as f:
            json.dump(info, f, indent=2)
        if remote:  # upload to the run directory on object storage
            import pyarrow.fs

            pyarrow.fs.copy_files(out, f"{run_dir.rstrip('/')}/hf")
            info["export_dir"] = f"{run_dir.rstrip('/')}/hf"
        progress.send(ExportEvent(info), wait=True)
    dist.barrier()

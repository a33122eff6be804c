"""`rayft models`: the architecture presets, with their parameter counts, context length, tokenizer
source and the kernels that apply to each family (:mod:`rayft.train.presets`, :mod:`rayft.train.families`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def kernels(conf) -> list[str]:
    """The speed features of rayft that apply to a model config on a CUDA device: ``compile``
    (per decoder layer, every family), ``fused-ce`` (liger's fused linear cross-entropy; not with
    a logit transform such as Gemma 2's soft-capping), ``liger`` (RMSNorm, SwiGLU/GeGLU, RoPE where
    liger-kernel patches the family), ``varlen`` (variable-length FlashAttention; not with a sliding
    window or attention soft-capping) or ``flex`` (flex_attention, for soft-capped attention)."""
    from rayft.train.attention import softcapped, unsupported_attention_features
    from rayft.train.families import family_of
    from rayft.train.loss import logit_transforms

    out = ["compile"]
    if not logit_transforms(conf):
        out.append("fused-ce")
    fam = family_of(conf.model_type)
    if fam is not None and fam.liger:
        out.append("liger")
    if softcapped(conf):
        out.append("flex")
    elif not unsupported_attention_features(conf):
        out.append("varlen")
    return out


def preset_rows() -> list[dict]:
    """One dict per preset: ``preset``, ``model_type``, ``params`` (all parameters, a tied LM head
    counted once; from the model built on the meta device), ``tied``, ``context``
    (max_position_embeddings, tokens), ``tokenizer`` (name or hub id), ``tokenizer_source``,
    ``kernels`` (:func:`kernels`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.families import family_of
    from rayft.train.model_config import load_model_config
    from rayft.train.presets import PRESETS

    rows = []
    for name, d in PRESETS.items():
        conf = load_model_config(ModelConfig(name_or_path=name))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(conf)
        fam = family_of(d["model_type"])
        rows.append(
            {
                "preset": name,
                "model_type": d["model_type"],
                "params": sum(p.numel() for p in model.parameters()),
                "tied": bool(conf.tie_word_embeddings),
                "context": int(conf.max_position_embeddings),
                "tokenizer": fam.tokenizer,
                "tokenizer_source": fam.tokenizer_source,
                "kernels": kernels(conf),
            }
        )
    return rows


def models(as_json: Annotated[bool, typer.Option("--json", help="One JSON object per preset, one a line.")] = False) -> None:
    """List the model presets (random init; `model.name_or_path: PRESET`) with their parameter
    counts, context length, tokenizer and the kernels that apply on a GPU."""
    from rich.console import Console
    from rich.table import Table

    rows = preset_rows()
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    table = Table("preset", "type", "params", "tied", "context", "tokenizer", "from", "kernels (GPU)", box=None)
    for r in rows:
        n = r["params"]
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e6:.1f}M"
        table.add_row(
            r["preset"], r["model_type"], size, "yes" if r["tied"] else "no", f"{r['context']:,}",
            r["tokenizer"], r["tokenizer_source"], ",".join(r["kernels"]),
        )  # fmt: skip
    Console(soft_wrap=True).print(table)

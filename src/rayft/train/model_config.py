"""A model's transformers config, tokenizer name and decoder layers, without the training stack.

What the driver needs of a model (the tokenizer for the data, the config
for the memory plan and synthetic data's vocabulary) lives here, so that the driver does not import
:mod:`rayft.train.model` (FSDP2, DCP's state-dict helpers, the loss kernels) to get it.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, PretrainedConfig

from rayft.config import ModelConfig
from rayft.train.presets import PRESETS, is_preset


def default_tokenizer(cfg: ModelConfig) -> str:
    """The tokenizer to use: explicit, else the preset family's (:data:`rayft.train.families.FAMILIES`:
    built offline for Qwen, Llama 3 and Mistral, a hub id for Gemma and Phi), else the model's."""
    from rayft.train.families import family_of

    if cfg.tokenizer:
        return cfg.tokenizer
    if is_preset(cfg.name_or_path):
        return family_of(PRESETS[cfg.name_or_path.lower()]["model_type"]).tokenizer
    return cfg.name_or_path


def load_model_config(cfg: ModelConfig, attn_implementation: str | None = None) -> PretrainedConfig:
    """The model's transformers config (preset, hub id or directory) with ``config_overrides`` applied.

    ``attn_implementation``: the resolved transformers name (see
    :func:`rayft.train.attention.resolve_attn_implementation`); default ``cfg.attn_implementation``,
    with ``auto`` and ``varlen`` read as the CPU's choice (``sdpa``; ``eager`` for a soft-capped
    model: :func:`rayft.train.attention.default_attn_implementation`), e.g. for export.
    """
    from rayft.train.attention import default_attn_implementation

    if is_preset(cfg.name_or_path):
        d = dict(PRESETS[cfg.name_or_path.lower()])
        model_type = d.pop("model_type")
        conf = AutoConfig.for_model(model_type, **d)
    else:
        conf = AutoConfig.from_pretrained(cfg.name_or_path, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    for k, v in cfg.config_overrides.items():
        if not hasattr(conf, k):
            raise ValueError(f"model.config_overrides.{k}: the {conf.model_type} config has no such field")
        setattr(conf, k, v)
    conf.use_cache = False
    if attn_implementation is None:
        auto = cfg.attn_implementation in ("auto", "varlen")
        attn_implementation = default_attn_implementation(conf, torch.device("cpu")) if auto else cfg.attn_implementation
    conf._attn_implementation = attn_implementation
    return conf


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks (``model.model.layers`` for Llama/Qwen-style models)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)

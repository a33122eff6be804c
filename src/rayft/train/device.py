"""The worker's GPU memory cap (``train.gpu_memory_limit_gib``): emulate a smaller card on a big one."""

from __future__ import annotations

import torch


def memory_fraction(limit_gib: float, total_bytes: int, device_name: str = "the GPU") -> float:
    """The fraction of ``total_bytes`` that ``limit_gib`` GiB is, for
    ``torch.cuda.set_per_process_memory_fraction``.

    Raises:
        ValueError: the limit is above the card's memory (nothing to emulate).
    """
    limit = limit_gib * 2**30
    if limit > total_bytes:
        raise ValueError(f"train.gpu_memory_limit_gib={limit_gib:g} exceeds {device_name}'s {total_bytes / 2**30:.1f} GiB")
    return limit / total_bytes


def cap_gpu_memory(device: torch.device, limit_gib: float) -> float:
    """Cap this process's PyTorch allocations on ``device`` at ``limit_gib`` GiB (the caching
    allocator refuses beyond it with ``torch.OutOfMemoryError``). CUDA's own context and NCCL's
    buffers are outside the cap, where on the emulated card they come out of the same memory: a cap
    at a card's usable memory lets a little more fit than that card would. Returns the fraction set.

    Raises:
        ValueError: ``device`` is not a GPU, or the limit exceeds its memory (:func:`memory_fraction`).
    """
    if device.type != "cuda":
        raise ValueError(f"train.gpu_memory_limit_gib caps GPU memory; this worker runs on {device.type}")
    fraction = memory_fraction(limit_gib, torch.cuda.get_device_properties(device).total_memory, torch.cuda.get_device_name(device))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction

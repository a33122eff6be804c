"""A bench script's one-rank process group and preset model (bench/gpu/*_ab.py import it from beside them)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from rayft.config import ModelConfig, ParallelConfig
from rayft.train.model import ShardedModel, build_sharded_model


def one_rank_preset(preset: str, port: int, seed: int = 1) -> tuple[torch.device, ShardedModel]:
    """Join a one-rank group (NCCL on GPU 0, gloo on a CPU machine for a smoke run) on 127.0.0.1:``port``
    and build ``preset`` there (seeded random init, uncompiled, no activation checkpointing)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=0, world_size=1)
    model = build_sharded_model(
        ModelConfig(name_or_path=preset), ParallelConfig(), device=dev, activation_checkpointing=False, compile_layers=False, seed=seed
    )
    return dev, model

"""A micro-batch no GPU can hold, refused when the config loads (before Ray, torch or any worker).

The estimate is a floor, not a forecast: every decoder layer's input, ``micro-batch tokens ×
hidden size`` values of 2 bytes (bf16), is kept for the backward pass even with activation
checkpointing, so a micro-batch needs at least ``tokens × hidden × layers × 2`` bytes of
activations on each worker, whatever else (weights, optimizer state, logits, the rest of each
layer's activations) comes on top. Logits are left out: liger's fused loss never holds them whole.

It applies only with ``data.packing`` (every packed micro-batch is ``micro_batch_size`` full rows of
``seq_len`` tokens; in padding mode a micro-batch is as long as its longest example and may hold
fewer rows) and only to models whose shape is known offline: a preset, or a local directory with
a ``config.json``. A hub id is skipped: the config loader does not reach the network.

The bound is the largest memory in rayft's instance catalog: one GPU's (B200, 192 GB) for GPU
workers, or an instance's host memory when ``train.use_gpu`` is false (CPU workers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.train.presets import PRESETS, is_preset

#: bytes of one saved activation value (bf16)
BYTES_PER_VALUE = 2


@dataclass(frozen=True)
class ModelShape:
    """What the floor needs of a model: its hidden size and decoder layer count, and where they came from."""

    hidden_size: int
    num_hidden_layers: int
    source: str


def model_shape(name_or_path: str, config_overrides: dict[str, Any] | None = None) -> ModelShape | None:
    """The hidden size and layer count of a preset or of a local model directory's ``config.json``
    (``model.config_overrides`` applied); None for a hub id or a directory without a readable config."""
    if is_preset(name_or_path):
        conf: dict[str, Any] = PRESETS[name_or_path.lower()]
        source = f"preset {name_or_path}"
    else:
        path = Path(name_or_path).expanduser() / "config.json"
        try:
            conf = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # a hub id (not fetched here) or a directory without a readable config.json
        if not isinstance(conf, dict):
            return None
        if "hidden_size" not in conf and isinstance(conf.get("text_config"), dict):
            conf = conf["text_config"]  # a multimodal config: the language model's part
        source = str(path)
    conf = {**conf, **(config_overrides or {})}
    hidden, layers = conf.get("hidden_size"), conf.get("num_hidden_layers")
    if not (isinstance(hidden, int) and isinstance(layers, int)) or isinstance(hidden, bool) or isinstance(layers, bool):
        return None
    if hidden < 1 or layers < 1:
        return None
    return ModelShape(hidden, layers, source)


def largest_memory(use_gpu: bool | str) -> tuple[int, str]:
    """(bytes, description) of the largest memory a worker can have among the types rayft knows:
    one GPU's for GPU workers (``use_gpu`` true or ``auto``), else an instance's host memory."""
    from rayft.cluster.instances import catalog

    types = list(catalog().values())
    if use_gpu is False:
        best = max(types, key=lambda t: t.memory_mib)
        return best.memory_mib * 2**20, f"the largest machine rayft knows ({best.name}) has {human_bytes(best.memory_mib * 2**20)}"
    best = max(types, key=lambda t: t.gpu_memory_mib)
    size = best.gpu_memory_mib * 2**20
    return size, f"the largest GPU rayft knows ({best.gpu_model}, {best.name}) has {human_bytes(size)}"


def human_bytes(n: float) -> str:
    """Decimal units, three significant figures: ``192 GB``, ``5.12 TB``."""
    units = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"]
    i = 0
    while n >= 999.5 and i < len(units) - 1:
        n /= 1000
        i += 1
    return f"{n:.3g} {units[i]}" if n < 1000 else f"{n:,.0f} {units[i]}"


def _sci(n: int) -> str:
    """``2.0e12``, ``7.5e8``: two significant figures, the exponent as written by hand."""
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def micro_batch_problem(
    *,
    name_or_path: str,
    config_overrides: dict[str, Any] | None,
    micro_batch_size: int,
    seq_len: int,
    packing: bool,
    use_gpu: bool | str,
) -> str | None:
    """Why this micro-batch cannot fit on any worker rayft knows, or None when it may (or cannot be judged)."""
    if not packing:
        return None  # padding mode: rows are as long as their longest example, and the last micro-batches may be short
    shape = model_shape(name_or_path, config_overrides)
    if shape is None:
        return None  # a hub id: its shape is not known without the network
    tokens = micro_batch_size * seq_len
    need = tokens * shape.hidden_size * shape.num_hidden_layers * BYTES_PER_VALUE
    limit, what = largest_memory(use_gpu)
    if need <= limit:
        return None
    return (
        f"train.micro_batch_size={micro_batch_size} × data.seq_len={seq_len} = {_sci(tokens)} tokens per micro-batch needs "
        f"≥ {human_bytes(need)} of activations ({shape.num_hidden_layers} layers × hidden size {shape.hidden_size} × "
        f"{BYTES_PER_VALUE} bytes per token, kept even with activation checkpointing; {shape.source}); {what}: "
        "lower train.micro_batch_size (or data.seq_len)"
    )

"""A preset's seeded random init, one block at a time, so no rank ever holds the whole model.

The model is cut into *init units* in module order: each decoder layer, and each module outside the
layers that holds parameters itself (the token embedding, the final norm, an untied LM head). Rank 0
materialises one unit at a time on ``init_device`` (a deep copy of the meta module), seeds torch's
generator with :func:`unit_seed` (the run's seed and the unit's index) and runs the model's own
transformers init (``_init_weights``, children before parents as ``Module.apply`` does); then every
tensor is broadcast and each rank copies its own FSDP2 rows. So the weights depend on the seed, the
model config and the init device only: the same at any world size, with or without CPU offload, and
the peak extra memory is one unit (the 152k-token embedding of Qwen2.5-7B: 2.2 GB in fp32) rather
than the model (30 GB). Random kernels differ between devices, so a GPU init differs from a CPU
init of the same seed.

:func:`preset_states` yields the same tensors unit by unit for an unsharded module
(:func:`rayft.train.model.load_full_model`: the reference in tests, the peers in ``rayft bench train``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer

from rayft.train.hf_weights import shard_rows


def unit_seed(seed: int, index: int) -> int:
    """The generator seed of init unit ``index`` for the run's ``seed`` (a 63-bit integer)."""
    return (seed * 1_000_003 + index + 1) % (1 << 63)


def init_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(prefix, module)`` for each init unit of ``model`` (meta or real), in module order: each
    decoder layer (transformers' ``GradientCheckpointingLayer``), and each other module that holds
    parameters or persistent buffers directly."""
    units: list[tuple[str, torch.nn.Module]] = []
    skip: tuple[str, ...] = ()
    for name, mod in model.named_modules():
        if skip and name.startswith(skip):
            continue
        if isinstance(mod, GradientCheckpointingLayer):
            units.append((name, mod))
            skip = (name + ".",)
        elif any(True for _ in mod.parameters(recurse=False)) or own_persistent_buffers(mod):
            units.append((name, mod))
    return units


def own_persistent_buffers(module: torch.nn.Module) -> list[str]:
    """The names of the buffers ``module`` holds itself and saves in its state dict."""
    return [n for n, b in module.named_buffers(recurse=False) if b is not None and n not in module._non_persistent_buffers_set]


def largest_unit_params(model: torch.nn.Module) -> int:
    """The parameter count of ``model``'s largest init unit (the most rank 0 holds at once)."""
    return max(sum(p.numel() for p in unit.parameters()) for _, unit in init_units(model))


def unit_tensor_names(model: torch.nn.Module, prefix: str, unit: torch.nn.Module) -> list[str]:
    """The full names of the tensors unit ``prefix`` initialises: its parameters that are not a
    second name of an earlier tensor (a tied LM head is the embedding) and its persistent buffers."""
    # de-duplicated: a tied weight (or a shared buffer) keeps its first name
    own = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    params = dict(unit.named_parameters(remove_duplicate=False))
    keys = sorted(unit.state_dict(keep_vars=True), key=lambda n: n not in params)  # parameters, then persistent buffers
    return [full for n in keys if (full := f"{prefix}.{n}" if prefix else n) in own]


def unit_state(
    model: torch.nn.Module, prefix: str, unit: torch.nn.Module, seed: int, index: int, device: torch.device, names: list[str]
) -> dict[str, torch.Tensor]:
    """Unit ``index``'s initial tensors ``names`` (:func:`unit_tensor_names`; fp32, on ``device``):
    a fresh copy of the module, filled by the model's own ``_init_weights`` under :func:`unit_seed`.
    Torch's global generator state is restored afterwards."""
    fresh = copy.deepcopy(unit).to_empty(device=device)
    # torch.manual_seed seeds every visible GPU's generator too: restore them all
    fork = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=fork), torch.no_grad():
        torch.manual_seed(unit_seed(seed, index))
        fresh.apply(model._init_weights)
    state = {f"{prefix}.{k}" if prefix else k: v for k, v in fresh.state_dict().items()}
    return {n: state[n] for n in names}


def preset_states(
    conf: PretrainedConfig, seed: int, device: torch.device, build: bool = True
) -> Iterator[tuple[list[str], dict[str, torch.Tensor]]]:
    """For each init unit of the model ``conf`` describes that has tensors of its own (a tied LM
    head has none): ``(names, tensors)``, the tensors built on ``device`` one unit at a time (only
    the caller keeps them alive); ``{}`` instead when not ``build`` (the ranks that receive them)."""
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    for index, (prefix, unit) in enumerate(init_units(ref)):
        if names := unit_tensor_names(ref, prefix, unit):
            yield names, unit_state(ref, prefix, unit, seed, index, device, names) if build else {}


def fill_sharded_preset(model: torch.nn.Module, conf: PretrainedConfig, seed: int, init_device: torch.device) -> None:
    """Fill the FSDP2-sharded ``model`` (allocated, e.g. after ``to_empty``) with the preset's
    seeded init: rank 0 builds each unit on ``init_device`` and broadcasts its tensors; each rank
    copies its own rows. Call on every rank; the names must match the meta model ``conf`` builds.

    Raises:
        KeyError: a unit tensor the sharded model does not have.
    """
    rank = dist.get_rank()
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    for names, full in preset_states(conf, seed, init_device, build=rank == 0):
        for name in names:
            target = targets[name]
            local = target.to_local() if isinstance(target, DTensor) else target
            # broadcast where the shards live (the host under CPU offload: gloo), in the target's dtype
            if rank == 0:
                value = full.pop(name).to(local.device, local.dtype)
            else:
                value = torch.empty(target.shape, dtype=local.dtype, device=local.device)
            if dist.get_world_size() > 1:
                dist.broadcast(value, src=0)
            if isinstance(target, DTensor):
                value = value[own_rows(target)]
            with torch.no_grad():
                local.copy_(value)
            del value


def own_rows(param: DTensor) -> slice:
    """This rank's dim-0 rows of an FSDP2 parameter (``Shard(0)`` on a 1-D mesh, ``torch.chunk``
    semantics: :func:`rayft.train.hf_weights.shard_rows`).

    Raises:
        ValueError: another placement (FSDP2 gives ``Shard(0)`` only).
    """
    if tuple(param.placements) != (Shard(0),):
        raise ValueError(f"preset init: expected an FSDP2 Shard(0) parameter, got placements {param.placements}")
    mesh = param.device_mesh
    start, stop = shard_rows(param.shape[0], mesh.get_local_rank(), mesh.size())
    return slice(start, stop)

"""Hugging Face safetensors ↔ FSDP2 shards, with no rank holding the whole model.

Loading (:func:`load_sharded_weights`): every rank reads from the model directory's ``*.safetensors``
files only the rows of its own shards (DCP's ``HuggingFaceStorageReader``, which slices each tensor
lazily through safetensors' ``get_slice``) and casts them into its fp32 shards. A host's peak memory
is its ranks' shares of the model, not the model.

Exporting (:func:`write_sharded_hf_weights`): every rank writes its shards (DCP's
``HuggingFaceStorageWriter`` with ``save_distributed``), then the files of the export are assembled
from them, each rank assembling a share of the files with one full tensor in memory at a time
(torch's ``consolidate_safetensors_files_on_every_rank``). The result is a plain Hugging Face
directory: ``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``.

Both are collective over the default process group and need the directory on a file system every
rank sees (a local disk on one node, a shared file system across nodes).

Shapes: FSDP2 shards every parameter on dim 0 (``Shard(0)``), rank ``r`` of ``W`` holding rows
``[r·c, min((r+1)·c, n))`` with ``c = ⌈n / W⌉`` (:func:`shard_rows`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

#: the index file of a Hugging Face checkpoint split over several files
INDEX_FILE = "model.safetensors.index.json"
#: the file of a one-file checkpoint
SINGLE_FILE = "model.safetensors"
#: largest export file, bytes (Hugging Face's own default shard size is 5 GB; smaller files keep the
#: per-file buffers of the write, and the consolidation's share of each rank, small)
EXPORT_FILE_BYTES = 2 * 2**30


class WeightsError(ValueError):
    """A model directory whose safetensors do not match the model (missing tensors, wrong shapes)."""


def safetensors_keys(directory: str | os.PathLike) -> dict[str, list[int]] | None:
    """Every tensor name in the directory's safetensors → its shape; None when the directory has no
    ``*.safetensors`` (e.g. a ``pytorch_model.bin`` checkpoint). Reads only the files' headers."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                shapes[key] = list(f.get_slice(key).get_shape())
    return shapes


def local_model_dir(name_or_path: str, revision: str | None = None) -> Path | None:
    """The local directory of a model's safetensors: ``name_or_path`` itself when it is a directory,
    else the hub snapshot (config and safetensors only; downloaded once per host, the Hugging Face
    cache's file locks serialising ranks of one host). None when the model has no safetensors."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path if any(path.glob("*.safetensors")) else None
    from huggingface_hub import snapshot_download

    snap = Path(snapshot_download(name_or_path, revision=revision, allow_patterns=["*.safetensors", "*.json"]))
    return snap if any(snap.glob("*.safetensors")) else None


def loadable_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict (FSDP2: ``DTensor`` shards sharing the parameters' storage) without
    the output embedding when it is the input embedding's tensor (a tied checkpoint stores it once)."""
    sd = dict(module.state_dict())
    out, inp = module.get_output_embeddings(), module.get_input_embeddings()
    if out is not None and out.weight is inp.weight:
        head = next(name for name, mod in module.named_modules() if mod is out)
        sd.pop(f"{head}.weight", None)
    return sd


def load_sharded_weights(module: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Collective: fill ``module``'s parameters (FSDP2 shards, any dtype: values are cast) from the
    safetensors in ``directory``, each rank reading only its rows.

    Raises:
        WeightsError: a tensor of the model missing from the files, or one of another shape.
    """
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    sd = loadable_state_dict(module)
    have = safetensors_keys(directory) or {}
    missing = sorted(set(sd) - set(have))
    if missing:
        raise WeightsError(f"{directory}: {len(missing)} tensor(s) of the model are not in its safetensors, e.g. {missing[:3]}")
    wrong = [f"{k} {have[k]} (model {list(v.shape)})" for k, v in sd.items() if list(v.shape) != have[k]]
    if wrong:
        raise WeightsError(f"{directory}: tensor shapes differ from the model's: {', '.join(wrong[:3])}")
    with torch.no_grad():
        dcp.load(sd, storage_reader=HuggingFaceStorageReader(str(directory)))


def export_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors to export, each rank's shards as ``DTensor``s of plain tensors (torchao's float8
    weight wrapper unwrapped to the fp32 values it holds), without a tied output embedding."""
    from torch.distributed.tensor import DTensor

    from rayft.train.checkpoint import plain_tensor

    out = {}
    for name, t in loadable_state_dict(module).items():
        t = t.detach()
        if isinstance(t, DTensor):
            local = plain_tensor(t.to_local())
            t = DTensor.from_local(local, t.device_mesh, t.placements, shape=t.shape, stride=t.stride(), run_check=False)
        else:
            t = plain_tensor(t)
        out[name] = t
    return out


def file_index(sizes: Iterable[tuple[str, int]], n_files: int) -> dict[str, int]:
    """Tensor name → export file number (1…n): tensors in the given order, cut into ``n_files``
    contiguous runs of about equal bytes (a file may end up empty only when a tensor outweighs the
    rest; the numbering then stays dense). ``sizes``: (name, bytes) pairs."""
    sizes = list(sizes)
    total = sum(b for _, b in sizes)
    target = total / n_files if n_files else total
    index, used, current = {}, 0, 1
    for name, nbytes in sizes:
        if used >= target * current and current < n_files:
            current += 1
        index[name] = current
        used += nbytes
    # dense numbering 1..k
    renumber = {old: new for new, old in enumerate(sorted(set(index.values())), start=1)}
    return {name: renumber[i] for name, i in index.items()}


def export_file_count(total_bytes: int, world_size: int, file_bytes: int = EXPORT_FILE_BYTES) -> int:
    """Number of export files: a multiple of the world size (each rank assembles as many), each at
    most ``file_bytes`` when the tensors allow."""
    per_rank = max(1, math.ceil(total_bytes / (world_size * file_bytes)))
    return world_size * per_rank


def write_sharded_hf_weights(module: torch.nn.Module, out_dir: str | os.PathLike) -> dict[str, int]:
    """Collective: write ``module``'s weights (fp32, as trained) into ``out_dir`` as Hugging Face
    safetensors files and their index, no rank holding more than its shards and one full tensor.
    Returns tensor name → file number. The per-rank part files (``out_dir/sharded``) are removed."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint._consolidate_hf_safetensors import (  # torch's own (used by torchtitan); no public name yet
        consolidate_safetensors_files_on_every_rank,
    )

    sd = export_state_dict(module)
    world = dist.get_world_size()
    sizes = [(name, t.numel() * t.element_size()) for name, t in sd.items()]
    total = sum(b for _, b in sizes)
    index = file_index(sizes, min(len(sizes), export_file_count(total, world)))
    out_dir = Path(out_dir)
    parts = out_dir / "sharded"
    if dist.get_rank() == 0:
        parts.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(sd, storage_writer=HuggingFaceStorageWriter(str(parts), fqn_to_index_mapping=index, save_distributed=True))
    dist.barrier()
    consolidate_safetensors_files_on_every_rank(str(parts), str(out_dir), fqn_to_index_mapping=index)
    if dist.get_rank() == 0:
        shutil.rmtree(parts, ignore_errors=True)
        if max(index.values()) == 1:  # one file: the name transformers looks for first
            os.replace(out_dir / next(out_dir.glob("model-*.safetensors")).name, out_dir / SINGLE_FILE)
            (out_dir / INDEX_FILE).unlink()
    dist.barrier()
    return index


def shard_rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a dim-0 length ``n`` that FSDP2's ``Shard(0)`` gives ``rank`` of
    ``world`` (``torch.chunk`` semantics: chunks of ⌈n / world⌉, the last ones short or empty)."""
    c = math.ceil(n / world) if n else 0
    start = min(rank * c, n)
    return start, min(start + c, n)


def compare_export(module: torch.nn.Module, out_dir: str | os.PathLike, device: torch.device) -> dict[str, float | int]:
    """Collective: compare every exported tensor with this rank's shards, reading back only this
    rank's rows (``device``: the process group's, for the all-reduce). Returns (on every rank, all-reduced) ``{"tensors": n, "max_abs_diff": d}``; ``d``
    is 0.0 for an exact export.

    Raises:
        WeightsError: a tensor missing from the export.
    """
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor, Shard

    out_dir = Path(out_dir)
    index_path = out_dir / INDEX_FILE
    if index_path.exists():
        weight_map = json.loads(index_path.read_text())["weight_map"]
    else:
        with safe_open(str(out_dir / SINGLE_FILE), framework="pt") as f:
            weight_map = dict.fromkeys(f.keys(), SINGLE_FILE)
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = 0.0
    sd = export_state_dict(module)
    missing = sorted(set(sd) - set(weight_map))
    if missing:
        raise WeightsError(f"{out_dir}: the export lacks {missing[:3]}")
    by_file: dict[str, list[str]] = {}
    for name in sd:
        by_file.setdefault(weight_map[name], []).append(name)
    for file, names in by_file.items():  # one file mapped at a time: the pages read are let go with it
        with safe_open(str(out_dir / file), framework="pt") as f:
            for name in names:
                t, sl = sd[name], f.get_slice(name)
                if isinstance(t, DTensor):
                    if tuple(t.placements) != (Shard(0),):
                        raise WeightsError(f"{name}: placements {t.placements}, expected FSDP2's Shard(0)")
                    start, stop = shard_rows(t.shape[0], rank, world)
                    mine, got = t.to_local(), (sl[start:stop] if stop > start else None)
                else:
                    mine, got = t, sl[:]
                if got is not None and mine.numel():
                    worst = max(worst, (got.to(torch.float64) - mine.detach().cpu().to(torch.float64)).abs().max().item())
    stats = torch.tensor([worst], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    return {"tensors": len(sd), "max_abs_diff": stats.item()}

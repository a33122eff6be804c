"""Hugging Face safetensors ↔ FSDP2 shards, with no rank holding the whole model.

Loading (:func:`load_sharded_weights`): every rank reads from the model directory's ``*.safetensors``
files only the rows of its own shards (DCP's ``HuggingFaceStorageReader``, which slices each tensor
lazily through safetensors' ``get_slice``) and casts them into its fp32 shards. A host's peak memory
is its ranks' shares of the model, not the model.

Exporting (:func:`write_sharded_hf_weights`): the export's files are shared out over the ranks;
for each tensor, in file order, every rank sends its rows to the rank of its file, which streams
it into that file, so each byte is written once and a rank holds one full tensor at a time. The
result is a plain Hugging Face directory: ``model-0000i-of-0000n.safetensors`` and
``model.safetensors.index.json``.

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
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

#: the index file of a Hugging Face checkpoint split over several files
INDEX_FILE = "model.safetensors.index.json"
#: the file of a one-file checkpoint
SINGLE_FILE = "model.safetensors"
#: largest export file, bytes (Hugging Face's own default shard size is 5 GB; smaller files keep the
#: work of the export spread over more ranks)
EXPORT_FILE_BYTES = 2 * 2**30


class WeightsError(ValueError):
    """A model directory whose safetensors do not match the model (missing tensors, wrong shapes)."""


#: safetensors dtypes read into fp32 shards as they are (anything else, e.g. F8_E4M3 with scales
#: beside it, is a quantized format that transformers dequantizes while loading)
PLAIN_DTYPES = {"F32", "F16", "BF16"}


def sharded_io_available() -> bool:
    """True when this torch has DCP's Hugging Face reader, which the sharded load needs (torch 2.9
    and later; the sharded export needs only point-to-point sends and safetensors' format)."""
    try:
        from torch.distributed.checkpoint import HuggingFaceStorageReader  # noqa: F401
    except ImportError:
        return False
    return True


def checkpoint_files(directory: str | os.PathLike) -> list[str]:
    """The safetensors files that hold a checkpoint: those its ``model.safetensors.index.json``
    lists, else ``model.safetensors``, else every ``*.safetensors`` (names, sorted). A repository may
    ship other safetensors beside them (Mistral's ``consolidated.safetensors``): they are not read."""
    directory = Path(directory)
    if (directory / INDEX_FILE).exists():
        return sorted(set(json.loads((directory / INDEX_FILE).read_text())["weight_map"].values()))
    if (directory / SINGLE_FILE).exists():
        return [SINGLE_FILE]
    return sorted(p.name for p in directory.glob("*.safetensors"))


def safetensors_header(directory: str | os.PathLike, files: Iterable[str] | None = None) -> dict[str, tuple[list[int], str]]:
    """Tensor name → (shape, safetensors dtype such as ``BF16``) over ``files`` of ``directory``
    (default :func:`checkpoint_files`). Reads only the files' headers."""
    from safetensors import safe_open

    out: dict[str, tuple[list[int], str]] = {}
    for name in files if files is not None else checkpoint_files(directory):
        with safe_open(str(Path(directory) / name), framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                out[key] = (list(sl.get_shape()), sl.get_dtype())
    return out


def safetensors_keys(directory: str | os.PathLike) -> dict[str, list[int]] | None:
    """Every tensor name of the checkpoint in ``directory`` → its shape; None when it has no safetensors."""
    if not checkpoint_files(directory):
        return None
    return {k: shape for k, (shape, _dtype) in safetensors_header(directory).items()}


@dataclass(frozen=True)
class ShardedSource:
    """Where every rank reads its shards from: ``directory`` on rank 0's host, ``files`` in it; for a
    hub model, ``repo`` and ``commit`` let a rank on another host fetch the same files."""

    directory: str
    files: tuple[str, ...]
    repo: str | None = None
    commit: str | None = None


def inspect_source(name_or_path: str, revision: str | None, meta_model: torch.nn.Module, conf) -> tuple[ShardedSource | None, str]:
    """Rank 0: whether the model's checkpoint can be read shard by shard, and if not why (the
    reason, for the log). Downloads a hub model's config, index and safetensors (only the files the
    index lists) into the Hugging Face cache."""
    if getattr(conf, "quantization_config", None):
        return None, "a quantized checkpoint (quantization_config): transformers dequantizes it"
    path = Path(name_or_path).expanduser()
    repo = commit = None
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        repo = name_or_path
        meta = Path(snapshot_download(repo, revision=revision, allow_patterns=["*.json"]))
        commit = meta.name  # the snapshot's directory is named by its commit
        files = checkpoint_files(meta) if (meta / INDEX_FILE).exists() else [SINGLE_FILE]
        try:
            path = Path(snapshot_download(repo, revision=commit, allow_patterns=["*.json", *files]))
        except Exception as e:  # noqa: BLE001 - any hub failure: the rank-0 path reports it properly
            return None, f"its safetensors could not be fetched ({type(e).__name__}: {e})"
    files = checkpoint_files(path)
    if not files or not all((path / f).exists() for f in files):
        return None, "no safetensors (e.g. pytorch_model.bin only)"
    header = safetensors_header(path, files)
    odd = sorted({dtype for _shape, dtype in header.values()} - PLAIN_DTYPES)
    if odd:
        return None, f"tensors stored as {', '.join(odd)} (a quantized format transformers converts while loading)"
    problem = mismatch(loadable_state_dict(meta_model), {k: shape for k, (shape, _dtype) in header.items()})
    if problem:
        return None, problem + (": a format transformers converts while loading" if "not in its safetensors" in problem else "")
    return ShardedSource(str(path), tuple(files), repo, commit), ""


def mismatch(model_tensors: dict[str, torch.Tensor], stored: dict[str, list[int]]) -> str | None:
    """Why the stored tensors (name → shape) cannot fill the model's (a missing name, a shape that
    differs), or None when every tensor of the model is there with its shape."""
    missing = sorted(set(model_tensors) - set(stored))
    if missing:
        return f"{len(missing)} tensor name(s) of the model are not in its safetensors (e.g. {missing[:2]})"
    wrong = [f"{k} {stored[k]} (model {list(v.shape)})" for k, v in model_tensors.items() if list(v.shape) != stored[k]]
    return f"tensor shapes differ from the model's: {', '.join(wrong[:3])}" if wrong else None


def local_copy(source: ShardedSource) -> str:
    """This rank's directory holding ``source``'s files: rank 0's when this host sees it, else the
    hub snapshot fetched here (same commit). Raises when neither is possible."""
    path = Path(source.directory)
    if all((path / f).is_file() for f in source.files):
        return str(path)
    if source.repo is None:
        raise FileNotFoundError(f"{source.directory} (rank 0's model directory) is not on this host")
    from huggingface_hub import snapshot_download

    return snapshot_download(source.repo, revision=source.commit, allow_patterns=["*.json", *source.files])


def agree_on_source(
    name_or_path: str, revision: str | None, meta_model: torch.nn.Module, conf, device: torch.device
) -> tuple[str | None, str]:
    """Collective: this rank's directory to read its shards from, or None on every rank (then rank 0
    loads the whole model and broadcasts it) with the reason. Rank 0 inspects the checkpoint
    (:func:`inspect_source`) and tells the others; each rank then finds the files on its host (or
    fetches the same hub commit); if any rank cannot, none reads sharded."""
    box: list = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = inspect_source(name_or_path, revision, meta_model, conf)
        except Exception as e:  # noqa: BLE001 - the others wait in the broadcast: tell them, then rank 0's own load reports it
            box[0] = (None, f"its checkpoint could not be inspected ({type(e).__name__}: {e})")
    dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
    source, why = box[0]
    if source is None:
        return None, why
    try:
        local, problem = local_copy(source), ""
    except Exception as e:  # noqa: BLE001 - reported through rank 0, then every rank falls back together
        local, problem = None, f"{type(e).__name__}: {e}"
    ok = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 0:
        return None, f"a rank could not read {source.directory}'s safetensors" + (f" ({problem})" if problem else "")
    return local, ""


def loadable_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict (FSDP2: ``DTensor`` shards sharing the parameters' storage) without
    the output embedding when it is the input embedding's tensor (a tied checkpoint stores it once)."""
    sd = dict(module.state_dict())
    out, inp = module.get_output_embeddings(), module.get_input_embeddings()
    if out is not None and out.weight is inp.weight:
        sd.pop(output_embedding_key(module), None)
    return sd


def output_embedding_key(module: torch.nn.Module) -> str | None:
    """The state-dict name of the LM head's weight (``lm_head.weight`` for transformers' causal LMs), None without one."""
    out = module.get_output_embeddings()
    return next((f"{name}.weight" for name, mod in module.named_modules() if mod is out), None) if out is not None else None


def load_sharded_weights(module: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Collective: fill ``module``'s parameters (FSDP2 shards, any dtype: values are cast) from the
    safetensors in ``directory`` (:func:`checkpoint_files`), each rank reading only its rows.

    Raises:
        WeightsError: a tensor of the model missing from the files, or one of another shape.
    """
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    sd = loadable_state_dict(module)
    files = checkpoint_files(directory)
    problem = mismatch(sd, {k: shape for k, (shape, _dtype) in safetensors_header(directory, files).items()})
    if problem:
        raise WeightsError(f"{directory}: {problem}")
    # the reader takes every *.safetensors of its directory: give it one holding only the checkpoint's files
    others = {p.name for p in Path(directory).glob("*.safetensors")} - set(files)
    view = tempfile.mkdtemp(prefix="rayft-weights-") if others else None
    try:
        if view:
            for f in files:
                os.symlink(Path(directory, f).resolve(), Path(view, f))
        with torch.no_grad():
            dcp.load(sd, storage_reader=HuggingFaceStorageReader(view or str(directory)))
    finally:
        if view:
            shutil.rmtree(view, ignore_errors=True)


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


def export_file_name(i: int, n: int) -> str:
    """The name of export file ``i`` of ``n`` (1-based), as transformers' own sharded files are named."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def export_file_count(total_bytes: int, file_bytes: int = EXPORT_FILE_BYTES) -> int:
    """Number of export files: as few as keep each at most ``file_bytes`` (one for a small model)."""
    return max(1, math.ceil(total_bytes / file_bytes))


def write_sharded_hf_weights(module: torch.nn.Module, out_dir: str | os.PathLike, file_bytes: int = EXPORT_FILE_BYTES) -> dict[str, int]:
    """Collective: write ``module``'s weights (fp32, as trained) into ``out_dir`` as Hugging Face
    safetensors files (``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` and
    ``model.safetensors.index.json``). File ``i`` is written by rank ``(i - 1) % world``: for each
    tensor in file order every rank sends its rows to the file's rank (:func:`gathered_on`), which
    streams the tensor to disk (:class:`rayft.train.safetensors_stream.SafetensorsStream`), so each
    file is written once and no rank holds more than its shards and one full tensor on its device
    (two on the host while writing: one being written, the next waiting). ``file_bytes``: the
    largest file wanted, bytes. Returns tensor name → file number.

    Raises:
        ValueError: a tensor of a dtype safetensors cannot store (on every rank, before any write).
        OSError: opening, writing or closing a file, or the index, failed on this rank or another:
            raised on every rank once every rank has joined every transfer, so that the ranks'
            collectives stay matched (a failure inside a transfer itself, such as running out of
            device memory for the tensor, is not covered: the other ranks then wait for it).
    """
    from rayft.train.safetensors_stream import DTYPE_NAMES, SafetensorsStream

    sd = export_state_dict(module)
    unstorable = sorted({str(t.dtype) for t in sd.values() if t.dtype not in DTYPE_NAMES})
    if unstorable:
        raise ValueError(f"the export holds tensors of {', '.join(unstorable)}, which safetensors cannot store")
    sizes = [(name, t.numel() * t.element_size()) for name, t in sd.items()]
    total = sum(b for _, b in sizes)
    index = file_index(sizes, min(len(sizes), export_file_count(total, file_bytes)))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank, world, n = dist.get_rank(), dist.get_world_size(), max(index.values())
    error: Exception | None = None  # kept, not raised, until every rank has joined every transfer
    for i in range(1, n + 1):
        names = [k for k, f in index.items() if f == i]
        stream, owner = None, (i - 1) % world
        if owner == rank and error is None:
            try:
                entries = {k: (sd[k].dtype, tuple(sd[k].shape)) for k in names}
                stream = SafetensorsStream(out_dir / export_file_name(i, n), entries, {"format": "pt"})
            except Exception as e:  # noqa: BLE001 -- told to every rank below
                error = e
        try:
            for name in names:
                full = gathered_on(sd[name], owner)  # collective: every rank, every tensor
                if stream is not None:
                    try:
                        stream.write(name, full)
                    except Exception as e:  # noqa: BLE001 -- told to every rank below
                        error = e
                        stream.abort()
                        stream = None
                del full
        except BaseException:  # a failed transfer, an interrupt: the partial file and its writer thread go
            if stream is not None:
                stream.abort()
            raise
        if stream is not None:
            try:
                stream.close()
            except Exception as e:  # noqa: BLE001 -- told to every rank below
                error = e
                stream.abort()
    raise_on_any_rank(error, "writing the export")
    if rank == 0:  # the index only once every file is whole: a failed export leaves none
        try:
            write_index(out_dir, index, dict(sizes))
        except Exception as e:  # noqa: BLE001 -- told to every rank
            error = e
    raise_on_any_rank(error, "writing the export's index")  # also: named before any rank reads the export
    return index


def raise_on_any_rank(error: Exception | None, what: str) -> None:
    """Collective: every rank learns whether any rank failed; the failed ones raise their own
    ``error``, the others an ``OSError`` naming the first failed rank and its error (so all ranks
    raise, or none)."""
    failures: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(failures, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    failed = [(r, f) for r, f in enumerate(failures) if f]
    if failed:
        raise OSError(f"{what} failed on rank {failed[0][0]}: {failed[0][1]}")


def gathered_on(t: torch.Tensor, dst: int) -> torch.Tensor | None:
    """Collective for a ``DTensor``: the whole tensor on rank ``dst`` of the default group (None on
    the others). A ``Shard(0)`` tensor over a 1-D mesh, as FSDP2 shards every parameter, goes to
    ``dst`` only: each rank sends its rows point to point into one buffer there (the model crosses
    the network once, not once per rank); other placements go through ``DTensor.full_tensor``. A
    shard kept on the host (CPU offload) travels through the mesh's device. A plain tensor: as it
    is, on every rank."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        return t
    mesh, local = t.device_mesh, t.to_local()
    on_mesh = torch.device("cpu") if mesh.device_type == "cpu" else torch.device(mesh.device_type, torch.accelerator.current_device_index())
    if mesh.ndim != 1 or tuple(t.placements) != (Shard(0),):
        if local.device != on_mesh:
            t = DTensor.from_local(local.to(on_mesh), mesh, t.placements, shape=t.shape, stride=t.stride(), run_check=False)
        full = t.full_tensor()
        return full if dist.get_rank() == dst else None
    group, world, n = mesh.get_group(), mesh.size(), t.shape[0]
    me, to = mesh.get_local_rank(), dist.get_group_rank(group, dst)
    if world == 1:
        return local
    if n == 0:
        return torch.empty(t.shape, dtype=local.dtype) if me == to else None
    rows = math.ceil(n / world)
    local = local.to(on_mesh).contiguous()
    if me != to:
        # a short last shard is sent padded (the receiver's buffer slots are rows long); the padding
        # lands past row n, so it is left unset
        send = local if local.shape[0] == rows else torch.cat([local, local.new_empty((rows - local.shape[0], *t.shape[1:]))])
        for op in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, group=group, group_peer=to)]):
            op.wait()
        return None
    # rank r holds rows [r·rows, …) (shard_rows): received into one buffer, the tensor is its first n rows
    whole = torch.empty((world * rows, *t.shape[1:]), dtype=local.dtype, device=on_mesh)
    parts = whole.split(rows)
    parts[me][: local.shape[0]].copy_(local)
    recvs = [dist.P2POp(dist.irecv, parts[r], group=group, group_peer=r) for r in range(world) if r != me]
    for op in dist.batch_isend_irecv(recvs):
        op.wait()
    return whole[:n]


def dcp_to_hf_files(checkpoint: str, model_config, out_dir: str | os.PathLike, file_bytes: int | None = None) -> dict[str, int]:
    """The ``"model"`` part of a DCP checkpoint (rayft's sharded checkpoints, any world size) as
    Hugging Face safetensors files in ``out_dir`` (fp32), in one process, reading one export
    file's tensors at a time (:func:`write_weight_files`). Returns tensor name → file number."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    shapes = {k: v.shape for k, v in loadable_state_dict(skeleton).items()}

    def read(names: list[str]) -> dict[str, torch.Tensor]:
        part = {k: torch.empty(shapes[k], dtype=torch.float32) for k in names}
        dcp.load({"model": part}, checkpoint_id=checkpoint, no_dist=True)
        return part

    return write_weight_files({k: 4 * math.prod(v) for k, v in shapes.items()}, read, out_dir, file_bytes)


def write_weight_files(sizes: dict[str, int], read, out_dir: str | os.PathLike, file_bytes: int | None = None) -> dict[str, int]:
    """Hugging Face safetensors files in ``out_dir`` for tensors of ``sizes`` (name → bytes, in
    file order), cut into files of at most ``file_bytes`` (default :data:`EXPORT_FILE_BYTES`) where
    the tensors allow, with :func:`write_index`'s names. ``read(names)`` returns one file's tensors,
    so only one file's worth is in memory at a time. Returns tensor name → file number."""
    from safetensors.torch import save_file

    index = file_index(sizes.items(), min(len(sizes), export_file_count(sum(sizes.values()), file_bytes or EXPORT_FILE_BYTES)))
    n = max(index.values())
    for i in range(1, n + 1):
        part = read([k for k, f in index.items() if f == i])
        save_file(
            {k: v.contiguous() for k, v in part.items()},
            str(Path(out_dir) / export_file_name(i, n)),
            metadata={"format": "pt"},
        )
        del part
    write_index(Path(out_dir), index, sizes)
    return index


def write_index(out_dir: Path, index: dict[str, int], sizes: dict[str, int]) -> None:
    """The export's file names as transformers looks for them: one file is ``model.safetensors``;
    several are listed in ``model.safetensors.index.json`` (written here, whatever torch wrote)."""
    n = max(index.values())
    names = {i: export_file_name(i, n) for i in range(1, n + 1)}
    if n == 1:
        os.replace(out_dir / names[1], out_dir / SINGLE_FILE)
        (out_dir / INDEX_FILE).unlink(missing_ok=True)
        return
    doc = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": {k: names[i] for k, i in index.items()}}
    (out_dir / INDEX_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def shard_rows(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a dim-0 length ``n`` that FSDP2's ``Shard(0)`` gives ``rank`` of
    ``world`` (``torch.chunk`` semantics: chunks of ⌈n / world⌉, the last ones short or empty)."""
    c = math.ceil(n / world) if n else 0
    start = min(rank * c, n)
    return start, min(start + c, n)


def compare_export(module: torch.nn.Module, out_dir: str | os.PathLike, device: torch.device) -> dict[str, float | int]:
    """Collective: compare every exported tensor with this rank's shards, reading back only this
    rank's rows, a chunk at a time, and comparing them where the shards live
    (:class:`rayft.train.safetensors_rows.RowComparer`). ``device``: the process group's, for the
    all-reduce. Returns ``{"tensors": n, "max_abs_diff": d}``, ``d`` the largest gap over every rank
    (0.0 for an exact export; ``inf`` where a value is NaN on one side only).

    Raises:
        WeightsError: on every rank when any rank found a tensor missing from the export or stored
            with another dtype or shape, a file of another size than its header says, or a
            parameter not sharded as FSDP2 does (``Shard(0)`` over a 1-D mesh): that rank raises its
            own error, the others one that says so, after the one all-reduce every rank joins.
    """
    sd = export_state_dict(module)
    error: WeightsError | None = None
    worst = 0.0
    try:
        worst = compare_own_rows(sd, Path(out_dir))
    except WeightsError as e:
        error = e
    stats = torch.tensor([worst, float(error is not None)], dtype=torch.float64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if stats[1].item() > 0:
        raise WeightsError(f"{out_dir}: another rank found the export wrong while reading it back (its error is in its log)")
    return {"tensors": len(sd), "max_abs_diff": stats[0].item()}


def compare_own_rows(sd: dict[str, torch.Tensor], out_dir: Path) -> float:
    """:func:`compare_export`'s part on one rank, without collectives: the largest gap between this
    rank's rows of the export in ``out_dir`` and its shards (``sd``: :func:`export_state_dict`'s).

    Raises:
        WeightsError: as :func:`compare_export` says, for this rank.
    """
    from torch.distributed.tensor import DTensor, Shard

    from rayft.train.safetensors_rows import LayoutError, RowComparer, read_layout

    try:
        index_path = out_dir / INDEX_FILE
        if index_path.exists():
            weight_map = json.loads(index_path.read_text())["weight_map"]
        else:
            weight_map = dict.fromkeys(read_layout(out_dir / SINGLE_FILE)[1], SINGLE_FILE)
    except (LayoutError, KeyError, ValueError) as e:  # ValueError: an index that is not JSON
        raise WeightsError(f"{out_dir}: the export's index or file cannot be read ({e})") from None
    missing = sorted(set(sd) - set(weight_map))
    if missing:
        raise WeightsError(f"{out_dir}: the export lacks {missing[:3]}")
    by_file: dict[str, list[str]] = {}
    for name in sd:
        by_file.setdefault(weight_map[name], []).append(name)
    worst, comparer = 0.0, RowComparer()
    try:
        for file, names in by_file.items():
            path = out_dir / file
            data_start, entries = read_layout(path)
            for name in names:
                t = sd[name]
                if name not in entries:
                    raise WeightsError(f"{path}: the index places {name} in this file, which does not hold it")
                if entries[name].get("shape") != list(t.shape):
                    raise WeightsError(
                        f"{path}: {name} is stored with shape {entries[name].get('shape')}, the trained tensor has {list(t.shape)}"
                    )
                if isinstance(t, DTensor):
                    if tuple(t.placements) != (Shard(0),) or t.device_mesh.ndim != 1:
                        raise WeightsError(f"{name}: placements {t.placements} on a {t.device_mesh.ndim}-D mesh, expected FSDP2's Shard(0)")
                    rows, mine = shard_rows(t.shape[0], t.device_mesh.get_local_rank(), t.device_mesh.size()), t.to_local()
                else:
                    rows, mine = (0, t.shape[0] if t.dim() else 1), (t if t.dim() else t.reshape(1))
                if mine.numel():
                    worst = max(worst, comparer.gap(path, data_start, entries[name], name, rows, mine.contiguous()))
    except LayoutError as e:
        raise WeightsError(str(e)) from None
    return worst

"""Read a tensor's rows back from a safetensors file and compare them with a tensor in memory.

The export's check (:func:`rayft.train.hf_weights.compare_export`) reads back what each rank wrote
and compares it with that rank's trained shards. Through ``safe_open`` that meant, per tensor, a
copy of the shard from the GPU to pageable host memory, page faults over the file's mapping, and a
comparison on the CPU: 5.2 s for the 1.5B model's 6.2 GB on one H200
(bench/results/2026-12-04-wall-time-compute-copy-1xh200.json, ``read_back``). Here the rows of a
tensor on a GPU are read with plain reads into one pinned host buffer, copied to the device and
compared there, a chunk at a time (the host holds one chunk, never a tensor): 4.28 → 1.30 s
(bench/results/2026-12-04-readback-ab-1xh200.json). A host tensor is compared against a read-only
mapping of its rows.

The layout is safetensors' documented one (https://huggingface.co/docs/safetensors, "Format"): an
8-byte little-endian header length ``n``, ``n`` bytes of JSON (name → ``dtype``, ``shape``,
``data_offsets`` relative to the byte after the header), then the data. A tensor's rows
``[start, stop)`` are one contiguous byte range of it (row-major).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import warnings
from pathlib import Path

import torch

from rayft.train.safetensors_stream import DTYPE_NAMES

#: bytes read and compared at a time (the host buffer's size)
READ_CHUNK = 64 << 20

#: a header larger than this is refused (safetensors' own readers refuse more than 100 MB)
MAX_HEADER_BYTES = 100_000_000


class LayoutError(ValueError):
    """A safetensors file whose header cannot be read, or does not hold what is asked of it."""


def read_layout(path: str | os.PathLike) -> tuple[int, dict[str, dict]]:
    """``(data_start, entries)`` of a safetensors file: the byte where its data begin, and tensor
    name → ``{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}`` (offsets relative to
    ``data_start``), ``__metadata__`` left out.

    Raises:
        LayoutError: the file is shorter than its header or of another size than the header's data
            need; the header is not a JSON object, or an entry's ``data_offsets`` are not
            ``[begin, end]`` with 0 ≤ begin ≤ end.
    """
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise LayoutError(f"{path}: {len(head)} bytes, not a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise LayoutError(f"{path}: a header of {n:,} bytes (more than {MAX_HEADER_BYTES:,}): not a safetensors file")
        text = f.read(n)
    if len(text) < n:
        raise LayoutError(f"{path}: the header says {n:,} bytes, the file ends after {len(text):,}")
    try:
        entries = json.loads(text)
    except ValueError as e:
        raise LayoutError(f"{path}: the header is not JSON ({e})") from None
    if not isinstance(entries, dict):
        raise LayoutError(f"{path}: the header is not a JSON object")
    entries.pop("__metadata__", None)
    end = 0
    for name, entry in entries.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(x) is int for x in offsets)  # not isinstance: a bool is an int too
            and 0 <= offsets[0] <= offsets[1]
        ):
            raise LayoutError(f"{path}: {name} has data_offsets {offsets!r}, not [begin, end]")
        end = max(end, offsets[1])
    size = os.path.getsize(path)
    if size != 8 + n + end:  # every rank sees this, whichever rows it reads
        raise LayoutError(f"{path}: {size:,} bytes, its header describes {8 + n + end:,}")
    return 8 + n, entries


class RowComparer:
    """Compare rows of tensors stored in safetensors files with tensors in memory: a tensor on an
    accelerator through one host buffer of :data:`READ_CHUNK` bytes (pinned for a GPU, so that its
    copies to the device run at the link's rate), a host tensor against a mapping of the file
    (:func:`mapped_gap`). ``through_buffer``: read every tensor through the buffer (default: those
    not on the host)."""

    def __init__(self, through_buffer: bool | None = None) -> None:
        self.through_buffer = through_buffer
        self.buffer: torch.Tensor | None = None
        self.view: memoryview | None = None

    def _buffer_for(self, device: torch.device) -> memoryview:
        if self.buffer is None:
            self.buffer = torch.empty(READ_CHUNK, dtype=torch.uint8, pin_memory=device.type == "cuda")
            self.view = memoryview(self.buffer.numpy())
        return self.view

    def gap(self, path: str | os.PathLike, data_start: int, entry: dict, name: str, rows: tuple[int, int], mine: torch.Tensor) -> float:
        """The largest absolute difference between rows ``[start, stop)`` of tensor ``name`` as
        stored (``entry``: its :func:`read_layout` entry, ``data_start`` the file's) and ``mine``
        (those rows, contiguous, any device; a scalar as one row of one value): 0.0 when equal, NaNs in the same places counting as
        equal, ``inf`` where a NaN stands against a number.

        Raises:
            LayoutError: the stored tensor's dtype is not ``mine``'s, its shape's rows beyond the
                first are not ``mine``'s, ``rows`` lie outside it, its byte range does not match its
                shape, or the file ends before the rows do.
        """
        start, stop = rows
        dtype = DTYPE_NAMES.get(mine.dtype)
        stored = entry.get("shape")
        shape = (stored or [1]) if isinstance(stored, list) else None  # a scalar as one row of one value
        if entry.get("dtype") != dtype:
            raise LayoutError(f"{path}: {name} is stored as {entry.get('dtype')}, the trained tensor is {mine.dtype}")
        if shape is None or list(mine.shape[1:]) != shape[1:] or not 0 <= start <= stop <= shape[0]:
            raise LayoutError(f"{path}: {name} is stored with shape {stored}; rows {start}:{stop} of shape {list(mine.shape)} compared")
        if stop - start != mine.shape[0]:
            raise LayoutError(f"{path}: {name}: rows {start}:{stop} compared with a tensor of {mine.shape[0]} rows")
        item = mine.element_size()
        begin, end = entry["data_offsets"]  # checked by read_layout
        if end - begin != math.prod(shape) * item:
            raise LayoutError(f"{path}: {name} spans bytes {begin}:{end}, its shape {stored} needs {math.prod(shape) * item}")
        flat = mine.reshape(-1)
        offset = data_start + begin + start * math.prod(shape[1:]) * item
        if not (self.through_buffer if self.through_buffer is not None else mine.device.type != "cpu"):
            return mapped_gap(path, offset, flat)
        view = self._buffer_for(mine.device)
        per_chunk = READ_CHUNK // item
        worst = 0.0
        with open(path, "rb", buffering=0) as f:
            for first in range(0, flat.numel(), per_chunk):
                part = flat[first : first + per_chunk]
                nbytes = part.numel() * item
                read_exactly(f, view[:nbytes], offset + first * item, path)
                got = self.buffer[:nbytes].view(mine.dtype).to(mine.device, non_blocking=False)
                if not torch.equal(got, part):
                    worst = max(worst, tensor_gap(got, part))
        return worst


def mapped_gap(path: str | os.PathLike, offset: int, flat: torch.Tensor) -> float:
    """:func:`tensor_gap` of 1-D host tensor ``flat`` and the same number of values stored from byte
    ``offset`` of ``path``, read through a read-only mapping of that range (no copy: on the host, a
    copy into a buffer first took 1.8× as long, bench/gpu/readback_ab.py run on the CPU). The
    mapping is never closed here: the tensor over it holds it, and it goes when they both do.

    Raises:
        LayoutError: the file ends first.
    """
    nbytes = flat.numel() * flat.element_size()
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        if offset + nbytes > os.fstat(f.fileno()).st_size:
            raise LayoutError(f"{Path(path)}: ends before byte {offset + nbytes:,}, inside a tensor its header lists")
        mapped = mmap.mmap(f.fileno(), offset + nbytes - start, offset=start, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():  # read-only on purpose: torch warns that it cannot write into it
        warnings.simplefilter("ignore", UserWarning)
        got = torch.frombuffer(mapped, dtype=flat.dtype, count=flat.numel(), offset=offset - start)
    return tensor_gap(got, flat)


def read_exactly(f, view: memoryview, offset: int, path: str | os.PathLike) -> None:
    """Fill ``view`` from unbuffered file ``f`` starting at byte ``offset``.

    Raises:
        LayoutError: the file ends first.
    """
    f.seek(offset)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise LayoutError(f"{Path(path)}: ends at byte {offset + done:,}, inside a tensor its header lists")
        done += n


def tensor_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest absolute difference of two same-shape tensors, over the positions where they
    differ: 0.0 when equal (NaNs in the same places count as equal, as do equal infinities),
    ``inf`` when a NaN stands against a number or an infinity against anything else. Never NaN."""
    if a.dtype == b.dtype and torch.equal(a, b):
        return 0.0
    a, b = a.to(torch.float64), b.to(torch.float64)
    if not torch.equal(a.isnan(), b.isnan()):
        return math.inf
    differ = (a != b) & ~a.isnan()
    return (a[differ] - b[differ]).abs().max().item() if differ.any() else 0.0

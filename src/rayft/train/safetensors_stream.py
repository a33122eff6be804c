"""A safetensors file written one tensor at a time, for exports larger than a process should hold.

safetensors' own ``save_file`` takes every tensor of the file at once. The sharded export
(:func:`rayft.train.hf_weights.write_sharded_hf_weights`) gathers one full tensor at a time from
its FSDP2 shards, so it writes the header first (every tensor's name, dtype and shape are known
before any is gathered) and then each tensor's bytes as they arrive: a rank holds one full tensor,
not one file. The layout is safetensors' documented one (https://huggingface.co/docs/safetensors,
"Format"): an 8-byte little-endian header length, the JSON header (``{"__metadata__": {str: str},
name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}``, padded with spaces to a multiple of 8
bytes), then the tensors' bytes back to back in header order, row-major, little-endian. Readers
are safetensors' own (``safe_open``, ``load_file``, transformers); the export reads every file back
through them before it is published.

The disk works while the tensors arrive: a writer thread appends each tensor while the caller
gathers and copies the next one to the host, and asks the kernel to start writing each tensor's
bytes out as soon as they are in the page cache (:mod:`rayft.train.writeback`), so that the
``fsync`` at :meth:`SafetensorsStream.close` waits for the last tensor only.
"""

from __future__ import annotations

import json
import math
import os
import queue
import struct
import sys
import threading
from pathlib import Path

import torch

from rayft.train.writeback import start_writeback

#: torch dtype → safetensors dtype name (the ones a model's state dict holds)
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


class SafetensorsStream:
    """Write ``path`` as a safetensors file holding ``entries`` (name → (dtype, shape)), in that
    order; :meth:`write` each tensor in turn, then :meth:`close` (which fsyncs). Use as a context
    manager, or call :meth:`abort` on a failure: either deletes the partial file.

    A writer thread appends the tensors: :meth:`write` returns once its tensor is on the host and
    queued; the host holds at most two of them (one being written, one waiting), a third
    :meth:`write` waits for the first to be written before it copies.

    Raises:
        ValueError: a dtype safetensors has no name for; a tensor written out of order, or whose
            dtype or shape differs from its entry; :meth:`close` before every tensor was written.
        OSError: the writer thread's failure (a full disk, say), raised by the next :meth:`write`
            or by :meth:`close`.
    """

    def __init__(
        self, path: str | os.PathLike, entries: dict[str, tuple[torch.dtype, tuple[int, ...]]], metadata: dict[str, str] | None = None
    ):
        if sys.byteorder != "little":  # safetensors stores little-endian; tensors are written as the host holds them
            raise ValueError(f"{path}: safetensors files are little-endian; this host is {sys.byteorder}-endian")
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in (metadata or {}).items()):
            raise ValueError(f"{path}: safetensors metadata holds strings only, got {metadata!r}")
        self.path = Path(path)
        self.entries = list(entries.items())
        header: dict[str, object] = {"__metadata__": dict(metadata or {})} if metadata else {}
        offset = 0
        for name, (dtype, shape) in self.entries:
            if dtype not in DTYPE_NAMES:
                raise ValueError(f"{self.path}: tensor {name!r} has dtype {dtype}, which safetensors cannot store")
            nbytes = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-(8 + len(text)) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self._file = open(self.path, "wb")  # noqa: SIM115 -- closed by close()/__exit__
        self._file.write(struct.pack("<Q", len(text)) + text)
        self._next = 0
        self._queue: queue.Queue[torch.Tensor | None] = queue.Queue()
        self._host_slots = threading.Semaphore(2)  # host copies alive at once: the one being written, the next
        self._error: BaseException | None = None
        self._closed = False
        self._writer = threading.Thread(target=self._write_queued, name=f"safetensors-writer:{self.path.name}", daemon=True)
        self._writer.start()

    def _write_queued(self) -> None:
        """The writer thread: append each queued host tensor, start its writeback; None ends it.
        After a failure it keeps taking tensors (so that :meth:`write` never blocks) and drops them."""
        fd = self._file.fileno()
        while (host := self._queue.get()) is not None:
            try:
                if self._error is None:
                    start = self._file.tell()
                    self._file.write(memoryview(host.reshape(-1).view(torch.uint8).numpy()))
                    self._file.flush()  # into the page cache, where the kernel can start writing it out
                    start_writeback(fd, start, self._file.tell() - start)
            except BaseException as e:  # noqa: BLE001 -- raised in the caller's thread by write()/close()
                self._error = e
            finally:
                del host
                self._host_slots.release()

    def _raise_writer_error(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append ``tensor`` as the next entry, ``name``: a device tensor is copied to the host here,
        a host tensor is written as it is, so it must not change until :meth:`close`."""
        if self._closed:
            raise ValueError(f"{self.path}: write after the stream was closed or aborted")
        if self._next >= len(self.entries) or self.entries[self._next][0] != name:
            expected = self.entries[self._next][0] if self._next < len(self.entries) else "nothing more"
            raise ValueError(f"{self.path}: got tensor {name!r}, expected {expected!r}")
        dtype, shape = self.entries[self._next][1]
        if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{self.path}: tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}, its entry says {dtype} {tuple(shape)}")
        self._raise_writer_error()
        if tensor.numel():
            self._host_slots.acquire()  # waits while the writer holds two: this copy would be the third
            try:
                host = tensor.detach().to("cpu").contiguous()
            except BaseException:
                self._host_slots.release()
                raise
            self._queue.put(host)
        self._next += 1

    def _stop_writer(self) -> None:
        self._closed = True
        if self._writer.is_alive():
            self._queue.put(None)
            self._writer.join()

    def close(self) -> None:
        """Wait for the writer, then flush and fsync the file (every entry must have been written)."""
        if self._next != len(self.entries):
            missing = [n for n, _ in self.entries[self._next :]]
            raise ValueError(f"{self.path}: closed with {len(missing)} tensor(s) not written, first {missing[0]!r}")
        self._stop_writer()
        self._raise_writer_error()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()

    def abort(self) -> None:
        """Stop the writer, close and delete the partial file (a failure to flush what is buffered
        is ignored: the file is going anyway)."""
        try:
            self._stop_writer()
            self._file.close()
        except OSError:
            pass
        finally:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsStream:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
            return
        try:
            self.close()
        except BaseException:
            self.abort()
            raise

"""A DCP file-system writer that hashes every file while it writes it (:mod:`rayft.train.digests`
holds the digests' algorithm and their check on disk). Its own module because it subclasses DCP's
writer: the driver checks digests without importing torch.distributed.checkpoint.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem

from rayft.train.digests import new_hash
from rayft.train.writeback import WritebackTracker


class _HashingStream:
    """A binary output stream that feeds every byte written to it to a hash (``write``, ``tell``,
    ``flush``, ``fileno`` and ``close`` are what DCP's file writer calls), and asks for their
    writeback every few tens of MB (:class:`rayft.train.writeback.WritebackTracker`). ``error``:
    the ``OSError`` a write raised (``torch.save`` replaces it with a RuntimeError that does not say why)."""

    def __init__(self, raw, h):
        self._raw, self._h = raw, h
        self.error: OSError | None = None
        self._writeback = WritebackTracker(raw.fileno(), raw.tell())
        self._position = raw.tell()

    def write(self, b) -> int:
        mv = memoryview(b).cast("B")
        try:
            n = self._raw.write(mv)
        except OSError as e:
            self.error = e
            raise
        n = len(mv) if n is None else n
        self._h.update(mv if n == len(mv) else mv[:n])
        self._position += n
        self._writeback.wrote(self._position)  # the disk starts on it while DCP serializes the next tensor
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return self._raw.closed


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording the digest of every file it writes completely, by file
    name, and the error of every file it failed to write."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, str] = {}
        self.failures: list[tuple[str, Exception]] = []
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        h = new_hash()
        hashing = None
        try:
            with super().create_stream(path, mode) as stream:
                hashing = _HashingStream(stream, h)
                yield hashing
        except Exception as e:
            with self._lock:
                self.failures.append((Path(path).name, hashing.error if hashing is not None and hashing.error else e))
            raise
        with self._lock:  # reached only when the file was written without an exception
            self.digests[Path(path).name] = h.hexdigest()

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        with self._lock:
            if (d := self.digests.pop(Path(path).name, None)) is not None:
                self.digests[Path(new_path).name] = d

    def rm_file(self, path: str | os.PathLike) -> None:
        super().rm_file(path)
        with self._lock:
            self.digests.pop(Path(path).name, None)

    def clear(self) -> None:
        with self._lock:
            self.digests.clear()
            self.failures.clear()

    def first_failure(self) -> Exception | None:
        with self._lock:
            return self.failures[0][1] if self.failures else None

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.digests)


class HashingFileSystemWriter(dcp.FileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` that hashes each file as its bytes are
    written, in the thread writing it (no file is read back). After a save, :attr:`digests` maps the
    name of every file this rank wrote (its ``__R_I.distcp`` shards; on the coordinator also
    ``.metadata``) to its hex digest; each save (DCP calls :meth:`reset`) starts an empty map. A
    write that fails in any writer thread fails the save (:meth:`write_data`). Takes the same
    arguments as ``FileSystemWriter``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fs = _HashingFileSystem()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)
        self.fs.clear()

    def write_data(self, plan, planner):
        """DCP's ``write_data``, except that a file that failed in one of the extra writer threads
        fails the save: ``FileSystemWriter`` (torch 2.13) loses the exceptions of every thread but
        the calling one, and would otherwise finish a checkpoint whose metadata lacks that file's
        tensors (e.g. one thread's ENOSPC). The error raised is the file system's own (an
        ``OSError`` such as ENOSPC), not the RuntimeError ``torch.save`` makes of it.

        Raises:
            Exception: the first failed file's error, which DCP raises on every rank.
        """
        try:
            result = super().write_data(plan, planner)
        except Exception as e:
            if (error := self.fs.first_failure()) is not None and error is not e:
                raise error from e
            raise
        if (error := self.fs.first_failure()) is not None:
            raise error
        return result

    @property
    def digests(self) -> dict[str, str]:
        """A copy of the digests (file name → hex) of the files written by the last save."""
        return self.fs.snapshot()

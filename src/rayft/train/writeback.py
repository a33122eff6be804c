"""Start a file's writeback to the disk early, while more of it is still being written.

Linux writes dirty pages out in the background only once 10% of the host's available memory is
dirty (``vm.dirty_background_ratio``'s default) or after 30 s: a 6 GB export or an 18 GB checkpoint
on a host with 128 GB sits in the page cache, the disk idle, until the ``fsync`` that ends it, which
then waits for all of it. Asking the kernel to start writing each range as soon as it is written
(``sync_file_range(2)`` with ``SYNC_FILE_RANGE_WRITE``: start, do not wait) keeps the disk busy
while the writer copies the next bytes, so the ``fsync`` waits for the last range only. The call
may block while the disk's queue is full, which paces the writer at the disk's rate. It is a hint:
durability is still the ``fsync``'s; where libc has no ``sync_file_range`` (not Linux) nothing happens.
"""

from __future__ import annotations

import ctypes
import sys

#: ``sync_file_range(2)``'s flag: start writing the range's dirty pages out, do not wait for them
SYNC_FILE_RANGE_WRITE = 2

#: bytes a writer lets accumulate before it asks for their writeback (a few hundred calls per 18 GB)
WRITEBACK_CHUNK = 64 << 20


def _libc_sync_file_range():
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


#: libc's ``sync_file_range``, or None where there is none
SYNC_FILE_RANGE = _libc_sync_file_range() if sys.platform.startswith("linux") else None


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing bytes ``[offset, offset + nbytes)`` of ``fd`` to the disk,
    without waiting for them. Returns whether it was asked (False: no ``sync_file_range`` here, or
    the call failed, e.g. on a file system that does not support it; nothing else changes)."""
    if SYNC_FILE_RANGE is None or nbytes <= 0:
        return False
    return SYNC_FILE_RANGE(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) == 0


class WritebackTracker:
    """For a writer appending to one file: call :meth:`wrote` with the file position after each
    write; every :data:`WRITEBACK_CHUNK` bytes it asks for the writeback of what was written since
    the last request. ``start``: the file position the writer starts at."""

    def __init__(self, fd: int, start: int = 0, chunk: int = WRITEBACK_CHUNK) -> None:
        self.fd, self.asked_to, self.chunk = fd, start, chunk

    def wrote(self, position: int) -> None:
        if position - self.asked_to >= self.chunk:
            start_writeback(self.fd, self.asked_to, position - self.asked_to)
            self.asked_to = position

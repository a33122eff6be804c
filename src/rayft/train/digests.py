"""Checkpoint file digests: the check of files on disk against recorded digests (the DCP writer that
records them while it writes is :mod:`rayft.train.hashing_writer`).

The digest is BLAKE2b with a 16-byte (128-bit) output from the standard library's :mod:`hashlib`
(:data:`ALGORITHM`), written as 32 hex characters. It detects changed bytes (a bit flip, a torn or
overwritten block, a truncated or swapped file); it is not a signature against a deliberate forger.

Cost, measured on this project's 2-vCPU CPU machine (``bench/checkpoint_hash_cost.py``,
``bench/results/2026-12-01-checkpoint-hash-cost-2cpu.json``): 1.61 CPU seconds per GB hashed; a DCP
save through :class:`~rayft.train.hashing_writer.HashingFileSystemWriter` took 1.47 CPU seconds per GB more than through the
plain writer.
``hashlib`` releases the GIL while it hashes, so the ``checkpoint.write_threads`` writer threads of
a rank hash in parallel, each the file it writes, as far as the host has idle cores.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ALGORITHM = "blake2b-128"
_READ_CHUNK = 8 << 20  # bytes per read when hashing a file on disk


def new_hash():
    """A fresh hash object of :data:`ALGORITHM`."""
    return hashlib.blake2b(digest_size=16)


def file_digest(path: str | os.PathLike) -> str:
    """The hex digest of a file's bytes, read in 8 MiB chunks.

    Raises:
        OSError: the file cannot be read (FileNotFoundError when it is absent).
    """
    h = new_hash()
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


@dataclass(frozen=True)
class Mismatch:
    """A file whose bytes do not match its recorded digest; ``got`` is ``"missing"`` for an absent file."""

    file: str
    expected: str
    got: str


def compare(directory: str | os.PathLike, expected: dict[str, str], threads: int | None = None) -> list[Mismatch]:
    """Hash every file named in ``expected`` (name relative to ``directory`` → hex digest) and return
    the ones that differ, sorted by name. Files are hashed in parallel (``threads``, default: up to 8,
    at most one per CPU); the whole check reads each file once.
    """
    names = sorted(expected)
    if not names:
        return []
    workers = threads or max(1, min(8, os.cpu_count() or 1, len(names)))

    def got(name: str) -> str:
        try:
            return file_digest(Path(directory) / name)
        except FileNotFoundError:
            return "missing"

    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(got, names))
    return [Mismatch(n, expected[n], d) for n, d in zip(names, digests) if d != expected[n]]


def merge(per_rank: Iterable[dict[str, str]]) -> dict[str, str]:
    """One map of file name → digest from every rank's (file names never repeat across ranks)."""
    out: dict[str, str] = {}
    for d in per_rank:
        out.update(d)
    return dict(sorted(out.items()))

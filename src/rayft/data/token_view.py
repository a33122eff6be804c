"""A worker's view of its part of a token store: random access to the selected examples, reading
only the shards their rows live in.

:class:`StoreView` has the interface of :class:`~rayft.data.tokenize.TokenizedDataset` that
packing, collate, evaluation and the export use: ``len(view)``, ``view.lengths()`` (int64 [n],
tokens per example) and ``view.example(i)`` (``tokens`` int32 [n_i], ``trainable`` bool [n_i]).
It carries the store's location, the part's shard table (files with size and sha256, example
counts) and the selected examples' ids (their index in the part, int64 [n]) and lengths: about
16 bytes per example, no token. The driver puts it in the object store once; every worker
``ray.get``s it.

The first ``example(i)`` in a shard maps that shard's ``tokens``, ``trainable`` and ``offsets``
with ``np.load(mmap_mode="r")``: a local or shared-filesystem store in place; an ``s3://`` store's
files are first downloaded into a node-local cache directory (``$RAYFT_SHARD_CACHE``, default
``~/.cache/rayft/shards``), written under a temporary name, checked against the manifest's
sha256 and renamed, so the node's workers share one verified copy. A file whose sha256 differs
is refused (:class:`~rayft.data.token_store.StoreError`), never used.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

import numpy as np

from rayft.data.token_store import StoreError

_MAPPED = ("tokens", "trainable", "offsets")


def shard_cache_dir() -> str:
    """The node-local directory for downloaded shards (``$RAYFT_SHARD_CACHE``, default ``~/.cache/rayft/shards``)."""
    return os.path.expanduser(os.environ.get("RAYFT_SHARD_CACHE") or "~/.cache/rayft/shards")


def download_verified(location: str, info: dict[str, Any]) -> str:
    """The local path of ``<location>/<info["file"]>`` (an object-store file), downloaded once per
    node into :func:`shard_cache_dir` and checked against ``info["sha256"]`` and ``info["size"]``.

    Raises:
        StoreError: the downloaded bytes do not match the manifest (the object was changed).
        OSError: the object cannot be read or the cache directory written.
    """
    from rayft.data.sources import arrow_fs

    tag = hashlib.sha256(location.encode()).hexdigest()[:16]
    dest = os.path.join(shard_cache_dir(), tag, info["file"])
    if os.path.exists(dest) and os.path.getsize(dest) == info["size"]:
        return dest  # verified by whoever renamed it into place
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp-{uuid.uuid4().hex[:12]}"
    fs, base = arrow_fs(location)
    h, size = hashlib.sha256(), 0
    try:
        with fs.open_input_stream(f"{base.rstrip('/')}/{info['file']}", compression=None) as src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 22):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if h.hexdigest() != info["sha256"] or size != info["size"]:
            raise StoreError(
                f"{location}/{info['file']}: sha256 {h.hexdigest()[:16]}… ({size} bytes) does not match the manifest's "
                f"{info['sha256'][:16]}… ({info['size']} bytes): the object was changed after the store was written; refusing it "
                "(prepare the data again: rayft data prepare, or delete the store)"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def _raise_open_files_limit() -> None:
    """Lift this process's soft limit on open files to its hard limit (at most 1M)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


class StoreView:
    """The selected examples of one part of a token store (see the module docstring).

    Args:
        location: the store (a local path or an ``s3://`` URI).
        part: ``train`` or ``validation`` (the store's part the ids index).
        shards: the part's shard entries from the manifest (``examples``, ``files``).
        ids: int64 [n], the selected examples' indices in the part, increasing.
        lengths: int64 [n], their token counts.
        fingerprint: the selection's fingerprint (:func:`rayft.data.prepare.selection_fingerprint`).
    """

    def __init__(self, location: str, part: str, shards: list[dict[str, Any]], ids: np.ndarray, lengths: np.ndarray, fingerprint: str):
        self.location, self.part, self.fingerprint = location, part, fingerprint
        self.shards = [{"examples": s["examples"], "files": {k: s["files"][k] for k in _MAPPED}} for s in shards]
        self.starts = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([s["examples"] for s in shards], out=self.starts[1:])
        self.ids = np.ascontiguousarray(ids, dtype=np.int64)
        self._lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        self._lengths.flags.writeable = False
        self._open: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"] = {}  # mapped shards stay with the process that mapped them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lengths.flags.writeable = False

    def __len__(self) -> int:
        return len(self.ids)

    def lengths(self) -> np.ndarray:
        """Tokens per selected example, int64 [n] (read-only)."""
        return self._lengths

    def _path(self, info: dict[str, Any]) -> str:
        if "://" in self.location:
            return download_verified(self.location, info)
        return os.path.join(self.location, info["file"])

    def _shard(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        got = self._open.get(k)
        if got is None:
            if not self._open:
                _raise_open_files_limit()  # each mapped file keeps a descriptor: 3 per shard a worker touches
            files = self.shards[k]["files"]
            got = tuple(np.load(self._path(files[name]), mmap_mode="r", allow_pickle=False) for name in _MAPPED)
            self._open[k] = got
        return got

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int32 [n_i], trainable bool [n_i])`` of selected example ``i`` (read-only views)."""
        gid = int(self.ids[i])
        k = int(np.searchsorted(self.starts, gid, side="right")) - 1
        tokens, trainable, offsets = self._shard(k)
        j = gid - int(self.starts[k])
        a, b = int(offsets[j]), int(offsets[j + 1])
        return np.asarray(tokens[a:b]), np.asarray(trainable[a:b])

    def shards_touched(self) -> list[int]:
        """The shards this process has mapped so far (their index in the part)."""
        return sorted(self._open)

    def to_dataset(self):
        """Every selected example in memory, as a :class:`~rayft.data.tokenize.TokenizedDataset`
        (for tools that need flat arrays, e.g. ``rayft bench train``); counts are left at 0."""
        from rayft.data.tokenize import assemble

        return assemble([self.example(i) for i in range(len(self))])

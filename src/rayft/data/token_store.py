"""The tokenized data of a run, on storage every worker can read: a sharded token store.

A store is a directory ``<root>/<key>/`` (root: ``data.cache_dir``, a local path or an ``s3://``
URI; with ``data.cache_dir: null`` the run directory's ``tokenized/``), ``key`` being the content
hash of the inputs, the tokenizer and the settings (:func:`rayft.data.cache.cache_key`)::

    <root>/<key>/
      manifest.json                      written last: lists every shard file (size, sha256)
      train/<task>-<k>.<array>.npy       the shards of the training files, in input order
      validation/<task>-<k>.<array>.npy  those of data.validation_files (when given)
      <part>/<task>.skipped.jsonl        a task's skipped records, when it skipped many
      skipped_records.jsonl              every skipped record's location and reason (data.on_bad_record: skip)

A shard is what one ingest task (:mod:`rayft.data.ingest`) made of a stretch of its input: the
records it accepted (R), the examples (E, the pieces of those records: a conversation is one, a
long text document several, a piece with no trainable target none) and their tokens (T), as
``.npy`` files (:data:`SHARD_ARRAYS`):

* ``tokens`` int32 [T], ``trainable`` bool [T] (a training target), ``offsets`` int64 [E+1]
  (example *i* is ``tokens[offsets[i]:offsets[i+1]]``);
* ``example_record`` int32 [E] (the shard-local record each example came from) and
  ``example_trainable`` int32 [E] (its trainable tokens);
* ``record_flags`` uint8 [R] (bits :data:`TRUNCATED`, :data:`SPLIT`, :data:`TEXT`) and
  ``record_dropped`` int32 [R] (the record's pieces dropped for lack of a trainable target).

Together they give every count of the report lines for any subset of records without reading a
token. Each file is written atomically (a temporary name, then a rename; an S3 object appears
whole when its upload completes) with its size and sha256 computed while it is written; the
manifest, written last and atomically, lists every file with both, the per-shard counts, the
per-file notes, the report lines and the store digest (sha256 over the shard files' digests).

Opening a store (:func:`open_store`) reads the manifest and lists the directory once: a listed
file that is missing or of another size, or an unreadable manifest, raises :class:`StoreError`
(the caller warns and rebuilds); nothing is read whole. The driver then reads the small per-shard
index arrays (:class:`PartIndex`: O(examples), never the tokens); workers read their examples'
tokens through :class:`rayft.data.token_view.StoreView`.

All I/O goes through pyarrow filesystems (:func:`rayft.data.sources.arrow_fs`).
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

STORE_FORMAT = "rayft-token-store"
STORE_VERSION = 1
MANIFEST = "manifest.json"
SKIPPED_FILE = "skipped_records.jsonl"
#: The arrays of a shard, in this order: (name, dtype).
SHARD_ARRAYS = (
    ("tokens", np.int32),
    ("trainable", np.bool_),
    ("offsets", np.int64),
    ("example_record", np.int32),
    ("example_trainable", np.int32),
    ("record_flags", np.uint8),
    ("record_dropped", np.int32),
)
#: ``record_flags`` bits: a conversation truncated to ``seq_len``; a text document split into
#: chunks; a text document (else a conversation).
TRUNCATED, SPLIT, TEXT = 1, 2, 4
#: A task starts a new shard once this many tokens are buffered (bounds a task's memory).
SHARD_TOKENS = 16 * 2**20


class StoreError(ValueError):
    """A store that cannot be used (no readable manifest, a missing or truncated file, another
    key or format); the message names the store and the file."""


def store_location(root: str, key: str) -> str:
    """``<root>/<key>``: a URI under an ``s3://`` root, else an absolute local path."""
    import os

    if "://" in root:
        return f"{root.rstrip('/')}/{key}"
    return os.path.join(os.path.abspath(os.path.expanduser(root)), key)


def _fs(location: str):
    from rayft.data.sources import arrow_fs

    return arrow_fs(location)


class _Hashing:
    """A write-only stream that hashes and counts what passes through it."""

    def __init__(self, out):
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def write(self, b) -> int:
        b = bytes(b) if not isinstance(b, (bytes, bytearray)) else b
        self.sha.update(b)
        self.size += len(b)
        self.out.write(b)
        return len(b)

    def flush(self) -> None:
        pass


def write_file(location: str, rel: str, write) -> dict[str, Any]:
    """Write ``<location>/<rel>`` atomically with ``write(stream)``; returns ``{"file": rel,
    "size": bytes, "sha256": hex}``, computed while writing. Local: a temporary name in the same
    directory, then a rename; S3: one object, which appears whole when its upload completes.

    Raises:
        OSError: the storage is not writable.
    """
    fs, base = _fs(location)
    path = f"{base.rstrip('/')}/{rel}"
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    local = "://" not in location
    target = f"{path}.tmp-{uuid.uuid4().hex[:12]}" if local else path
    try:
        with fs.open_output_stream(target, compression=None) as out:
            h = _Hashing(out)
            write(h)
        if local:
            fs.move(target, path)
    except BaseException:
        if local:
            try:
                fs.delete_file(target)
            except OSError:
                pass
        raise
    return {"file": rel, "size": h.size, "sha256": h.sha.hexdigest()}


def write_array(location: str, rel: str, arr: np.ndarray) -> dict[str, Any]:
    """:func:`write_file` of one ``.npy`` array."""
    return write_file(location, rel, lambda out: np.lib.format.write_array(out, np.ascontiguousarray(arr), allow_pickle=False))


def read_bytes(location: str, rel: str) -> bytes:
    """The whole file ``<location>/<rel>``. Raises OSError."""
    fs, base = _fs(location)
    with fs.open_input_stream(f"{base.rstrip('/')}/{rel}", compression=None) as f:
        return f.read()


def read_array(location: str, rel: str, dtype, length: int | None = None) -> np.ndarray:
    """The ``.npy`` array ``<location>/<rel>``, read whole, checked 1-d of ``dtype`` (and ``length``).

    Raises:
        StoreError: unreadable, another dtype or length.
    """
    try:
        if "://" in location:
            a = np.load(io.BytesIO(read_bytes(location, rel)), allow_pickle=False)
        else:
            import os

            a = np.load(os.path.join(location, rel), allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise StoreError(f"{location}/{rel}: unreadable ({e})") from None
    if a.dtype != dtype or a.ndim != 1 or (length is not None and len(a) != length):
        raise StoreError(f"{location}/{rel}: {a.ndim}-d {a.dtype} of {len(a)}, expected 1-d {np.dtype(dtype)} of {length}")
    return a


class ShardWriter:
    """Accumulates one task's examples and writes them as shards ``<part>/<task>-<k>``.

    :meth:`add` takes one accepted record's pieces; :meth:`flush` writes the buffered shard (at
    the end of the task, and by :meth:`add` once :data:`SHARD_TOKENS` tokens are buffered).
    ``shards``: the manifest entries of the shards written.
    """

    def __init__(self, location: str, part: str, task: int):
        self.location, self.part, self.task = location, part, task
        self.shards: list[dict[str, Any]] = []
        self._reset()

    def _reset(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.trainable: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.example_record: list[int] = []
        self.example_trainable: list[int] = []
        self.flags: list[int] = []
        self.dropped: list[int] = []
        self.n_tokens = 0

    def add(self, pieces: list[tuple[np.ndarray, np.ndarray]], flags: int, dropped: int) -> None:
        r = len(self.flags)
        for tok, train in pieces:
            self.tokens.append(tok)
            self.trainable.append(train)
            self.lengths.append(len(tok))
            self.example_record.append(r)
            self.example_trainable.append(int(np.count_nonzero(train)))
            self.n_tokens += len(tok)
        self.flags.append(flags)
        self.dropped.append(dropped)
        if self.n_tokens >= SHARD_TOKENS:
            self.flush()

    def flush(self) -> None:
        if not self.flags:
            return
        name = f"{self.task:06d}-{len(self.shards):03d}"
        offsets = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        arrays = {
            "tokens": np.concatenate(self.tokens).astype(np.int32, copy=False) if self.tokens else np.zeros(0, np.int32),
            "trainable": np.concatenate(self.trainable).astype(np.bool_, copy=False) if self.trainable else np.zeros(0, np.bool_),
            "offsets": offsets,
            "example_record": np.asarray(self.example_record, dtype=np.int32),
            "example_trainable": np.asarray(self.example_trainable, dtype=np.int32),
            "record_flags": np.asarray(self.flags, dtype=np.uint8),
            "record_dropped": np.asarray(self.dropped, dtype=np.int32),
        }
        files = {k: write_array(self.location, f"{self.part}/{name}.{k}.npy", arrays[k]) for k, _ in SHARD_ARRAYS}
        self.shards.append(
            {"name": name, "records": len(self.flags), "examples": len(self.lengths), "tokens": int(offsets[-1]), "files": files}
        )
        self._reset()


def store_digest(parts: dict[str, dict[str, Any]]) -> str:
    """sha256 over every shard file's digest, parts in name order, shards and arrays in order."""
    h = hashlib.sha256()
    for part in sorted(parts):
        for shard in parts[part]["shards"]:
            for k, _ in SHARD_ARRAYS:
                h.update(bytes.fromhex(shard["files"][k]["sha256"]))
    return h.hexdigest()


def write_manifest(location: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` (atomically, last: it makes the store usable). Raises OSError."""
    blob = json.dumps(manifest, indent=1, ensure_ascii=False).encode()
    write_file(location, MANIFEST, lambda out: out.write(blob))


def remove_manifest(location: str) -> None:
    """Delete a store's manifest (a store found broken is rebuilt); no error if absent."""
    fs, base = _fs(location)
    try:
        fs.delete_file(f"{base.rstrip('/')}/{MANIFEST}")
    except (OSError, FileNotFoundError):
        pass


@dataclass
class PartIndex:
    """The driver's index of one part of a store, read from its shards' small arrays.

    ``shards``: the manifest's shard entries; ``shard_examples`` int64 [S+1] (cumulative example
    counts: shard *k* holds the part's examples ``[shard_examples[k], shard_examples[k+1])``);
    ``lengths`` int32 [E] (tokens per example); ``record`` int64 [E] (the part's record each example
    came from: accepted records numbered in input order from 0); ``trainable`` int32 [E];
    ``flags`` uint8 [R]; ``dropped`` int32 [R].
    """

    shards: list[dict[str, Any]]
    shard_examples: np.ndarray
    lengths: np.ndarray
    record: np.ndarray
    trainable: np.ndarray
    flags: np.ndarray
    dropped: np.ndarray

    @property
    def records(self) -> int:
        return len(self.flags)

    @staticmethod
    def read(location: str, shards: list[dict[str, Any]]) -> PartIndex:
        """Read the index arrays of ``shards`` (never the tokens). Raises StoreError."""
        lengths, record, trainable, flags, dropped = [], [], [], [], []
        base = 0
        for s in shards:
            f = s["files"]
            off = read_array(location, f["offsets"]["file"], np.int64, s["examples"] + 1)
            lengths.append(np.diff(off).astype(np.int32))
            record.append(read_array(location, f["example_record"]["file"], np.int32, s["examples"]).astype(np.int64) + base)
            trainable.append(read_array(location, f["example_trainable"]["file"], np.int32, s["examples"]))
            flags.append(read_array(location, f["record_flags"]["file"], np.uint8, s["records"]))
            dropped.append(read_array(location, f["record_dropped"]["file"], np.int32, s["records"]))
            base += s["records"]
        cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt)  # noqa: E731
        counts = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([s["examples"] for s in shards], out=counts[1:])
        return PartIndex(
            shards,
            counts,
            cat(lengths, np.int32),
            cat(record, np.int64),
            cat(trainable, np.int32),
            cat(flags, np.uint8),
            cat(dropped, np.int32),
        )


@dataclass
class Store:
    """An opened (or just written) store: where it is, its key, its manifest and each part's index."""

    location: str
    key: str
    manifest: dict[str, Any]
    parts: dict[str, PartIndex] = field(default_factory=dict)


def check_manifest(location: str, key: str, manifest: Any) -> None:
    """The manifest's format, version and key, and every file it lists present with its size
    (one listing of the store directory, nothing read).

    Raises:
        StoreError: naming the first problem.
    """
    import pyarrow.fs as pafs

    if not isinstance(manifest, dict) or manifest.get("format") != STORE_FORMAT or manifest.get("version") != STORE_VERSION:
        raise StoreError(f"{location}/{MANIFEST}: not a rayft token store manifest of version {STORE_VERSION}")
    if manifest.get("key") != key:
        raise StoreError(f"{location}/{MANIFEST}: key {str(manifest.get('key'))[:16]}… is not the store's {key[:16]}…")
    fs, base = _fs(location)
    base = base.rstrip("/")
    try:
        listed = {i.path: i.size for i in fs.get_file_info(pafs.FileSelector(base, recursive=True)) if i.type == pafs.FileType.File}
    except OSError as e:
        raise StoreError(f"{location}: cannot list ({e})") from None
    try:
        for part, meta in manifest["parts"].items():
            for shard in meta["shards"]:
                for k, _ in SHARD_ARRAYS:
                    f = shard["files"][k]
                    size = listed.get(f"{base}/{f['file']}")
                    if size is None:
                        raise StoreError(f"{location}/{f['file']}: missing (the manifest lists it)")
                    if size != f["size"]:
                        raise StoreError(f"{location}/{f['file']}: {size} bytes, the manifest says {f['size']} (truncated or rewritten)")
        if manifest.get("digest") != store_digest(manifest["parts"]):
            raise StoreError(f"{location}/{MANIFEST}: the store digest does not match its shard digests")
    except (KeyError, TypeError) as e:
        raise StoreError(f"{location}/{MANIFEST}: malformed ({type(e).__name__}: {e})") from None


def open_store(location: str, key: str) -> Store | None:
    """The store at ``location`` (``store_location(root, key)``) with its parts' indexes, or None
    when it has no manifest (never built, or a build that did not finish).

    Raises:
        StoreError: a manifest that cannot be read or parsed, or a store that fails
            :func:`check_manifest`, or an index array that cannot be read.
    """
    try:
        raw = read_bytes(location, MANIFEST)
    except FileNotFoundError:
        return None
    except OSError as e:
        if "not exist" in str(e) or "not found" in str(e).lower():
            return None
        raise StoreError(f"{location}/{MANIFEST}: unreadable ({e})") from None
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise StoreError(f"{location}/{MANIFEST}: unreadable ({e})") from None
    check_manifest(location, key, manifest)
    parts = {part: PartIndex.read(location, meta["shards"]) for part, meta in manifest["parts"].items()}
    return Store(location, key, manifest, parts)

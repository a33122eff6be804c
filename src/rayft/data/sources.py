"""Where records come from: data files named by paths, globs, directories, ``s3://`` URIs,
Hugging Face ``datasets`` directories and Hub ids (:func:`expand_files`), what kind each file is by
its name (:func:`file_kind`), reading one file's bytes, decompressed (:func:`read_bytes`), and
pyarrow filesystems for every file I/O (:func:`arrow_fs`, :func:`open_input` for ranged reads).
The supported kinds are listed in :mod:`rayft.data.formats`."""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rayft.data.examples import DataError

DATA_SUFFIXES = (".json", ".jsonl")
GZIP_SUFFIX = ".gz"
ZSTD_SUFFIX = ".zst"
COMPRESSED_SUFFIXES = (GZIP_SUFFIX, ZSTD_SUFFIX)
PARQUET_SUFFIX = ".parquet"
UNSUPPORTED_SUFFIXES = (".zstd", ".bz2", ".xz", ".arrow", ".csv", ".tsv", ".tar", ".zip")
SUPPORTED_NOTE = ".json, .jsonl, .json.gz, .jsonl.gz, .json.zst, .jsonl.zst, .parquet"


@dataclass(frozen=True)
class S3Object:
    """An object in S3 (``str()`` is its ``s3://bucket/key`` URI). Listed with boto3
    (:func:`expand_files`), read through pyarrow's S3 filesystem (:func:`arrow_fs`); both find
    credentials, region and endpoint (``AWS_ENDPOINT_URL``) the usual way."""

    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    def read_bytes(self) -> bytes:
        """The object's bytes. Raises DataError (access denied, no such key...)."""
        try:
            fs, path = arrow_fs(str(self))
            with fs.open_input_stream(path, compression=None) as f:
                return f.read()
        except OSError as e:
            raise DataError(f"{self}: cannot read: {e}") from None


@dataclass(frozen=True)
class ArrowFile:
    """An Arrow IPC stream file of a Hugging Face ``datasets`` dataset: a ``data-*.arrow`` file of a
    ``save_to_disk`` directory, or of the ``datasets`` cache for a Hub dataset id. ``label`` names
    it in messages (rows: ``label:row N``); ``reader`` tells :mod:`rayft.data.readers` how to read it."""

    path: Path
    label: str
    reader = "arrow"

    def __str__(self) -> str:
        return self.label

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()


DataFile = Path | S3Object | ArrowFile

#: a Hugging Face Hub dataset id (``org/name``): read through the ``datasets`` library
HUB_PREFIX = "hf://datasets/"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def arrow_fs(where: str | Path):
    """``(pyarrow filesystem, path in it)`` for a local path (made absolute) or an ``s3://`` URI
    (:meth:`pyarrow.fs.FileSystem.from_uri`: credentials, region and ``AWS_ENDPOINT_URL`` from the
    environment, as the AWS SDK finds them)."""
    import pyarrow.fs as pafs

    where = os.fspath(where) if isinstance(where, ArrowFile) else str(where)
    if where.startswith("s3://"):
        return pafs.FileSystem.from_uri(where)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(where))


def open_input(path: DataFile):
    """A random-access pyarrow file of ``path`` (ranged reads: ``read_at(nbytes, offset)``).

    Raises:
        DataError: it cannot be opened (``path: cannot read: ...``).
    """
    try:
        fs, p = arrow_fs(path)
        return fs.open_input_file(p)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


def file_size(path: DataFile) -> int:
    """The size of ``path`` in bytes. Raises DataError."""
    if isinstance(path, Path):
        try:
            return path.stat().st_size
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    fs, p = arrow_fs(path)
    try:
        return fs.get_file_info(p).size
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e}") from None


def s3_client(uri: str):
    """A boto3 S3 client (credentials and region from the environment, as boto3 finds them).

    Raises:
        DataError: boto3 is not installed (naming ``uri``).
    """
    try:
        import boto3
    except ImportError:
        raise DataError(f"{uri}: reading s3:// URIs needs boto3 (pip install 'rayft[aws]')") from None
    return boto3.client("s3")


def file_kind(name: str) -> Literal["json", "compressed", "parquet", "unsupported", "other"]:
    """How a file is read, by the suffixes of its name (case-insensitive); ``other`` = not a data-file
    suffix; ``compressed``: gzip/zstd-compressed JSON or JSON Lines."""
    p = Path(name.lower())
    suf = p.suffix
    if suf in DATA_SUFFIXES:
        return "json"
    if suf == PARQUET_SUFFIX:
        return "parquet"
    if suf in COMPRESSED_SUFFIXES:
        inner = Path(p.stem).suffix
        if inner in DATA_SUFFIXES:
            return "compressed"
        return "unsupported" if inner in UNSUPPORTED_SUFFIXES or inner == PARQUET_SUFFIX else "other"
    return "unsupported" if suf in UNSUPPORTED_SUFFIXES else "other"


def _key_note(key: str | None) -> str:
    """`` (data.train_files)``: the config key a message is about (none for ``None``)."""
    return f" ({key})" if key else ""


def _data_files_of(where: str, files: list, key: str | None = "data.train_files") -> list:
    """The data files among a directory's (or S3 prefix's) ``files`` (sorted, each with ``.name``).
    Raises DataError when some are of an unsupported kind, or none is a data file."""
    kinds = {str(p): file_kind(p.name) for p in files}
    bad = [
        p.name
        for p in files
        if kinds[str(p)] == "unsupported" or (kinds[str(p)] == "other" and p.name.lower().endswith(COMPRESSED_SUFFIXES))
    ]
    if bad:
        raise DataError(
            f"{where}: holds {bad[:3]}: these files are not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
        )
    found = [p for p in files if kinds[str(p)] in ("json", "compressed", "parquet")]
    if not found:
        raise DataError(f"{where}: directory has no data file ({SUPPORTED_NOTE}){_key_note(key)}")
    return found


def _expand_s3(uri: str, key_name: str | None = "data.train_files") -> list[S3Object]:
    """``s3://bucket/key``: that object if it exists, else the data files directly under the prefix
    ``key/`` (like a directory; sub-"folders" are not read)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise DataError(f"{uri}: no bucket named (expected s3://bucket/prefix)")
    if glob.has_magic(key):
        raise DataError(f"{uri}: globs are not supported in s3:// URIs; name an object or a prefix")
    client = s3_client(uri)
    try:
        if key and not key.endswith("/"):
            try:
                client.head_object(Bucket=bucket, Key=key)
                obj = S3Object(bucket, key)
                if file_kind(obj.name) == "unsupported":
                    raise DataError(
                        f"{uri}: this kind of file is not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
                    )
                return [obj]
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                    raise
        prefix = key if not key or key.endswith("/") else key + "/"
        keys = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            keys += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    except (BotoCoreError, ClientError) as e:
        raise DataError(f"{uri}: cannot list: {e}") from None
    if not keys:
        raise DataError(f"{uri}: no such object, and no object under {f's3://{bucket}/{prefix}'}{_key_note(key_name)}")
    return _data_files_of(uri, [S3Object(bucket, k) for k in sorted(keys)], key_name)


def expand_files(patterns: list[str], key: str | None = "data.train_files") -> list[DataFile]:
    """Files named by paths, globs, directories and ``s3://bucket/key`` URIs, in sorted order, each
    once. A directory contributes its ``*.json``, ``*.jsonl``, ``*.json.gz``, ``*.jsonl.gz``,
    ``*.json.zst``, ``*.jsonl.zst`` and ``*.parquet`` files (any case); a file named explicitly is
    read as JSON/JSONL unless its suffix says otherwise (``x.gz`` / ``x.zst``: compressed JSON/JSONL).
    An ``s3://`` URI names one object, or else a prefix read like a directory (:class:`S3Object`).
    ``key``: the config key the patterns come from, named in messages (``None``: none, as for
    ``rayft data check``'s arguments).

    Raises:
        DataError: a pattern that matches nothing, a URI other than ``s3://`` or an s3 glob, a
            bz2/xz/Arrow/CSV/tar/zip file (not supported yet), a directory holding such files or no
            data file, a file listed twice, or an S3 error (no credentials, no such bucket, ...).
    """
    out: list[DataFile] = []
    for pat in patterns:
        if pat.startswith("s3://"):
            found = _expand_s3(pat, key)
        elif pat.startswith(HUB_PREFIX):
            found = hub_dataset_files(pat[len(HUB_PREFIX) :].strip("/"), pat)
        elif "://" in pat:
            raise DataError(f"{pat}: only s3:// URIs are supported by this reader; copy the file locally or to S3")
        elif os.path.isdir(pat) and is_hf_dataset_dir(Path(pat)):
            found = hf_dataset_dir_files(Path(pat))
        elif os.path.isdir(pat):
            found = _data_files_of(pat, sorted(p for p in Path(pat).iterdir() if p.is_file()), key)
        elif is_hub_dataset(pat):
            found = hub_dataset_files(pat, pat)
        else:
            found = sorted(Path(p) for p in glob.glob(pat)) if glob.has_magic(pat) and not os.path.exists(pat) else [Path(pat)]
            found = [p for p in found if p.is_file()]
            if not found:
                raise DataError(f"{pat or repr(pat)}: no such data file{_key_note(key)}")
            for p in found:
                if file_kind(p.name) == "unsupported":
                    raise DataError(
                        f"{p}: this kind of file is not supported yet (supported: {SUPPORTED_NOTE}; decompress or convert to JSONL)"
                    )
        out.extend(found)
    seen: set = set()
    for p in out:
        ident = p.resolve() if isinstance(p, Path) else p.path.resolve() if isinstance(p, ArrowFile) else str(p)
        if ident in seen:
            raise DataError(f"{p}: listed more than once{' in ' + key if key else ''} (its records would be trained twice)")
        seen.add(ident)
    return out


def is_hf_dataset_dir(d: Path) -> bool:
    """A directory written by ``datasets``' ``save_to_disk`` (``state.json`` + ``dataset_info.json``,
    or ``dataset_dict.json`` for a DatasetDict)."""
    return ((d / "state.json").is_file() and (d / "dataset_info.json").is_file()) or (d / "dataset_dict.json").is_file()


def hf_dataset_dir_files(d: Path) -> list[ArrowFile]:
    """The ``data-*.arrow`` files of a ``save_to_disk`` directory, in ``state.json``'s order.

    Raises:
        DataError: a DatasetDict directory (name one split's directory), or an unreadable state.json.
    """
    if (d / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in d.iterdir() if p.is_dir())
        raise DataError(
            f"{d}: a Hugging Face DatasetDict directory; name one split's directory, e.g. {d / (splits[0] if splits else 'train')}"
        )
    try:
        state = json.loads((d / "state.json").read_text())
        names = [f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{d}/state.json: not a readable Hugging Face datasets state file ({e})") from None
    return [ArrowFile(d / n, str(d / n)) for n in names]


def is_hub_dataset(pattern: str) -> bool:
    """Whether ``pattern`` names a Hugging Face Hub dataset: ``hf://datasets/<id>``, or an
    ``org/name`` id that is no local path, glob or data-file name."""
    if pattern.startswith(HUB_PREFIX):
        return True
    return (
        not os.path.exists(pattern) and not glob.has_magic(pattern) and bool(_HUB_ID.fullmatch(pattern)) and file_kind(pattern) == "other"
    )


def hub_dataset_files(dataset_id: str, pat: str) -> list[ArrowFile]:
    """The Arrow files of Hugging Face Hub dataset ``dataset_id``'s ``train`` split, loaded (or found
    in the cache) by ``datasets.load_dataset``; rows are reported as ``hf://datasets/<id>/<file>:row N``.

    Raises:
        DataError: ``datasets`` is not installed, or the dataset cannot be loaded (offline, no such
            dataset), naming the id and what to do.
    """
    how = (
        f"where the network reaches the Hub, run datasets.load_dataset({dataset_id!r}, split='train').save_to_disk(DIR) "
        "and give DIR in data.train_files"
    )
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"{pat}: no such data file or directory; as a Hugging Face Hub dataset id it needs the datasets package "
            f"(pip install datasets), or {how}"
        ) from None
    try:
        ds = datasets.load_dataset(dataset_id, split="train")
    except Exception as e:  # offline, no such dataset, no train split, gated...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"{pat}: cannot load the Hugging Face Hub dataset {dataset_id!r} ({type(e).__name__}: {first}); {how}") from None
    files = [Path(f["filename"]) for f in ds.cache_files]
    if not files:
        raise DataError(f"{pat}: the Hugging Face dataset {dataset_id!r} has no Arrow file in the cache (held in memory); {how}")
    return [ArrowFile(f, f"{HUB_PREFIX}{dataset_id}/{f.name}") for f in files]


def _unzstd(raw: bytes, path: DataFile) -> bytes:
    """zstd-decompressed ``raw`` (every frame, in order). Raises DataError."""
    try:
        import zstandard
    except ImportError:
        raise DataError(f"{path}: reading .zst files needs the zstandard package (pip install zstandard)") from None
    out, dctx = [], zstandard.ZstdDecompressor()
    try:
        while raw:
            d = dctx.decompressobj()
            out.append(d.decompress(raw))
            if not d.eof:
                raise DataError(f"{path}: the zstd stream ends early (truncated file?)")
            raw = d.unused_data
    except zstandard.ZstdError as e:
        raise DataError(f"{path}: not valid zstd data ({e})") from None
    return b"".join(out)


def read_bytes(path: DataFile) -> bytes:
    """The file's bytes, decompressed for ``*.gz`` and ``*.zst``. Raises DataError (kind ``file``)."""
    try:
        raw = path.read_bytes()
        suffix = Path(path.name).suffix.lower()
        if suffix == ZSTD_SUFFIX:
            return _unzstd(raw, path)
        if suffix == GZIP_SUFFIX:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                return f.read()
        return raw
    except gzip.BadGzipFile as e:
        raise DataError(f"{path}: not a valid gzip file: {e}") from None
    except EOFError:
        raise DataError(f"{path}: the gzip stream ends early (truncated file?)") from None
    except zlib.error as e:
        raise DataError(f"{path}: corrupt gzip data ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None

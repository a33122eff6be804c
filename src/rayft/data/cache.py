"""A content-addressed cache of tokenized datasets (``data.cache_dir``).

The key is a sha256 over everything that decides the tokens (:func:`cache_key`):

* every input file, in the order it is read: a local file by the sha256 of its bytes (whatever its
  size: hashing runs at disk speed, far faster than parsing); an ``s3://`` object by its URI, size
  and ETag (from ``HeadObject``; reading it whole to hash it would cost as much as loading it);
* the tokenizer: its name, a sha256 of ``backend_tokenizer.to_str()`` (vocabulary, merges,
  normalizer, pre-tokenizer, added tokens) — or of the vocabulary for a slow tokenizer —, its chat
  template, its EOS id, and the ``tokenizers``/``transformers`` versions;
* the settings that change tokenization: ``data.format``, ``data.columns``, ``data.placeholders``, ``data.seq_len``,
  ``data.max_examples``, ``data.on_bad_record``, the validation split (``data.validation_files``
  hashed like the training files, or ``data.validation_fraction`` with ``data.seed``), and
  :data:`TOKENIZE_VERSION` (bumped when rayft's tokenization changes).

An entry is a directory ``<cache_dir>/<key>/`` holding ``<part>.tokens.npy`` (int32),
``<part>.trainable.npy`` (bool), ``<part>.offsets.npy`` (int64) for each part (``train``,
``validation``) and ``manifest.json`` (key, counts, per-part fingerprints, the driver's report
lines). It is written to a temporary directory and renamed into place, so a reader never sees half
an entry. On load the manifest's key, the arrays' dtypes and lengths and each part's fingerprint
(sha256 of its arrays) are checked; an entry that fails is reported and ignored (then replaced).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rayft.data.tokenize import TokenizedDataset, fingerprint

#: Bump when tokenize.py changes what tokens or masks an example gets: old entries then miss.
#: 2: the readers honour per-turn weights and ignore unread message keys (records an older rayft
#: refused, or skipped under on_bad_record: skip, are now read).
TOKENIZE_VERSION = 2
_ARRAYS = (("tokens", np.int32), ("trainable", np.bool_), ("offsets", np.int64))
_COUNTS = ("dropped_no_trainable", "truncated", "split_documents")


class CacheError(ValueError):
    """A cache entry that cannot be used (corrupt, truncated, another key); the message says why."""


def file_identity(path) -> dict[str, Any]:
    """What the key records of one input file (a ``Path`` or an ``S3Object``):
    ``{"path", "sha256"}`` of a local file (its absolute path: the cached report lines name it,
    so a copy elsewhere is a miss), ``{"uri", "size", "etag"}`` of an S3 object.

    Raises:
        OSError: an unreadable local file. DataError: an S3 error.
    """
    from rayft.data.examples import DataError
    from rayft.data.sources import S3Object, s3_client

    if isinstance(path, S3Object):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = s3_client(str(path)).head_object(Bucket=path.bucket, Key=path.key)
        except (BotoCoreError, ClientError) as e:
            raise DataError(f"{path}: cannot read: {e}") from None
        return {"uri": str(path), "size": head["ContentLength"], "etag": head.get("ETag")}
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return {"path": str(Path(path).resolve()), "sha256": h.hexdigest()}


def input_stamps(data_cfg) -> list[Any]:
    """A cheap snapshot of ``data_cfg``'s input files, to tell whether one changed while it was
    read without hashing it again: ``(path, size, mtime_ns)`` of a local file, the
    :func:`file_identity` (one HEAD request) of an S3 object.

    Raises:
        OSError: a local file that vanished. DataError: an S3 error.
    """
    from rayft.data.sources import S3Object, expand_files

    out: list[Any] = []
    for p in expand_files(data_cfg.train_files) + (expand_files(data_cfg.validation_files) if data_cfg.validation_files else []):
        if isinstance(p, S3Object):
            out.append(file_identity(p))
        else:
            st = os.stat(p)
            out.append((str(p), st.st_size, st.st_mtime_ns))
    return out


def tokenizer_identity(tokenizer, name: str) -> dict[str, Any]:
    """The tokenizer's part of the key: name, sha256 of its full definition, chat template, EOS id."""
    import tokenizers
    import transformers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "name": name,
        "definition_sha256": hashlib.sha256(spec.encode()).hexdigest(),
        "chat_template": tokenizer.chat_template,
        "eos_token_id": tokenizer.eos_token_id,
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
    }


def cache_key(data_cfg, tokenizer, tokenizer_name: str) -> tuple[str, dict[str, Any]]:
    """``(key, what was hashed)`` for ``data_cfg`` (a :class:`rayft.config.DataConfig`).

    Raises:
        DataError: an input file that does not exist (from :func:`rayft.data.sources.expand_files`)
            or cannot be read.
    """
    from rayft.data.sources import expand_files

    val = None
    if data_cfg.validation_files:
        val = [file_identity(p) for p in expand_files(data_cfg.validation_files)]
    parts = {
        "tokenize_version": TOKENIZE_VERSION,
        "train_files": [file_identity(p) for p in expand_files(data_cfg.train_files)],
        "validation_files": val,
        "validation_fraction": data_cfg.validation_fraction,
        "split_seed": data_cfg.seed if data_cfg.validation_fraction else None,
        "tokenizer": tokenizer_identity(tokenizer, tokenizer_name),
        "format": data_cfg.format,
        "columns": data_cfg.columns.mapping(),
        "placeholders": data_cfg.placeholders,
        "seq_len": data_cfg.seq_len,
        "max_examples": data_cfg.max_examples,
        "on_bad_record": data_cfg.on_bad_record,
    }
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest(), parts


@dataclass
class CachedData:
    """A cache entry: ``parts`` (``{"train": ds, "validation": ds}``, validation optional) and
    ``info`` (free-form JSON the driver stored with it: its report lines and counts)."""

    parts: dict[str, TokenizedDataset]
    info: dict[str, Any] = field(default_factory=dict)


def entry_dir(cache_dir: str | os.PathLike, key: str) -> Path:
    return Path(os.path.expanduser(str(cache_dir))) / key


def load(cache_dir: str | os.PathLike, key: str) -> CachedData | None:
    """The entry for ``key``, or None when there is none.

    Raises:
        CacheError: an entry exists but is unusable (unreadable manifest or array, another key,
            wrong dtype, inconsistent lengths, a fingerprint that does not match).
    """
    d = entry_dir(cache_dir, key)
    if not d.is_dir():
        return None
    try:
        manifest = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        raise CacheError(f"{d}: unreadable manifest.json ({e})") from None
    if manifest.get("key") != key:
        raise CacheError(f"{d}: manifest key {str(manifest.get('key'))[:16]}… is not the entry's {key[:16]}…")
    parts: dict[str, TokenizedDataset] = {}
    for part, meta in manifest.get("parts", {}).items():
        arrays = {}
        for name, dtype in _ARRAYS:
            f = d / f"{part}.{name}.npy"
            try:
                a = np.load(f, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise CacheError(f"{f}: unreadable ({e})") from None
            if a.dtype != dtype or a.ndim != 1:
                raise CacheError(f"{f}: dtype {a.dtype} / {a.ndim}-d, expected 1-d {np.dtype(dtype)}")
            arrays[name] = a
        tok, train, off = arrays["tokens"], arrays["trainable"], arrays["offsets"]
        if (
            len(off) != meta["examples"] + 1
            or len(tok) != meta["tokens"]
            or len(train) != len(tok)
            or off[0] != 0
            or off[-1] != len(tok)
            or np.any(np.diff(off) < 0)
        ):
            raise CacheError(f"{d}: {part}: array lengths are inconsistent with each other or with the manifest")
        ds = TokenizedDataset(tok, train, off, **{k: int(meta[k]) for k in _COUNTS})
        if fingerprint(ds) != meta["fingerprint"]:
            raise CacheError(f"{d}: {part}: content fingerprint {fingerprint(ds)} does not match the manifest's {meta['fingerprint']}")
        parts[part] = ds
    if "train" not in parts:
        raise CacheError(f"{d}: no train part in manifest.json")
    return CachedData(parts, manifest.get("info", {}))


def save(cache_dir: str | os.PathLike, key: str, data: CachedData, key_parts: dict[str, Any] | None = None) -> Path:
    """Write the entry atomically (temporary directory, then rename) and return its directory.

    An existing entry for ``key`` is kept when it loads (another process wrote it meanwhile) and
    replaced when it is corrupt. Raises OSError when the cache directory is not writable.
    """
    root = Path(os.path.expanduser(str(cache_dir)))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=root))
    try:
        manifest: dict[str, Any] = {"key": key, "hashed": key_parts, "info": data.info, "parts": {}}
        for part, ds in data.parts.items():
            for name, dtype in _ARRAYS:
                np.save(tmp / f"{part}.{name}.npy", np.ascontiguousarray(getattr(ds, name), dtype=dtype), allow_pickle=False)
            manifest["parts"][part] = {
                "examples": len(ds),
                "tokens": len(ds.tokens),
                "fingerprint": fingerprint(ds),
                **{k: int(getattr(ds, k)) for k in _COUNTS},
            }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
        dest = root / key
        if dest.exists():
            try:
                load(root, key)
                shutil.rmtree(tmp, ignore_errors=True)  # another process wrote a good entry meanwhile: keep it
                return dest
            except CacheError:
                shutil.rmtree(dest, ignore_errors=True)  # corrupt: replace it
        try:
            os.rename(tmp, dest)
        except OSError:
            if not (dest / "manifest.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same entry first
        return dest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

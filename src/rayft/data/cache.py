"""The content key of a token store (:mod:`rayft.data.token_store`): a sha256 over everything that
decides the tokens (:func:`cache_key`):

* every input file, in the order it is read: a local file by the sha256 of its bytes (whatever its
  size: hashing runs at disk speed, far faster than parsing; a file whose size, mtime, ctime and
  inode are those it had when it was last hashed is not read again, see :class:`HashMemo`); an
  ``s3://`` object by its URI, size and ETag (from ``HeadObject``; reading it whole to hash it would
  cost as much as loading it);
* the tokenizer: its name, a sha256 of ``backend_tokenizer.to_str()`` (vocabulary, merges,
  normalizer, pre-tokenizer, added tokens) — or of the vocabulary for a slow tokenizer —, its chat
  template, its EOS id, and the ``tokenizers``/``transformers`` versions;
* the settings that change tokenization: ``data.format``, ``data.columns``, ``data.placeholders``, ``data.seq_len``,
  ``data.max_examples``, ``data.on_bad_record``, the validation split (``data.validation_files``
  hashed like the training files, or ``data.validation_fraction`` with ``data.seed``), and
  :data:`TOKENIZE_VERSION` (bumped when rayft's tokenization or the store's layout changes).

:func:`input_stamps` tells, cheaply, whether an input changed while it was read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

#: Bump when tokenize.py changes what tokens or masks an example gets, or the store's layout changes: old stores then miss.
#: 2: the readers honour per-turn weights and ignore unread message keys (records an older rayft refused, or skipped
#: under on_bad_record: skip, are now read); 3: the sharded token store (issue 18); 4: assistant spans found by a
#: sentinel render and the generation prompt (what a template puts between header and reply, e.g. Qwen3's think
#: block, is now trained; templates that are not prefix-stable are masked instead of refused; issue 22).
TOKENIZE_VERSION = 4


class HashMemo:
    """sha256 of local files remembered by their stat (size, mtime_ns, ctime_ns, inode), so that a
    restart on 10M records does not read GBs again only to find them unchanged (the rule git's index
    and DVC's state use). A file modified within :data:`RACY_S` seconds of its hashing is not
    remembered (a later write in the same timestamp tick would go unseen).

    Kept in ``$RAYFT_HASH_MEMO`` (default ``$XDG_CACHE_HOME/rayft/file-sha256.json``, else
    ``~/.cache/rayft/...``; ``RAYFT_HASH_MEMO=off`` turns it off); a missing or unreadable memo is an
    empty one, and one that cannot be written is not an error.
    """

    RACY_S = 2.0

    def __init__(self, path: str | None = None):
        path = path or os.environ.get("RAYFT_HASH_MEMO")
        if path is None:
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            path = os.path.join(base, "rayft", "file-sha256.json")
        self.path = None if path == "off" else path
        self.entries: dict[str, list] = {}
        self.changed = False
        if self.path:
            try:
                self.entries = json.loads(Path(self.path).read_text())
            except (OSError, ValueError):
                self.entries = {}

    @staticmethod
    def stamp(st: os.stat_result) -> list[int]:
        return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]

    def sha256(self, path: str) -> str:
        """The sha256 (hex) of the local file ``path``, from the memo when its stat is unchanged.

        Raises:
            OSError: an unreadable file.
        """
        key = str(Path(path).resolve())
        before = os.stat(key)
        hit = self.entries.get(key)
        if hit is not None and hit[:4] == self.stamp(before):
            return hit[4]
        h = hashlib.sha256()
        with open(key, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        after = os.stat(key)
        if self.path and self.stamp(after) == self.stamp(before) and time.time() - after.st_mtime_ns / 1e9 > self.RACY_S:
            self.entries[key] = [*self.stamp(after), h.hexdigest()]
            self.changed = True
        return h.hexdigest()

    def save(self) -> None:
        """Write the memo (atomically) if it changed; errors are ignored (it is only a shortcut)."""
        if not (self.path and self.changed):
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            Path(tmp).write_text(json.dumps(self.entries))
            os.replace(tmp, self.path)
            self.changed = False
        except OSError:
            pass


def file_identity(path, memo: HashMemo | None = None) -> dict[str, Any]:
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
    return {"path": str(Path(path).resolve()), "sha256": (memo or HashMemo("off")).sha256(path)}


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

    memo = HashMemo()
    val = None
    if data_cfg.validation_files:
        val = [file_identity(p, memo) for p in expand_files(data_cfg.validation_files)]
    train = [file_identity(p, memo) for p in expand_files(data_cfg.train_files)]
    memo.save()
    parts = {
        "tokenize_version": TOKENIZE_VERSION,
        "train_files": train,
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

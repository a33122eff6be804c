"""A run's data, ready to train on: read, validate and tokenize into a token store (or open the
store an earlier run or ``rayft data prepare`` wrote), then select the examples to train on.

The inputs are ingested by tasks (:mod:`rayft.data.ingest`: in this process, or with Ray Data over
every CPU of the cluster) into a sharded token store (:mod:`rayft.data.token_store`) under the
content key of the inputs, the tokenizer and the settings (:func:`rayft.data.cache.cache_key`).
The driver holds only the tasks' summaries and the store's small index arrays; the workers read
their examples from the store (:class:`rayft.data.token_view.StoreView`).

``data.max_examples`` (the first N accepted records) and ``data.validation_fraction`` (the records
:func:`held_out` picks) are selections of the store's examples by record, applied after ingest, so
the examples, their order and every count of the report lines are those of reading the records in
memory and tokenizing them in order. Errors are the data layer's own
:class:`~rayft.data.examples.DataError`.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np
from rich.console import Console
from rich.text import Text

from rayft.config import RayftConfig
from rayft.data.examples import DataError


@dataclass
class PreparedData:
    """The driver's data: ``train`` and ``validation`` (None without a validation set) — each a
    :class:`~rayft.data.token_view.StoreView` (``data.synthetic``: an in-memory
    :class:`~rayft.data.tokenize.TokenizedDataset`) —, the tokenizer and its name, whether the
    store was opened (``cache``: ``"hit"``), built (``"miss"``) or built and not kept because an
    input changed while it was read (``"off"``), where it is (``store``), the training
    selection's ``fingerprint`` (the resume check) and the store's ``skipped_records.jsonl``
    (``skipped_file``, None when no record was skipped)."""

    tokenizer: Any
    tokenizer_name: str
    train: Any
    validation: Any = None
    cache: str = "off"
    store: str | None = None
    fingerprint: str = ""
    skipped_file: str | None = None


class Progress(Protocol):
    """What ingest reports to (``rayft data prepare``'s progress bar): the total input bytes once,
    then increments of bytes, records and tokens."""

    def start(self, total_bytes: int) -> None: ...

    def advance(self, nbytes: int, records: int, tokens: int) -> None: ...


def open_tokenizer(name: str, revision: str | None = None, trust_remote_code: bool = False):
    """The tokenizer ``name`` (:func:`rayft.data.tokenizer.load_tokenizer`).

    Raises:
        DataError: it cannot be loaded (hub unreachable, no such repository or directory).
    """
    from rayft.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(name, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"tokenizer {name!r} (model.tokenizer / model.name_or_path) cannot be loaded: {first}. Give a local directory, "
            "make the hub reachable (or pre-fill the Hugging Face cache), or use a preset such as qwen2.5-1.5b"
        ) from None


def store_root(data_cfg, run_dir: str | None) -> str:
    """Where stores live: ``data.cache_dir``; with ``null``, the run directory's ``tokenized/``
    (every node reads it as it reads checkpoints), or a temporary directory removed at exit when
    there is no run directory (a library call)."""
    if data_cfg.cache_dir:
        return data_cfg.cache_dir if "://" in data_cfg.cache_dir else os.path.expanduser(data_cfg.cache_dir)
    if run_dir:
        return f"{run_dir.rstrip('/')}/tokenized"
    import atexit
    import shutil
    import tempfile

    tmp = tempfile.mkdtemp(prefix="rayft-tokenized-")
    atexit.register(shutil.rmtree, tmp, True)
    return tmp


def prepare_data(
    cfg: RayftConfig,
    console: Console,
    tokenizer,
    tokenizer_name: str,
    *,
    vocab_size: int | None = None,
    connect: Callable[[], Any] | None = None,
    run_dir: str | None = None,
    locate: Callable[[str], str] | None = None,
    progress: Progress | None = None,
    before_ingest: Callable[[bool], None] | None = None,
) -> PreparedData:
    """The run's data: the token store for these inputs, tokenizer and settings, opened or built,
    and the selected examples' views.

    A store found under :func:`store_root` is used as it is: the report lines of the build that
    wrote it are printed again, then ``data: used the tokenized store ... (no file read or
    tokenized)``. A broken one (missing or truncated shard, unreadable manifest) is reported as a
    warning and rebuilt. Otherwise the inputs are ingested (notes, then with ``data.on_bad_record:
    skip`` the skipped records per reason category with the first ``file:line`` of each; every
    location goes to the store's ``skipped_records.jsonl``), the report lines printed, and the
    manifest written last, unless an input changed while it was read.

    Args:
        tokenizer: the loaded tokenizer (:func:`open_tokenizer`), named ``tokenizer_name``.
        vocab_size: the model's vocabulary size; needed by ``data.synthetic`` only.
        connect: reaches Ray before ingesting there (``data.preprocess``,
            :func:`rayft.data.ingest.use_ray`); without it the Ray already initialised in this
            process is used.
        run_dir: the run directory (the store's root when ``data.cache_dir`` is null).
        locate: ``root → root`` where the store must go (the driver's check that every Ray node
            can read it), called after the input files are listed and before anything is read.
        progress: receives the ingest's progress (:class:`Progress`).
        before_ingest: called once on a store miss, when the inputs are listed and it is decided
            whether they are tokenized through Ray Data (its argument), before anything is read:
            the driver starts its workers there when they are not (a Ray Data ingest needs the
            CPUs their placement group would hold).

    Raises:
        DataError: a bad record (``file:line: reason``, policy ``error``), an unreadable file, or
            nothing left to train on (also when every record was skipped as bad), an empty
            validation set, or a ``data.validation_fraction`` that leaves no training record.
    """
    from rayft.data import cache as cache_lib
    from rayft.data import token_store as ts
    from rayft.data.sources import expand_files

    dc = cfg.data
    if dc.synthetic is not None:
        from rayft.data.synthetic import random_dataset
        from rayft.data.tokenize import fingerprint

        if vocab_size is None:
            raise DataError("data.synthetic needs the model's vocabulary size")
        ds = random_dataset(dc.synthetic.rows, dc.seq_len, vocab_size, dc.synthetic.seed)
        console.print(
            f"data: synthetic, {len(ds)} rows of {dc.seq_len} random token ids in [0, {vocab_size}) (seed {dc.synthetic.seed}), every token trainable",
            highlight=False,
            markup=False,
        )
        return PreparedData(tokenizer, tokenizer_name, ds, None, "off", fingerprint=fingerprint(ds))
    train_files = expand_files(dc.train_files)  # a missing file is reported before anything else
    val_files = expand_files(dc.validation_files) if dc.validation_files else None
    stamps = cache_lib.input_stamps(dc)  # before the key's hashing: a change after it is caught below
    key, key_parts = cache_lib.cache_key(dc, tokenizer, tokenizer_name)
    root = store_root(dc, run_dir)
    if locate is not None:
        root = locate(root)
    location = ts.store_location(root, key)

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False)

    try:
        store = ts.open_store(location, key)
    except ts.StoreError as e:
        console.print(Text.assemble(("warning", "yellow"), f": ignoring a broken tokenized store, rebuilding it: {e}"), highlight=False)
        ts.remove_manifest(location)
        store = None
    if store is not None:
        for line in store.manifest.get("lines", []):
            say(line)
        train, val = select(store, dc)
        say(f"data: used the tokenized store {location} (no file read or tokenized)")
        skipped = f"{location}/{ts.SKIPPED_FILE}" if store.manifest.get("skipped") else None
        return PreparedData(tokenizer, tokenizer_name, train, val, "hit", location, train.fingerprint, skipped)
    return build_store(
        cfg, console, tokenizer, tokenizer_name, location, key, key_parts, stamps, train_files, val_files, connect, progress, before_ingest
    )


def build_store(
    cfg, console, tokenizer, tokenizer_name, location, key, key_parts, stamps, train_files, val_files, connect, progress, before_ingest=None
) -> PreparedData:
    """Ingest the inputs into the store at ``location`` and open it (see :func:`prepare_data`)."""
    from rayft.data import cache as cache_lib
    from rayft.data import token_store as ts
    from rayft.data.ingest import Settings, ingest_part, use_ray
    from rayft.data.records import check_columns
    from rayft.data.sources import file_size

    dc = cfg.data
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        console.print(line, highlight=False, markup=False)

    files_all = train_files + (val_files or [])
    total = sum(_size_or_0(file_size, f) for f in files_all)
    ray_data = False
    if use_ray(dc.preprocess, total, None):
        import ray

        if connect is not None:
            connect()
        cpus = ray.cluster_resources().get("CPU", 0) if ray.is_initialized() else 0
        ray_data = use_ray(dc.preprocess, total, cpus)
    if before_ingest is not None:
        before_ingest(ray_data)
    if progress is not None:
        progress.start(total)
    settings = Settings(location, dc.seq_len, dc.format, check_columns(dc.columns.mapping()), dc.on_bad_record, dict(dc.placeholders or {}))
    advance = progress.advance if progress is not None else None

    def ingest(files, part: str, key_name: str):
        res = ingest_part(
            files, part, settings, tokenizer, use_ray_data=ray_data, limit=dc.max_examples if part == "train" else None, progress=advance
        )
        if res.error is not None:
            raise DataError(res.error["message"], kind=res.error["kind"])
        report = res.load_report()
        report.skipped, report.records = res.skipped(), res.records
        for line in [*(f"data: {n}" for n in res.notes()), *report.skip_summary(), *report.placeholder_summary()]:
            say(line)
        if ray_data:
            console.print(
                f"data: ingested {res.records:,} records ({_mib(sum(s['bytes'] for s in res.summaries))} in {len(res.summaries)} tasks) "
                f"with Ray Data on {res.cpus:g} CPUs in {res.seconds:.1f} s",
                highlight=False,
            )
        if res.accepted == 0:
            why = f"all {res.records} records were bad and skipped" if report.skipped else "no record"
            pats = dc.train_files if part == "train" else dc.validation_files
            raise DataError(f"empty dataset: {why} in {pats}" + ("" if key_name == "data.train_files" else f" ({key_name})"))
        return res

    train_res = ingest(train_files, "train", "data.train_files")
    n = min(train_res.accepted, dc.max_examples or train_res.accepted)
    if dc.validation_fraction:
        held_out(n, dc.validation_fraction, dc.seed)  # raises when nothing would be left to train on
    val_res = ingest(val_files, "validation", "data.validation_files") if val_files is not None and not dc.validation_fraction else None
    for res, limit in ((train_res, n), (val_res, None)):
        te = res.tokenize_error if res is not None else None
        if te is not None and (limit is None or te["record"] < limit):
            raise DataError(te["message"], kind=te["kind"])
    parts = {"train": {"shards": train_res.shards}}
    if val_res is not None:
        parts["validation"] = {"shards": val_res.shards}
    store = ts.Store(location, key, {"parts": parts})
    store.parts = {p: ts.PartIndex.read(location, meta["shards"]) for p, meta in parts.items()}
    train, val = select(store, dc, say)
    skipped = _write_skipped(location, [r for r in (train_res, val_res) if r is not None])
    if skipped:
        say(f"data: every skipped record's location and reason: {location}/{ts.SKIPPED_FILE}")
    kept = "miss"
    if cache_lib.input_stamps(dc) != stamps:
        console.print(
            Text.assemble(
                ("warning", "yellow"), ": an input file changed while it was read; the tokenized store is not kept for later runs"
            ),
            highlight=False,
        )
        kept = "off"
    else:
        manifest = {
            "format": ts.STORE_FORMAT,
            "version": ts.STORE_VERSION,
            "key": key,
            "hashed": key_parts,
            "parts": parts,
            "digest": ts.store_digest(parts),
            "files": {
                p: [{"file": str(f), "tasks": sum(s["file"] == str(f) for s in r.summaries)} for f in r.files]
                for p, r in (("train", train_res), ("validation", val_res))
                if r is not None
            },
            "notes": [n for r in (train_res, val_res) if r is not None for n in r.notes()],
            "skipped": skipped,
            "lines": lines,
            "ingest": {
                "mode": "ray" if ray_data else "local",
                "seconds": round(train_res.seconds + (val_res.seconds if val_res else 0), 3),
            },
        }
        try:
            ts.write_manifest(location, manifest)
            console.print(f"data: wrote the tokenized store {location}", highlight=False, markup=False)
        except OSError as e:
            console.print(
                Text.assemble(("warning", "yellow"), f": could not write the token store's manifest (data.cache_dir): {e}"), highlight=False
            )
            kept = "off"
    skipped_file = f"{location}/{ts.SKIPPED_FILE}" if skipped else None
    return PreparedData(tokenizer, tokenizer_name, train, val, kept, location, train.fingerprint, skipped_file)


def _size_or_0(size_of, f) -> int:
    try:
        return size_of(f)
    except DataError:
        return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _write_skipped(location: str, results) -> int:
    """Write every skipped record (``{"where", "kind", "reason"}`` per line, input order) to the
    store's ``skipped_records.jsonl``; returns how many (0: no file written)."""
    import json

    from rayft.data import token_store as ts

    rows = [row for r in results for row in r.skip_locations(location)]
    if not rows:
        return 0
    blob = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
    ts.write_file(location, ts.SKIPPED_FILE, lambda f: f.write(blob))
    return len(rows)


def held_out(n: int, fraction: float, seed: int) -> np.ndarray:
    """bool [n]: the records ``data.validation_fraction`` holds out of ``n``: ``max(1, round(fraction
    × n))`` chosen at random with ``np.random.default_rng([seed, 0x7661])`` (a stream of its own,
    not the shuffle's).

    Raises:
        DataError: nothing would be left to train on.
    """
    n_val = max(1, round(fraction * n))
    if n - n_val < 1:
        raise DataError(f"data.validation_fraction={fraction} of {n} record(s) leaves no training record")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng([seed, 0x7661]).permutation(n)[:n_val]] = True
    return held


def split_validation(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """``(train, validation)`` of an in-memory list, both in their original order (:func:`held_out`).

    Raises:
        DataError: fewer than 2 examples (nothing would be left to train on).
    """
    held = held_out(len(examples), fraction, seed)
    return [e for e, h in zip(examples, held) if not h], [e for e, h in zip(examples, held) if h]


def selection_fingerprint(key: str, part: str, ids: np.ndarray) -> str:
    """The resume check's fingerprint of a selection (16 hex digits): sha256 over the store's
    content key, the part and the selected example ids — the same inputs, tokenizer and settings
    give the same examples, so no token is read."""
    h = hashlib.sha256(f"{key}\0{part}\0".encode())
    h.update(np.ascontiguousarray(ids, dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def select(store, dc, say: Callable[[str], None] | None = None):
    """``(train view, validation view or None)`` of an opened store under ``dc``'s
    ``max_examples``, ``validation_fraction`` and ``validation_files``; with ``say``, the report
    lines are printed through it (:func:`report_line`).

    Raises:
        DataError: an empty training or validation selection (no example with a trainable
            target), or a fraction that leaves no training record.
    """
    from rayft.data.token_view import StoreView

    idx = store.parts["train"]
    n = min(idx.records, dc.max_examples or idx.records)
    in_n = idx.record < n
    if dc.validation_fraction:
        rec_in = np.zeros(idx.records, dtype=bool)
        rec_in[:n] = True
        rec_held = np.zeros(idx.records, dtype=bool)
        rec_held[:n] = held_out(n, dc.validation_fraction, dc.seed)
        ex_held = rec_held[idx.record]
        val_from = f"data.validation_fraction={dc.validation_fraction} of the training records, seed {dc.seed}"
        parts = [("train", idx, in_n & ~ex_held, rec_in & ~rec_held), ("train", idx, ex_held, rec_held)]
    else:
        rec = np.arange(idx.records) < n
        parts = [("train", idx, in_n, rec)]
        val_from = "data.validation_files"
        if "validation" in store.parts:
            v = store.parts["validation"]
            parts.append(("validation", v, np.ones(len(v.lengths), bool), np.ones(v.records, bool)))
    views = []
    for k, (part, index, ex_mask, rec_mask) in enumerate(parts):
        ids = np.flatnonzero(ex_mask)
        label = "data" if k == 0 else f"validation ({val_from})"
        counts = selection_counts(index, ex_mask, rec_mask)
        if say is not None:
            say(report_line(label, counts, dc.seq_len))
        if counts["examples"] == 0:
            if k == 0:
                raise DataError(f"empty dataset: no example with a trainable token in {dc.train_files}")
            raise DataError(f"empty validation set: no example with a trainable token ({val_from})")
        lengths = index.lengths[ids].astype(np.int64)
        views.append(StoreView(store.location, part, index.shards, ids, lengths, selection_fingerprint(store.key, part, ids)))
    return views[0], (views[1] if len(views) > 1 else None)


def selection_counts(index, ex_mask: np.ndarray, rec_mask: np.ndarray) -> dict[str, int]:
    """The report's counts of the examples ``ex_mask`` (bool [E]) and records ``rec_mask`` (bool [R])."""
    from rayft.data.token_store import SPLIT, TEXT, TRUNCATED

    flags = index.flags[rec_mask]
    return {
        "records": int(rec_mask.sum()),
        "text": int(np.count_nonzero(flags & TEXT)),
        "examples": int(ex_mask.sum()),
        "trainable": int(index.trainable[ex_mask].sum(dtype=np.int64)),
        "tokens": int(index.lengths[ex_mask].sum(dtype=np.int64)),
        "truncated": int(np.count_nonzero(flags & TRUNCATED)),
        "split": int(np.count_nonzero(flags & SPLIT)),
        "dropped": int(index.dropped[rec_mask].sum(dtype=np.int64)),
    }


def report_line(label: str, c: dict[str, int], seq_len: int) -> str:
    """The report line of a selection (:func:`selection_counts`): records, examples, trainable and
    total tokens, truncations, split documents and pieces dropped for lack of a trainable token."""
    n_text = c["text"]
    kinds = f" ({c['records'] - n_text} conversations, {n_text} text documents)" if n_text else ""
    split = f"; text documents split into {seq_len}-token chunks: {c['split']}" if n_text else ""
    return (
        f"{label}: {c['records']} records{kinds} → {c['examples']} examples, {c['trainable']:,} trainable of {c['tokens']:,} tokens; "
        f"truncated to {seq_len}: {c['truncated']}{split}; dropped (no trainable token left): {c['dropped']}"
    )

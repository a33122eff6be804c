"""A run's data, ready to train on: read, validate and tokenize (or take from the cache).

Everything here runs before any worker (or GPU) starts, so bad data fail in seconds, with the
file and line. Errors are the data layer's own :class:`~rayft.data.examples.DataError`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.console import Console
from rich.text import Text

from rayft.config import RayftConfig
from rayft.data.examples import DataError


@dataclass
class PreparedData:
    """The driver's tokenized data: ``train`` and ``validation`` (None without a validation set)
    :class:`~rayft.data.tokenize.TokenizedDataset`, the tokenizer and its name, and whether the
    tokenized data came from ``data.cache_dir`` (``cache``: ``"hit"``, ``"miss"`` or ``"off"``)."""

    tokenizer: Any
    tokenizer_name: str
    train: Any
    validation: Any = None
    cache: str = "off"


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


def prepare_data(
    cfg: RayftConfig,
    console: Console,
    tokenizer,
    tokenizer_name: str,
    *,
    vocab_size: int | None = None,
    connect: Callable[[], Any] | None = None,
) -> PreparedData:
    """Load, validate and tokenize the training (and validation) data on the driver.

    With ``data.cache_dir`` set, a cache entry for the same inputs, tokenizer and settings
    (:mod:`rayft.data.cache`) is used instead, and the report lines of the run that wrote it are
    printed again; otherwise the data are read and tokenized and the result cached. A corrupt
    entry is reported as a warning and rebuilt. With ``data.on_bad_record: skip`` the skipped
    records are printed first, per reason category with the first ``file:line`` of each.

    Args:
        tokenizer: the loaded tokenizer (:func:`open_tokenizer`), named ``tokenizer_name``.
        vocab_size: the model's vocabulary size; needed by ``data.synthetic`` only.
        connect: reaches Ray before tokenizing there (``data.preprocess``,
            :func:`rayft.data.parallel.use_ray`); without it the Ray already initialised in
            this process is used.

    Raises:
        DataError: a bad record (``file:line: reason``, policy ``error``), an unreadable file, or
            nothing left to train on (also when every record was skipped as bad), an empty
            validation set, or a ``data.validation_fraction`` that leaves no training record.
    """
    from rayft.data import cache as cache_lib

    dc = cfg.data
    if dc.synthetic is not None:
        from rayft.data.synthetic import random_dataset

        if vocab_size is None:
            raise DataError("data.synthetic needs the model's vocabulary size")
        ds = random_dataset(dc.synthetic.rows, dc.seq_len, vocab_size, dc.synthetic.seed)
        console.print(
            f"data: synthetic, {len(ds)} rows of {dc.seq_len} random token ids in [0, {vocab_size}) (seed {dc.synthetic.seed}), every token trainable",
            highlight=False,
            markup=False,
        )
        return PreparedData(tokenizer, tokenizer_name, ds, None, "off")
    key = key_parts = None
    if dc.cache_dir:
        stamps = cache_lib.input_stamps(dc)  # before the key's hashing: a change after it is caught below
        key, key_parts = cache_lib.cache_key(dc, tokenizer, tokenizer_name)
        try:
            hit = cache_lib.load(dc.cache_dir, key)
        except cache_lib.CacheError as e:
            console.print(Text.assemble(("warning", "yellow"), f": ignoring a corrupt tokenized-data cache entry: {e}"), highlight=False)
            hit = None
        if hit is not None:
            for line in hit.info.get("lines", []):
                console.print(line, highlight=False, markup=False)
            console.print(
                f"data: used the tokenized cache {cache_lib.entry_dir(dc.cache_dir, key)} (no file read or tokenized)",
                highlight=False,
                markup=False,
            )
            return PreparedData(tokenizer, tokenizer_name, hit.parts["train"], hit.parts.get("validation"), "hit")
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        console.print(line, highlight=False, markup=False)

    train_ex = load_examples(dc.train_files, dc, say, "data.train_files")
    if dc.max_examples:
        train_ex = train_ex[: dc.max_examples]
    val_ex, val_from = None, ""
    if dc.validation_fraction:
        train_ex, val_ex = split_validation(train_ex, dc.validation_fraction, dc.seed)
        val_from = f"data.validation_fraction={dc.validation_fraction} of the training records, seed {dc.seed}"
    elif dc.validation_files:
        val_ex = load_examples(dc.validation_files, dc, say, "data.validation_files")
        val_from = "data.validation_files"
    ds = tokenize_examples(tokenizer, train_ex, cfg, connect, console)
    val = tokenize_examples(tokenizer, val_ex, cfg, connect, console) if val_ex is not None else None
    say(data_line("data", train_ex, ds, dc.seq_len))
    if len(ds) == 0:
        raise DataError(f"empty dataset: no example with a trainable token in {dc.train_files}")
    if val is not None:
        say(data_line(f"validation ({val_from})", val_ex, val, dc.seq_len))
        if len(val) == 0:
            raise DataError(f"empty validation set: no example with a trainable token ({val_from})")
    if key is not None and cache_lib.input_stamps(dc) != stamps:
        console.print(
            Text.assemble(("warning", "yellow"), ": an input file changed while it was read; the tokenized data were not cached"),
            highlight=False,
        )
        key = None
    if key is not None:
        parts = {"train": ds, **({"validation": val} if val is not None else {})}
        try:
            where = cache_lib.save(dc.cache_dir, key, cache_lib.CachedData(parts, {"lines": lines}), key_parts)
            console.print(f"data: cached the tokenized data in {where}", highlight=False, markup=False)
        except OSError as e:
            console.print(
                Text.assemble(("warning", "yellow"), f": could not write the tokenized-data cache (data.cache_dir): {e}"), highlight=False
            )
    return PreparedData(tokenizer, tokenizer_name, ds, val, "miss" if key is not None else "off")


def load_examples(files: list[str], dc, say: Callable[[str], None], key: str) -> list:
    """Read ``files`` (printing notes, skips and template placeholders through ``say``).

    Raises:
        DataError: a bad record under ``on_bad_record: error``, or nothing left (``key`` names the
            config field in the message when it is not ``data.train_files``).
    """
    from rayft.data.formats import load_conversations

    loaded = load_conversations(files, dc.format, dc.on_bad_record, dc.columns.mapping(), placeholders=dc.placeholders)
    for line in [*(f"data: {n}" for n in loaded.notes), *loaded.skip_summary(), *loaded.placeholder_summary()]:
        say(line)
    if not loaded:
        why = f"all {loaded.records} records were bad and skipped" if loaded.skipped else "no record"
        raise DataError(f"empty dataset: {why} in {files}" + ("" if key == "data.train_files" else f" ({key})"))
    return list(loaded)


def split_validation(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """``(train, validation)``: ``max(1, round(fraction × n))`` examples chosen at random with
    ``np.random.default_rng([seed, 0x7661])`` (a stream of its own, not the shuffle's), both parts
    in their original order.

    Raises:
        DataError: fewer than 2 examples (nothing would be left to train on).
    """
    import numpy as np

    n = len(examples)
    n_val = max(1, round(fraction * n))
    if n - n_val < 1:
        raise DataError(f"data.validation_fraction={fraction} of {n} record(s) leaves no training record")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng([seed, 0x7661]).permutation(n)[:n_val]] = True
    return [e for e, h in zip(examples, held) if not h], [e for e, h in zip(examples, held) if h]


def tokenize_examples(tokenizer, examples: list, cfg: RayftConfig, connect: Callable[[], Any] | None, console: Console):
    """A :class:`~rayft.data.tokenize.TokenizedDataset` of ``examples``: in this process, or with
    Ray Data over the cluster's CPUs when ``data.preprocess`` says so (``connect`` reaches Ray first)."""
    from rayft.data.parallel import tokenize_dataset_ray, use_ray
    from rayft.data.tokenize import tokenize_dataset

    mode = cfg.data.preprocess
    if use_ray(mode, len(examples), None):
        import ray

        if connect is not None:
            connect()
        cpus = ray.cluster_resources().get("CPU", 0) if ray.is_initialized() else 0
        if use_ray(mode, len(examples), cpus):
            t0 = time.perf_counter()
            ds = tokenize_dataset_ray(tokenizer, examples, cfg.data.seq_len)
            console.print(
                f"data: tokenized {len(examples):,} records with Ray Data on {cpus:g} CPUs in {time.perf_counter() - t0:.1f} s",
                highlight=False,
            )
            return ds
    return tokenize_dataset(tokenizer, examples, cfg.data.seq_len)


def data_line(label: str, examples: list, ds, seq_len: int) -> str:
    """The report line of a tokenized set: records, examples, trainable and total tokens,
    truncations, split documents and examples dropped for lack of a trainable token."""
    from rayft.data.examples import TextDocument

    n_text = sum(isinstance(c, TextDocument) for c in examples)
    kinds = f" ({len(examples) - n_text} conversations, {n_text} text documents)" if n_text else ""
    split = f"; text documents split into {seq_len}-token chunks: {ds.split_documents}" if n_text else ""
    return (
        f"{label}: {len(examples)} records{kinds} → {len(ds)} examples, {int(ds.trainable.sum()):,} trainable of {len(ds.tokens):,} tokens; "
        f"truncated to {seq_len}: {ds.truncated}{split}; dropped (no trainable token left): {ds.dropped_no_trainable}"
    )

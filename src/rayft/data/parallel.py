"""Tokenization spread over every CPU of the Ray cluster with Ray Data.

The examples (already read and validated on the driver, so bad records keep their ``file:line``)
become a Ray Data dataset of ``{"index": int64, "example": pickled example}`` rows; ``map_batches``
runs an actor pool (one actor per CPU, each holding one copy of the tokenizer) that tokenizes a
batch with :func:`rayft.data.tokenize.tokenize_example` — the very function the local path uses —
and returns the batch's pieces as flat arrays tagged with their example index. The driver puts the
pieces back in example order (a stable sort on the index), so the result is byte-identical to
:func:`rayft.data.tokenize.tokenize_dataset`.

A bad example (a chat template that cannot be masked, no EOS token) is reported as the local path
reports it: the ``DataError`` of the first bad example in input order.
"""

from __future__ import annotations

import pickle
from typing import Sequence

import numpy as np

from rayft.data.examples import Conversation, DataError, TextDocument
from rayft.data.tokenize import TokenizedDataset, assemble, special_prefix, tokenize_example

#: ``data.preprocess: auto`` tokenizes with Ray Data from this many examples on (and only when the
#: cluster has at least :data:`RAY_MIN_CPUS` CPUs); below it the actor start-up costs more than it saves.
RAY_MIN_EXAMPLES = 20_000
RAY_MIN_CPUS = 2  # from 2 CPUs (measured on 100k records with the 2 cores shared: 585 vs 543 records/s, bench/results/2026-11-30-preprocess-100k-2cpu.json)


def use_ray(mode: str, n_examples: int, cluster_cpus: float | None) -> bool:
    """Whether to tokenize with Ray Data: ``mode`` is ``data.preprocess`` (``auto|local|ray``);
    ``cluster_cpus`` the Ray cluster's CPU count (None: not known yet, i.e. Ray not connected)."""
    if mode != "auto":
        return mode == "ray"
    return n_examples >= RAY_MIN_EXAMPLES and (cluster_cpus is None or cluster_cpus >= RAY_MIN_CPUS)


class _TokenizeBatch:
    """A Ray Data actor: one tokenizer, many batches."""

    def __init__(self, tokenizer, seq_len: int):
        self.tokenizer, self.seq_len = tokenizer, seq_len
        self.prefix: list[int] | None = None

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        idx_out, lens, toks, masks = [], [], [], []
        truncated = split = dropped = 0
        error, error_kind, error_index = "", "", -1
        for i, blob in zip(batch["index"].tolist(), batch["example"]):
            ex = pickle.loads(blob)
            if self.prefix is None and isinstance(ex, TextDocument):
                self.prefix = special_prefix(self.tokenizer)
            try:
                r = tokenize_example(self.tokenizer, ex, self.seq_len, self.prefix)
            except DataError as e:  # the batch's first bad example; the driver raises the earliest
                error, error_kind, error_index = str(e), e.kind, i
                break
            for t, m in r.pieces:
                idx_out.append(i)
                lens.append(len(t))
                toks.append(t)
                masks.append(m)
            truncated, split, dropped = truncated + r.truncated, split + r.split, dropped + r.dropped
        cat = lambda xs, dt: (np.concatenate(xs) if xs else np.zeros(0, dt)).astype(dt, copy=False)  # noqa: E731
        return {  # one output row per batch; the arrays travel as bytes (Arrow binary)
            "first_index": np.array([int(batch["index"][0])], dtype=np.int64),
            "piece_index": np.array([np.asarray(idx_out, np.int64).tobytes()], dtype=object),
            "lengths": np.array([np.asarray(lens, np.int64).tobytes()], dtype=object),
            "tokens": np.array([cat(toks, np.int32).tobytes()], dtype=object),
            "trainable": np.array([cat(masks, np.bool_).tobytes()], dtype=object),
            "counts": np.array([[truncated, split, dropped]], dtype=np.int64),
            "error": np.array([error], dtype=object),
            "error_kind": np.array([error_kind], dtype=object),
            "error_index": np.array([error_index], dtype=np.int64),
        }


def tokenize_dataset_ray(
    tokenizer,
    examples: Sequence[Conversation | TextDocument],
    seq_len: int,
    *,
    num_actors: int | None = None,
    batch_size: int | None = None,
) -> TokenizedDataset:
    """:func:`rayft.data.tokenize.tokenize_dataset` over the Ray cluster (Ray must be initialised).

    Args:
        num_actors: tokenizer actors (one CPU each); default every CPU of the cluster.
        batch_size: examples per ``map_batches`` batch; default about 4 batches per actor, 32–1024.
    Returns:
        The same :class:`TokenizedDataset` as the local path, array for array.
    Raises:
        DataError: the first bad example in input order (as the local path raises it).
        TypeError: an example that is neither a Conversation nor a TextDocument.
    """
    import ray
    import ray.data

    if not examples:
        return assemble([])
    for ex in examples:
        if not isinstance(ex, (Conversation, TextDocument)):
            raise TypeError(f"expected a Conversation or TextDocument, got {type(ex).__name__}")
    n_actors = num_actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
    n_actors = min(n_actors, len(examples))
    bs = batch_size or int(min(1024, max(32, -(-len(examples) // (4 * n_actors)))))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = True  # not relied on: pieces are sorted by index below
    rows = [{"index": i, "example": pickle.dumps(ex, protocol=pickle.HIGHEST_PROTOCOL)} for i, ex in enumerate(examples)]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows) // bs, 4 * n_actors)))
    out = ds.map_batches(
        _TokenizeBatch,
        fn_constructor_args=(tokenizer, seq_len),
        batch_size=bs,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=n_actors),
        num_cpus=1,
    ).take_all()
    out.sort(key=lambda r: int(r["first_index"]))
    errors = [r for r in out if int(r["error_index"]) >= 0]
    if errors:
        e = min(errors, key=lambda r: int(r["error_index"]))
        raise DataError(str(e["error"]), kind=str(e["error_kind"]))
    piece_index = np.concatenate([np.frombuffer(r["piece_index"], np.int64) for r in out])
    lengths = np.concatenate([np.frombuffer(r["lengths"], np.int64) for r in out])
    tokens = np.concatenate([np.frombuffer(r["tokens"], np.int32) for r in out])
    trainable = np.concatenate([np.frombuffer(r["trainable"], np.bool_) for r in out])
    truncated, split, dropped = (int(x) for x in np.sum([np.asarray(r["counts"]).reshape(3) for r in out], axis=0))
    if len(piece_index) and np.any(np.diff(piece_index) < 0):  # batches came back out of order: reorder pieces
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        order = np.argsort(piece_index, kind="stable")  # keeps a document's chunks in order
        gather = np.concatenate([np.arange(starts[k], starts[k] + lengths[k]) for k in order]) if len(order) else np.zeros(0, np.int64)
        tokens, trainable, lengths = tokens[gather], trainable[gather], lengths[order]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return TokenizedDataset(tokens.copy(), trainable.copy(), offsets, dropped, truncated, split)

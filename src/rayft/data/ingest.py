"""Input files ─► shards of a token store, as tasks that run in this process or over every CPU of
the Ray cluster (Ray Data), with exactly the same code and output either way.

The driver lists the input files (:func:`rayft.data.sources.expand_files`) and cuts the work into
tasks (:func:`rayft.data.ingest_tasks.plan_tasks`: JSON Lines byte ranges with exact line numbers,
Parquet row groups, whole files).

A task (:meth:`TaskRunner.run`) reads its bytes through pyarrow filesystems, parses them with
:mod:`rayft.data.readers` and :mod:`rayft.data.records`, tokenizes each accepted record with
:func:`rayft.data.tokenize.tokenize_example`, writes its shard(s) (:class:`~rayft.data.token_store.ShardWriter`)
and returns a small summary (JSON-able dict): counts, shard files with size and sha256, the first
bad record (``error``), a tokenization error (``tokenize_error``), skip counts per reason with the
first location of each and every skipped location (inline, or a ``<part>/<task>.skipped.jsonl``
file of the store when there are many), and the facts behind each file's note (a BOM, blank lines,
CRLF). The driver keeps only these summaries (:class:`PartResult`), never a record or a token.

``data.preprocess`` (:func:`use_ray`): ``local`` runs the tasks here in input order (stopping at
the first bad record under ``on_bad_record: error``); ``ray`` runs them as ``map_batches`` over an
actor pool (one tokenizer per actor, one actor per CPU of the cluster), streaming summaries back
and stopping once an error is certain to be the earliest in input order; ``auto`` uses Ray from
:data:`RAY_MIN_INPUT_BYTES` of input on a cluster of :data:`RAY_MIN_CPUS` CPUs or more.

Raises (every function here): :class:`~rayft.data.examples.DataError` for problems of the data.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from rayft.data.examples import DataError, TextDocument
from rayft.data.ingest_tasks import CHUNK_BYTES, Task, count_newlines, number_ranges, plan_tasks, ray_chunk_bytes, task_records
from rayft.data.sources import DataFile, file_size

#: cluster of at least :data:`RAY_MIN_CPUS` CPUs): 20,000 alpaca-like records are ~29 MiB, where
#: Ray started paying on 2 CPUs (bench/results/2026-11-30-preprocess-100k-2cpu.json).
RAY_MIN_INPUT_BYTES = 32 * 2**20
RAY_MIN_CPUS = 2
#: A task returns up to this many skipped locations inline; more go to a file of the store.
SKIP_INLINE = 100


def use_ray(mode: str, input_bytes: int, cluster_cpus: float | None) -> bool:
    """Whether to ingest with Ray Data: ``mode`` is ``data.preprocess`` (``auto|local|ray``);
    ``cluster_cpus`` the Ray cluster's CPU count (None: not known yet, i.e. Ray not connected)."""
    if mode != "auto":
        return mode == "ray"
    return input_bytes >= RAY_MIN_INPUT_BYTES and (cluster_cpus is None or cluster_cpus >= RAY_MIN_CPUS)


@dataclass(frozen=True)
class Settings:
    """What every task needs besides the tokenizer: the store (``location``), ``seq_len``,
    ``data.format``, ``data.columns``, ``data.on_bad_record`` and ``data.placeholders``."""

    location: str
    seq_len: int
    fmt: str = "auto"
    columns: dict[str, str] = field(default_factory=dict)
    on_bad_record: str = "error"
    placeholders: dict[str, str] = field(default_factory=dict)


class TaskRunner:
    """Runs tasks with one tokenizer (a Ray Data actor holds one; the local path one)."""

    def __init__(self, tokenizer, settings: Settings):
        self.tokenizer, self.settings = tokenizer, settings
        self._prefix: list[int] | None = None

    def prefix(self) -> list[int]:
        from rayft.data.tokenize import special_prefix

        if self._prefix is None:
            self._prefix = special_prefix(self.tokenizer)
        return self._prefix

    def run(self, task: Task, limit: int | None = None, progress: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
        """Run one task; returns its summary (see the module docstring). ``limit``: tokenize only
        the task's first ``limit`` accepted records (later ones are still read and validated);
        ``progress(bytes, records, tokens)`` is called as it goes (increments)."""
        from rayft.data.formats import LoadReport
        from rayft.data.token_store import SPLIT, TEXT, TRUNCATED, ShardWriter, write_file
        from rayft.data.tokenize import tokenize_example

        st = self.settings
        writer = ShardWriter(st.location, task.part, task.index)
        out: dict[str, Any] = {
            "index": task.index,
            "file": str(task.path),
            "kind": task.kind,
            "bytes": task.size,
            "records": 0,
            "accepted": 0,
            "tokenized": 0,
            "tokens": 0,
            "error": None,
            "tokenize_error": None,
            "skipped": {},
            "first_skip": {},
            "skip_where": [],
            "skip_file": None,
            "notes": [],
            "facts": None,
            "shards": [],
            "ignored": None,
            "placeholders": {},
            "placeholder_records": 0,
            "filled": 0,
        }
        report = LoadReport()  # the record step shared with load_conversations: ignored keys, placeholders
        file = str(task.path)
        notes: list = []
        skips: list[list[str]] = []
        tokenizing = True
        last = (0, 0)
        records = task_records(task, notes)
        while True:
            try:
                item = next(records, None)
            except DataError as e:  # a problem of the whole file
                msg = str(e)
                if st.on_bad_record == "skip":
                    msg = f"{e} (data.on_bad_record: skip skips single records; this problem stops the whole file)"
                out["error"] = {"message": msg, "kind": e.kind}
                break
            if item is None:
                break
            _n, where, value = item
            out["records"] += 1
            try:
                ex = report.take(file, where, value, st.fmt, st.columns, on_bad_record="error", placeholders=st.placeholders, keep=False)
            except DataError as e:
                if st.on_bad_record == "error":
                    out["error"] = {"message": str(e), "kind": e.kind}
                    break
                out["skipped"][e.kind] = out["skipped"].get(e.kind, 0) + 1
                out["first_skip"].setdefault(e.kind, [e.where, e.reason])
                skips.append([e.where, e.kind, e.reason])
                continue
            local = out["accepted"]
            out["accepted"] += 1
            if not tokenizing or (limit is not None and local >= limit):
                continue
            try:
                prefix = self.prefix() if isinstance(ex, TextDocument) else None
                r = tokenize_example(self.tokenizer, ex, st.seq_len, prefix)
            except DataError as e:  # not skippable; an earlier bad record (found below) still wins
                out["tokenize_error"] = {"message": str(e), "kind": e.kind, "record": local}
                tokenizing = False
                continue
            flags = (TEXT if isinstance(ex, TextDocument) else 0) | (TRUNCATED if r.truncated else 0) | (SPLIT if r.split else 0)
            writer.add(r.pieces, flags, r.dropped)
            out["tokenized"] += 1
            out["tokens"] += sum(len(t) for t, _ in r.pieces)
            if progress is not None and out["records"] % 256 == 0:
                progress(0, out["records"] - last[0], out["tokens"] - last[1])
                last = (out["records"], out["tokens"])
        if out["error"] is not None and st.on_bad_record == "error":
            return out  # the run stops: no shard written
        if file in report.ignored:
            out["ignored"] = [sorted(report.ignored[file].keys), report.ignored[file].first]
        out["placeholders"] = {p: [h.records, h.first] for p, h in report.placeholders.items()}
        out["placeholder_records"], out["filled"] = report.placeholder_records, report.filled
        writer.flush()
        out["shards"] = writer.shards
        out["notes"] = [n for n in notes if isinstance(n, str)]
        facts = [n for n in notes if isinstance(n, dict)]
        out["facts"] = facts[0] if facts else None
        if len(skips) > SKIP_INLINE:
            rel = f"{task.part}/{task.index:06d}.skipped.jsonl"
            blob = "".join(json.dumps({"where": w, "kind": k, "reason": r}, ensure_ascii=False) + "\n" for w, k, r in skips).encode()
            write_file(st.location, rel, lambda f: f.write(blob))
            out["skip_file"] = rel
        else:
            out["skip_where"] = skips
        if progress is not None:
            progress(task.size, out["records"] - last[0], out["tokens"] - last[1])
        return out


# -- a part: every task, here or on Ray ---------------------------------------------------------


@dataclass
class PartResult:
    """What the driver keeps of one part's ingest: the task summaries (in input order, those that
    ran), the earliest bad record (``error``: message and kind) and tokenization error
    (``tokenize_error``, with ``record``: its accepted record's number in the part)."""

    files: list[DataFile]
    summaries: list[dict[str, Any]]
    error: dict[str, Any] | None = None
    tokenize_error: dict[str, Any] | None = None
    mode: str = "local"
    seconds: float = 0.0
    cpus: float = 0.0

    @property
    def records(self) -> int:
        return sum(s["records"] for s in self.summaries)

    @property
    def accepted(self) -> int:
        return sum(s["accepted"] for s in self.summaries)

    @property
    def shards(self) -> list[dict[str, Any]]:
        return [sh for s in self.summaries for sh in s["shards"]]

    def skipped(self):
        """``{kind: SkippedRecords}`` as :class:`rayft.data.formats.LoadReport` has it (the first
        location of each kind in input order)."""
        from rayft.data.formats import SkippedRecords

        out: dict[str, SkippedRecords] = {}
        for s in self.summaries:
            for kind, n in s["skipped"].items():
                if kind in out:
                    out[kind].count += n
                else:
                    where, reason = s["first_skip"][kind]
                    out[kind] = SkippedRecords(n, where, reason)
        return out

    def notes(self) -> list[str]:
        """Per file, in file order: one line with its tolerated oddities (as the whole-file reader
        writes them: a BOM, blank lines, CRLF line endings), then one with its ignored message keys
        (as :class:`rayft.data.formats.LoadReport` writes them)."""
        ignored = self.load_report().ignored
        tolerated = self._tolerated_notes()
        out: list[str] = []
        for file in dict.fromkeys(str(f) for f in self.files):
            out += [line for line in tolerated if line.startswith(f"{file}: ")]
            if file in ignored:
                out.append(ignored[file].note(file))
        return out

    def _tolerated_notes(self) -> list[str]:
        """One line per file with tolerated oddities, in file order."""
        lines: list[str] = []
        merged: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        for s in self.summaries:
            lines_of = s["notes"]
            if s["kind"] == "range" and s["facts"] is not None:
                f = merged.setdefault(s["file"], {"bom": False, "blank": 0, "crlf": False})
                if s["file"] not in order:
                    order.append(s["file"])
                    lines.append(s["file"])  # placeholder, replaced below
                f["bom"] |= s["facts"]["bom"]
                f["blank"] += s["facts"]["blank"]
                f["crlf"] |= s["facts"]["crlf"]
            else:
                lines.extend(lines_of)
        out = []
        for line in lines:
            if line in merged:
                f = merged[line]
                found = ["a UTF-8 BOM at the start"] if f["bom"] else []
                if f["blank"]:
                    found.append(f"{f['blank']} blank line{'s' if f['blank'] > 1 else ''}")
                if f["crlf"]:
                    found.append("CRLF line endings")
                if found:
                    out.append(f"{line}: tolerated: {', '.join(found)}")
            else:
                out.append(line)
        return out

    def load_report(self):
        """The part's ignored message keys and template placeholders as one
        :class:`rayft.data.formats.LoadReport` (merged task by task, in input order): for its
        :meth:`~rayft.data.formats.LoadReport.placeholder_summary` and ignored-key notes."""
        from rayft.data.formats import IgnoredKeys, LoadReport, PlaceholderHits

        out = LoadReport()
        for s in self.summaries:
            r = LoadReport()
            if s.get("ignored"):
                keys, first = s["ignored"]
                r.ignored[s["file"]] = IgnoredKeys(set(keys), first)
            r.placeholders = {p: PlaceholderHits(n, list(first)) for p, (n, first) in s.get("placeholders", {}).items()}
            r.placeholder_records, r.filled = s.get("placeholder_records", 0), s.get("filled", 0)
            out.merge(r)
        return out

    def skip_locations(self, location: str) -> Iterator[dict[str, str]]:
        """Every skipped record, in input order: ``{"where", "kind", "reason"}``."""
        from rayft.data.token_store import read_bytes

        for s in self.summaries:
            if s["skip_file"]:
                for line in read_bytes(location, s["skip_file"]).decode().splitlines():
                    yield json.loads(line)
            for w, k, r in s["skip_where"]:
                yield {"where": w, "kind": k, "reason": r}


def ingest_part(
    files: list[DataFile],
    part: str,
    settings: Settings,
    tokenizer,
    *,
    use_ray_data: bool = False,
    limit: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    chunk_bytes: int | None = None,
    num_actors: int | None = None,
) -> PartResult:
    """Ingest ``files`` as part ``part`` of the store at ``settings.location``.

    Args:
        use_ray_data: run the tasks with Ray Data (Ray must be initialised), else here, in order.
        limit: tokenize only the first ``limit`` accepted records (``data.max_examples``; the
            local path honours it, Ray Data tokenizes everything).
        progress: ``(bytes, records, tokens)`` increments, as tasks advance.
        chunk_bytes: the range / row-group size; default :data:`CHUNK_BYTES`, or with Ray Data
            :func:`ray_chunk_bytes` of the cluster's CPUs (tests use tiny ones).
        num_actors: Ray Data actors (default: every CPU of the cluster).
    Returns:
        The :class:`PartResult`; its ``error`` is not raised here (the caller orders errors).
    """
    t0 = time.perf_counter()
    if chunk_bytes is None:
        chunk_bytes = CHUNK_BYTES
        if use_ray_data:
            import ray

            total = 0
            for f in files:
                try:
                    total += file_size(f)
                except DataError:  # reported with its file when a task reads it
                    pass
            chunk_bytes = ray_chunk_bytes(total, num_actors or int(ray.cluster_resources().get("CPU", 1)))
    tasks = plan_tasks(files, part, chunk_bytes)
    ranges = [t for t in tasks if t.kind == "range"]
    if use_ray_data:
        result = _ingest_ray(tasks, ranges, settings, tokenizer, progress, num_actors)
    else:
        number_ranges(tasks, [count_newlines(t.path, t.start, t.end) for t in ranges])
        runner = TaskRunner(tokenizer, settings)
        summaries: list[dict[str, Any]] = []
        accepted = 0
        for t in tasks:
            left = None if limit is None else max(0, limit - accepted)
            s = runner.run(t, left, progress)
            summaries.append(s)
            accepted += s["accepted"]
            if s["error"] is not None:
                break
        result = PartResult(files, summaries)
    result.files = files
    _order_errors(result)
    result.seconds = time.perf_counter() - t0
    return result


def _order_errors(result: PartResult) -> None:
    """The earliest bad record and the earliest tokenization error, in input order."""
    base = 0
    for s in result.summaries:
        if s["tokenize_error"] is not None and result.tokenize_error is None:
            result.tokenize_error = {**s["tokenize_error"], "record": base + s["tokenize_error"]["record"]}
        if s["error"] is not None:
            result.error = s["error"]
            result.summaries = result.summaries[: result.summaries.index(s) + 1]
            return
        base += s["accepted"]


class _IngestActor:
    """A Ray Data actor: one tokenizer, many tasks (one per batch row)."""

    def __init__(self, tokenizer, settings: Settings):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.runner = TaskRunner(tokenizer, settings)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [json.dumps(self.runner.run(pickle.loads(blob))) for blob in batch["task"]]
        return {"summary": np.array(out, dtype=object)}


def _ingest_ray(tasks, ranges, settings, tokenizer, progress, num_actors) -> PartResult:
    import ray
    import ray.data

    cpus = ray.cluster_resources().get("CPU", 1)
    if ranges:
        counter = ray.remote(num_cpus=1)(count_newlines)
        number_ranges(tasks, ray.get([counter.remote(t.path, t.start, t.end) for t in ranges]))
    if not tasks:
        return PartResult([], [], mode="ray", cpus=cpus)
    n_actors = max(1, min(num_actors or int(cpus), len(tasks)))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.preserve_order = False  # summaries come back as tasks finish; sorted below
    rows = [{"task": pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL)} for t in tasks]
    ds = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        _IngestActor,
        fn_constructor_args=(tokenizer, settings),
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=n_actors),  # every actor starts at once: there are tasks for all
        num_cpus=1,
    )
    done: dict[int, dict[str, Any]] = {}
    errors: set[int] = set()
    for row in ds.iter_rows():
        s = json.loads(row["summary"])
        done[s["index"]] = s
        if progress is not None:
            progress(s["bytes"], s["records"], s["tokens"])
        if s["error"] is not None:
            errors.add(s["index"])
        if errors and all(i in done for i in range(min(errors))):
            break  # every task before the earliest error has finished: that error is the run's
    ordered = [done[i] for i in sorted(done)]
    if not errors and len(ordered) != len(tasks):
        raise RuntimeError(f"Ray Data returned {len(ordered)} task summaries of {len(tasks)}")
    # keep the contiguous prefix up to the earliest error (later tasks may not all have run)
    prefix = []
    for i, s in enumerate(ordered):
        if s["index"] != i:
            break
        prefix.append(s)
    return PartResult([], prefix, mode="ray", cpus=cpus)

"""`rayft data`: `check` reads data files exactly as `rayft train` reads them, without training or
tokenizing, and reports every bad record (:func:`rayft.data.formats.load_conversations`); `prepare`
ingests and tokenizes a config's data into the token store ahead of training
(:func:`rayft.data.prepare.prepare_data`), with a progress bar, so that `rayft train` on the same
config opens the store and tokenizes nothing."""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

from rayft.commands.common import ConfigArg, SetOpt, console, fail, load_config_or_exit, say

data_app = typer.Typer(help="Check training data, or prepare it ahead of a run.", no_args_is_help=True)

#: Bad records the console shows per reason (``--json`` lists every one).
SHOWN_PER_KIND = 20


class Format(str, Enum):
    AUTO = "auto"
    MESSAGES = "messages"
    SHAREGPT = "sharegpt"
    ALPACA = "alpaca"
    TEXT = "text"


class Policy(str, Enum):
    SKIP = "skip"
    ERROR = "error"


def parse_columns(items: list[str] | None) -> dict[str, str]:
    """``["role=speaker", ...]`` → ``{"role": "speaker"}``, checked like ``data.columns``.

    Raises:
        ValueError: an item without ``=``, or a key or value ``data.columns`` refuses.
    """
    from rayft.data.records import check_columns

    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--columns {item!r}: expected KEY=NAME, e.g. --columns role=speaker")
        out[key.strip()] = value.strip()
    return check_columns(out)


def parse_placeholders(items: list[str] | None) -> dict[str, str]:
    """``["name=Rayft", ...]`` → ``{"name": "Rayft"}`` (the value as given, blanks kept; it may be
    empty), checked like ``data.placeholders``.

    Raises:
        ValueError: an item without ``=``, or a name ``data.placeholders`` refuses.
    """
    from rayft.data.placeholders import check_placeholders

    out: dict[str, str] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--placeholders {item!r}: expected KEY=VALUE, e.g. --placeholders name=Rayft")
        out[key.strip()] = value
    return check_placeholders(out)


def check_file(
    file: str, fmt: str, columns: dict[str, str], on_bad_record: str, placeholders: dict[str, str] | None = None
) -> dict[str, Any]:
    """Read one data file (a path or an ``s3://`` URI, as :func:`rayft.data.sources.expand_files`
    names it) under ``on_bad_record`` and describe it: records read, accepted, bad (per reason
    kind, with every location), its notes, how many records ``placeholders`` (``data.placeholders``)
    filled (``filled``) and the template placeholders left, and ``error``: the problem that
    stopped it (the first bad record under ``error``; a problem of the whole file under either
    policy), or None (``records``, ``accepted`` and ``bad`` are then None: not read to the end)."""
    from rayft.data.examples import DataError
    from rayft.data.formats import load_conversations

    out: dict[str, Any] = {"file": file, "records": None, "accepted": None, "bad": None, "skipped": {}, "notes": []}
    out.update(filled=None, placeholders={})
    try:
        report = load_conversations([file], fmt, on_bad_record, columns, placeholders=placeholders, keep=False)  # type: ignore[arg-type]
    except DataError as e:  # counts unknown: the file was not read to its end
        out["error"] = {"where": e.where or None, "kind": e.kind, "message": str(e)}
        return out
    out.update(
        records=report.records,
        accepted=report.records - report.num_skipped,
        bad=report.num_skipped,
        skipped={
            kind: {"count": s.count, "locations": [{"where": w, "reason": r} for w, r in s.locations]}
            for kind, s in sorted(report.skipped.items(), key=lambda kv: (-kv[1].count, kv[0]))
        },
        notes=report.notes_of(file),
        filled=report.filled,
        placeholders={p: {"records": h.records, "first": h.first} for p, h in report.placeholders.items()},
        error=None,
    )
    return out


def render(result: dict[str, Any], on_bad_record: str) -> list[str]:
    """The console lines of one :func:`check_file` result: at most :data:`SHOWN_PER_KIND` bad
    records per reason, then how many more."""
    f = result["file"]
    if result["error"] is not None:
        hint = " (--on-bad-record skip lists every bad record)" if on_bad_record == "error" else ""
        return [f"{f}: stopped{hint}:", f"  {result['error']['message']}"]
    lines = [f"{f}: {result['records']} records: {result['accepted']} accepted, {result['bad']} bad"]
    for kind, s in result["skipped"].items():
        lines.append(f"  {kind}: {s['count']}")
        lines += [f"    {loc['where']}: {loc['reason']}" for loc in s["locations"][:SHOWN_PER_KIND]]
        if s["count"] > SHOWN_PER_KIND:
            lines.append(f"    ... and {s['count'] - SHOWN_PER_KIND} more (--json lists every one)")
    lines += [f"  note: {n}" for n in result["notes"]]
    if result["filled"]:
        lines.append(f"  filled template placeholders in {result['filled']} record(s) (--placeholders)")
    for p, h in result["placeholders"].items():
        lines.append(f"  placeholder {p} left in {h['records']} record(s) (first: {', '.join(h['first'])}; data.placeholders fills it)")
    return lines


@data_app.command("check")
def check(
    files: Annotated[list[str], typer.Argument(help="Data files, globs, directories or s3:// URIs, as in data.train_files.")],
    format_: Annotated[Format, typer.Option("--format", help="The record format (data.format).", case_sensitive=False)] = Format.AUTO,
    columns: Annotated[
        Optional[list[str]],
        typer.Option("--columns", help="KEY=NAME: the data's name for a field, turn key or role (data.columns); repeatable."),
    ] = None,
    placeholders: Annotated[
        Optional[list[str]],
        typer.Option(
            "--placeholders",
            help="KEY=VALUE: fill the template placeholder {{KEY}}, or <KEY> for an upper-case KEY, with VALUE, as "
            "data.placeholders does (the filled records are checked again); repeatable.",
        ),
    ] = None,
    on_bad_record: Annotated[
        Policy,
        typer.Option(
            "--on-bad-record",
            help="skip: read on and list every bad record; error: stop each file at its first, as rayft train does (data.on_bad_record).",
            case_sensitive=False,
        ),
    ] = Policy.SKIP,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON on stdout, every bad record's location included.")
    ] = False,
) -> None:
    """Validate data files without training or tokenizing, reading them exactly as `rayft train` does.

    Per file: the records read, accepted and bad, per reason with every bad record's file:line
    (the console shows 20 per reason), and the notes (tolerated oddities, ignored message keys,
    template placeholders, those --placeholders filled). Exit 0 when every record is good, 1 when
    any record or file is bad or there is no record at all, 2 on a usage error (a file that does
    not exist, a bad --columns or --placeholders).
    """
    from rayft.data.examples import DataError
    from rayft.data.sources import expand_files

    try:
        cols, fills = parse_columns(columns), parse_placeholders(placeholders)
    except ValueError as e:
        fail(str(e), 2)
    try:
        paths = [str(p) for p in expand_files(files, key=None)]  # arguments, not a config key
    except DataError as e:
        fail(str(e), 2)
    results = [check_file(p, format_.value, cols, on_bad_record.value, fills) for p in paths]
    read = [r for r in results if r["error"] is None]
    records, accepted, bad = (sum(r[k] for r in read) for k in ("records", "accepted", "bad"))
    stopped = len(results) - len(read)
    empty = stopped == 0 and records == 0  # rayft train stops on it: "empty dataset: no record"
    ok = bad == 0 and stopped == 0 and not empty
    if as_json:
        summary = {"ok": ok, "on_bad_record": on_bad_record.value, "format": format_.value, "columns": cols, "placeholders": fills}
        summary.update(records=records, accepted=accepted, bad=bad, stopped=stopped, empty=empty, files=results)
        typer.echo(json.dumps(summary, indent=1, ensure_ascii=False))
    else:
        for r in results:
            for line in render(r, on_bad_record.value):
                typer.echo(line)
        counts = [f"{records} records, {accepted} accepted, {bad} bad"] if read else []
        counts += [f"{stopped} stopped"] if stopped else []
        typer.echo(f"checked {len(results)} file(s): {'; '.join(counts)}")
        if empty:
            typer.echo("no record in any file: nothing to train on (rayft train stops with 'empty dataset: no record')")
    if not ok:
        raise typer.Exit(1)


class IngestBar:
    """The ingest's progress (:class:`rayft.data.prepare.Progress`) as a rich bar: input bytes done
    of the total, records/s and tokens/s since the start."""

    def __init__(self, progress: Progress):
        self.progress, self.task, self.t0 = progress, None, time.perf_counter()
        self.records = self.tokens = 0

    def start(self, total_bytes: int) -> None:
        self.t0 = time.perf_counter()
        self.task = self.progress.add_task("ingest", total=max(total_bytes, 1), rates="")

    def advance(self, nbytes: int, records: int, tokens: int) -> None:
        self.records += records
        self.tokens += tokens
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rates = f"{self.records:,} records, {self.records / dt:,.0f} records/s, {self.tokens / dt:,.0f} tokens/s"
        if self.task is not None:
            self.progress.update(self.task, advance=nbytes, rates=rates)


@data_app.command("prepare")
def prepare(config: ConfigArg, set_: SetOpt = None) -> None:
    """Read, validate and tokenize the data into the token store under data.cache_dir, ahead of training.

    Prints the report lines and where the store is; `rayft train` on the same config (and settings) then tokenizes nothing.
    """
    cfg = load_config_or_exit(config, set_)
    if cfg.data.synthetic is not None:
        fail("data.synthetic has nothing to prepare (random tokens are made in memory by rayft train)", 2)
    if not cfg.data.cache_dir:
        fail(
            "data.cache_dir is null: rayft data prepare writes the token store under data.cache_dir, where rayft train "
            "finds it; set data.cache_dir (a shared path or an s3:// URI on a cluster)",
            2,
        )
    from rayft.data.examples import DataError
    from rayft.data.prepare import open_tokenizer, prepare_data
    from rayft.train.errors import TrainError
    from rayft.train.model_config import default_tokenizer
    from rayft.train.ray_cluster import connect_ray, nodes_missing_storage, ray_address

    def locate(root: str) -> str:  # on a multi-node cluster the store must be where every node (and the next run) reads it
        if "://" in root or not ray_address(cfg):
            return root
        connect_ray(cfg)
        blind = nodes_missing_storage(root)
        if blind:
            raise DataError(
                f"data.cache_dir={cfg.data.cache_dir} is node-local: Ray nodes {', '.join(blind)} cannot see it; "
                "put it on a file system every node mounts (e.g. /fsx/rayft/tokenized) or an s3://bucket/prefix URI"
            )
        return root

    name = default_tokenizer(cfg.model)
    try:
        tokenizer = open_tokenizer(name, cfg.model.revision, cfg.model.trust_remote_code)
        columns = (
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[rates]}"),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            data = prepare_data(cfg, console, tokenizer, name, connect=lambda: connect_ray(cfg), locate=locate, progress=IngestBar(bar))
    except (DataError, TrainError) as e:
        fail(str(e))
    val = f" and {len(data.validation):,} validation examples" if data.validation is not None else ""
    say(f"data: token store {data.store}: {len(data.train):,} training examples{val}; rayft train {config} uses it without tokenizing")


@data_app.command("show")
def show(
    config: ConfigArg,
    set_: SetOpt = None,
    n: Annotated[int, typer.Option("--n", min=0, help="How many training examples to render (the first N).")] = 3,
    html_file: Annotated[
        Optional[Path], typer.Option("--html", help="Also write the same as a static, self-contained HTML page to this file.")
    ] = None,
) -> None:
    """Show the first N training examples as the model trains on them: trained tokens highlighted, context dim.

    The data is opened (or tokenized) into the token store as `rayft data prepare` does; then the
    example-length histogram and the packing efficiency of the run's first epoch. Special tokens
    are shown as written.
    """
    from rich.console import Console
    from rich.text import Text

    from rayft.data import show as view

    cfg = load_config_or_exit(config, set_)
    if cfg.data.synthetic is not None:
        fail("data.synthetic has no text to show (random tokens are made in memory by rayft train)", 2)
    from rayft.data.examples import DataError
    from rayft.data.prepare import open_tokenizer, prepare_data
    from rayft.train.errors import TrainError
    from rayft.train.model_config import default_tokenizer

    name = default_tokenizer(cfg.model)
    try:
        tokenizer = open_tokenizer(name, cfg.model.revision, cfg.model.trust_remote_code)
        data = prepare_data(cfg, console, tokenizer, name)
    except (DataError, TrainError) as e:
        fail(str(e))
    ds = data.train
    lengths = ds.lengths()
    shown = []
    for i in range(min(n, len(ds))):
        tokens, trainable = ds.example(i)
        shown.append((i, view.spans(data.tokenizer, tokens, trainable), int(len(tokens)), int(trainable.sum())))
    hist = view.length_histogram(lengths)
    try:
        from rayft.train.step_plan import make_plan

        plan = make_plan(cfg, ds, cfg.train.num_workers if isinstance(cfg.train.num_workers, int) else 1)
        efficiency: float | None = view.first_epoch_efficiency(plan, lengths, cfg.data.seq_len)
        eff_line = f"packing efficiency, first epoch: {100 * efficiency:.1f}% (non-padding / row tokens of {cfg.data.seq_len})"
    except ValueError as e:
        efficiency, eff_line = None, f"packing efficiency: no plan ({e})"
    out = Console(highlight=False, soft_wrap=True)
    out.print(Text("trained tokens", style=view.TRAINED_STYLE) + Text(" / ") + Text("context tokens", style=view.CONTEXT_STYLE))
    for i, parts, size, trained in shown:
        out.rule(f"example {i}: {size} tokens, {trained} trained", align="left")
        out.print(view.example_text(parts))
    out.rule()
    out.print(view.histogram_table(hist))
    out.print(f"{len(ds):,} training examples; {eff_line}", markup=False)
    if html_file is not None:
        page = view.html_page(
            f"rayft data show {config}", [(i, parts) for i, parts, _, _ in shown], hist, efficiency, f"{len(ds):,} training examples"
        )
        html_file.write_text(page, encoding="utf-8")
        say(f"data show: wrote {html_file}")

"""`rayft bench readme`: the README's performance table, generated from bench/results.

The rows to show are listed in a YAML file (``bench/readme_table.yaml``), one per measured job::

    - job: "`rayft train`, alpaca EN+ZH packed, micro-batch 8"
      file: bench/results/2026-11-30-train-packed-ckpt-resume-qwen2.5-1.5b-2xh200.json
      select: rayft/random            # train-bench: recipe/workload; speed matrix: row name

Every figure in the table is read from the named results file; the table goes between the markers
``<!-- rayft bench readme: begin -->`` and ``<!-- rayft bench readme: end -->``. ``--check`` fails
when the README is not what the results files say (the tests run it), so the table cannot drift.

Results files understood (by their ``figures``):

* a run record (:mod:`rayft.benchmarks.record`): ``median_tokens_per_s_per_gpu``, ``median_mfu``,
  ``peak_mem_gib``, ``world_size``;
* the speed matrix (``rows``, each with ``name``): ``select`` is the row's name;
* ``rayft bench train`` (``runs``): ``select`` is ``recipe/workload``; a run that did not finish
  shows its status;
* ``rayft bench fabric`` (``tokens_per_s_ratio_fast_over_sockets``): both runs and the ratio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rayft.benchmarks.train_results import finite_number, md_cell, status_text
from rayft.config_load import load_yaml

BEGIN = "<!-- rayft bench readme: begin -->"
END = "<!-- rayft bench readme: end -->"
HEADER = "| job | GPUs | tokens/s/GPU | MFU | peak memory | results file |\n| --- | --- | --- | --- | --- | --- |"


class ReadmeTableError(ValueError):
    """A bad rows file, a results file without the figures a row asks for, or missing markers."""


def _field(obj: Any, key: str, where: str, *, kind: type | tuple[type, ...] = (int, float), optional: bool = False) -> Any:
    """``obj[key]``, checked: a ``kind`` (numbers by default; bool is never a number), or None
    when ``optional``. Raises ReadmeTableError naming ``where`` and the field."""
    if not isinstance(obj, dict):
        raise ReadmeTableError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        if optional:
            return None
        raise ReadmeTableError(f"{where}: no field '{key}'")
    v = obj[key]
    if v is None and optional:
        return None
    number = kind == (int, float)
    if not isinstance(v, kind) or (number and isinstance(v, bool)):
        want = "a number" if number else " or ".join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))
        raise ReadmeTableError(f"{where}: field '{key}' must be {want}{' or null' if optional else ''}, got {_short(v)}")
    if number and not finite_number(v):
        raise ReadmeTableError(f"{where}: field '{key}' must be a finite number{' or null' if optional else ''}, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "—" if v is None else format(v, spec) + suffix


def row_figures(doc: Any, select: str | None, where: str) -> dict[str, str]:
    """The table cells (``gpus``, ``tps``, ``mfu``, ``mem``) of one results document.

    Raises:
        ReadmeTableError: the document is of no known kind, a figure is missing or not a number,
            or ``select`` names nothing in it (``where`` names the rows-file entry in the message).
    """
    fig = _field(doc, "figures", where, kind=dict)
    num = lambda obj, key, w, optional=False: _field(obj, key, w, optional=optional)  # noqa: E731
    pct = lambda x: "—" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    if "rows" in fig:  # speed matrix
        rows = {_field(r, "name", f"{where}: figures.rows[{i}]", kind=str): r for i, r in enumerate(_field(fig, "rows", where, kind=list))}
        if select not in rows:
            raise ReadmeTableError(f"{where}: select={select!r} is not a row of this speed matrix (rows: {', '.join(rows)})")
        r, w = rows[select], f"{where}: row {select!r}"
        return {
            "gpus": f"{num(r, 'gpus', w)}×",
            "tps": f"{num(r, 'tokens_per_s_per_gpu', w):,.0f}",
            "mfu": pct(num(r, "mfu", w, True)),
            "mem": _fmt(num(r, "peak_mem_gib", w, True), ".1f", " GiB"),
        }
    if "tokens_per_s_ratio_fast_over_sockets" in fig:  # rayft bench fabric
        if select is not None:
            raise ReadmeTableError(f"{where}: select={select!r} given, but a fabric results file has one row")
        runs = _field(fig, "runs", where, kind=dict)
        fast, sock = (_field(runs, k, f"{where}: figures.runs", kind=dict) for k in ("fast", "sockets"))
        ratio = num(fig, "tokens_per_s_ratio_fast_over_sockets", where)
        tf, ts = (
            num(fast, "median_tokens_per_s_per_gpu", f"{where}: runs.fast"),
            num(sock, "median_tokens_per_s_per_gpu", f"{where}: runs.sockets"),
        )
        return {
            "gpus": f"{num(fast, 'world_size', f'{where}: runs.fast')}×",
            "tps": f"{tf:,.0f} vs {ts:,.0f} ({ratio:.2f}×)",
            "mfu": "—",
            "mem": "—",
        }
    if "runs" in fig:  # rayft bench train
        runs = {}
        for i, r in enumerate(_field(fig, "runs", where, kind=list)):
            w = f"{where}: figures.runs[{i}]"
            runs[f"{_field(r, 'recipe', w, kind=str)}/{_field(r, 'workload', w, kind=str)}"] = r
        if select not in runs:
            raise ReadmeTableError(f"{where}: select={select!r} is not a run of this bench (runs: {', '.join(runs)})")
        r, w = runs[select], f"{where}: run {select!r}"
        status = _field(r, "status", w, kind=str)
        if status != "ok":
            error = _field(r, "error", w, kind=str, optional=True)
            tps = status_text(status, error)
        else:
            tps = f"{num(r, 'tokens_per_s_per_gpu', w):,.0f}"
        return {
            "gpus": f"{num(fig, 'world_size', where)}×",
            "tps": tps,
            "mfu": pct(num(r, "mfu", w, True)),
            "mem": _fmt(num(r, "peak_mem_gib", w, True), ".1f", " GiB"),
        }
    if "median_tokens_per_s_per_gpu" in fig:  # a run record
        if select is not None:
            raise ReadmeTableError(f"{where}: select={select!r} given, but a run record has one run")
        return {
            "gpus": f"{num(fig, 'world_size', where)}×",
            "tps": f"{num(fig, 'median_tokens_per_s_per_gpu', where):,.0f}",
            "mfu": pct(num(fig, "median_mfu", where, True)),
            "mem": _fmt(num(fig, "peak_mem_gib", where, True), ".1f", " GiB"),
        }
    raise ReadmeTableError(f"{where}: not a results file this table knows (figures: {', '.join(fig)})")


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReadmeTableError(f"{what}: {e}") from None


def render_table(rows_file: str | Path, root: str | Path | None = None) -> str:
    """The Markdown table for ``rows_file``; results paths are relative to ``root`` (default: the
    rows file's repository, i.e. its parent's parent).

    Raises:
        ReadmeTableError: a malformed rows file or results file, named with the entry's index.
    """
    rows_file = Path(rows_file)
    root = Path(root) if root else rows_file.resolve().parent.parent
    try:
        spec = load_yaml(_read(rows_file, str(rows_file)))
    except (yaml.YAMLError, RecursionError) as e:
        raise ReadmeTableError(f"{rows_file}: {e if isinstance(e, yaml.YAMLError) else 'nested too deeply'}") from None
    if not isinstance(spec, list) or not spec:
        raise ReadmeTableError(f"{rows_file}: expected a non-empty list of rows (job, file, select)")
    lines = [HEADER]
    for i, entry in enumerate(spec):
        where = f"{rows_file} entry {i}"
        if not isinstance(entry, dict) or not {"job", "file"} <= set(entry) or set(entry) - {"job", "file", "select", "label"}:
            raise ReadmeTableError(f"{where}: needs 'job' and 'file' (and optionally 'select', 'label'), got {entry!r}")
        for key in ("job", "file", "select", "label"):
            _field(entry, key, where, kind=str, optional=key in ("select", "label"))
        text = _read(root / entry["file"], f"{where}: {entry['file']}")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, an integer of too many digits, nesting
            raise ReadmeTableError(f"{where}: {entry['file']}: not JSON this table can read: {type(e).__name__}: {str(e)[:120]}") from None
        cells = row_figures(doc, entry.get("select"), f"{where} ({entry['file']})")
        label = entry.get("label") or Path(entry["file"]).stem
        lines.append(
            f"| {md_cell(entry['job'])} | {cells['gpus']} | {md_cell(cells['tps'])} | {cells['mfu']} | {cells['mem']} "
            f"| [{md_cell(label)}]({entry['file']}) |"
        )
    return "\n".join(lines) + "\n"


def update_readme(readme: str | Path, rows_file: str | Path, check: bool = False) -> bool:
    """Put the generated table between the marker lines of ``readme`` (each exactly once, alone on
    its line, BEGIN before END). Returns True when the README was already up to date; with
    ``check`` nothing is written.

    Raises:
        ReadmeTableError: the markers are missing, repeated or out of order, the README cannot be
            read or written, or :func:`render_table` failed.
    """
    readme = Path(readme)
    text = _read(readme, str(readme))
    lines = text.splitlines(keepends=True)
    at = {m: [i for i, ln in enumerate(lines) if ln.strip() == m] for m in (BEGIN, END)}
    stray = [i + 1 for i, ln in enumerate(lines) if (BEGIN in ln or END in ln) and ln.strip() not in (BEGIN, END)]
    if len(at[BEGIN]) != 1 or len(at[END]) != 1 or at[END][0] < at[BEGIN][0] or stray:
        raise ReadmeTableError(
            f"{readme}: needs the lines {BEGIN} and {END} once each, alone on their lines and in that order"
            + (f" (marker text inside other lines: {stray})" if stray else "")
        )
    b, e = at[BEGIN][0], at[END][0]
    new = "".join(lines[: b + 1]) + render_table(rows_file, readme.resolve().parent) + "".join(lines[e:])
    if new == text:
        return True
    if not check:
        try:
            readme.write_text(new, encoding="utf-8")
        except OSError as err:
            raise ReadmeTableError(f"{readme}: {err}") from None
    return False

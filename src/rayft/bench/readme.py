"""`rayft bench readme`: the README's performance table, generated from bench/results.

The rows to show are listed in a YAML file (``bench/readme_table.yaml``), one per measured job::

    - job: "`rayft train`, alpaca EN+ZH packed, micro-batch 8"
      file: bench/results/2026-11-30-train-packed-ckpt-resume-qwen2.5-1.5b-2xh200.json
      select: rayft/random            # train-bench: recipe/workload; speed matrix: row name

Every figure in the table is read from the named results file; the table goes between the markers
``<!-- rayft bench readme: begin -->`` and ``<!-- rayft bench readme: end -->``. ``--check`` fails
when the README is not what the results files say (the tests run it), so the table cannot drift.

Results files understood (by their ``figures``):

* a run record (:mod:`rayft.bench.record`): ``median_tokens_per_s_per_gpu``, ``median_mfu``,
  ``peak_mem_gib``, ``world_size``;
* the speed matrix (``rows``, each with ``name``): ``select`` is the row's name;
* ``rayft bench train`` (``runs``): ``select`` is ``recipe/workload``; a run that did not finish
  shows its status;
* ``rayft bench fabric`` (``tokens_per_s_ratio_fast_over_sockets``): both runs and the ratio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

import yaml

BEGIN = "<!-- rayft bench readme: begin -->"
END = "<!-- rayft bench readme: end -->"
HEADER = "| job | GPUs | tokens/s/GPU | MFU | peak memory | results file |\n| --- | --- | --- | --- | --- | --- |"


class ReadmeTableError(ValueError):
    """A bad rows file, a results file without the figures a row asks for, or missing markers."""


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _gib(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f} GiB"


def row_figures(doc: dict[str, Any], select: str | None, where: str) -> dict[str, str]:
    """The table cells (``gpus``, ``tps``, ``mfu``, ``mem``) of one results document.

    Raises:
        ReadmeTableError: the document is of no known kind, or ``select`` names nothing in it
            (``where`` names the rows-file entry in the message).
    """
    fig = doc.get("figures")
    if not isinstance(fig, dict):
        raise ReadmeTableError(f"{where}: the results file has no 'figures' object")
    if "rows" in fig:  # speed matrix
        rows = {r.get("name"): r for r in fig["rows"]}
        if select not in rows:
            raise ReadmeTableError(f"{where}: select={select!r} is not a row of this speed matrix (rows: {', '.join(map(str, rows))})")
        r = rows[select]
        return {"gpus": f"{r['gpus']}×", "tps": _num(r["tokens_per_s_per_gpu"], ",.0f"), "mfu": _pct(r.get("mfu")), "mem": _gib(r.get("peak_mem_gib"))}
    if "runs" in fig and isinstance(fig["runs"], list):  # rayft bench train
        runs = {f"{r['recipe']}/{r['workload']}": r for r in fig["runs"]}
        if select not in runs:
            raise ReadmeTableError(f"{where}: select={select!r} is not a run of this bench (runs: {', '.join(runs)})")
        r = runs[select]
        ok = r.get("status") == "ok"
        return {"gpus": f"{fig['world_size']}×", "tps": _num(r.get("tokens_per_s_per_gpu"), ",.0f") if ok else r.get("status", "?"),
                "mfu": _pct(r.get("mfu")), "mem": _gib(r.get("peak_mem_gib"))}  # fmt: skip
    if "tokens_per_s_ratio_fast_over_sockets" in fig:  # rayft bench fabric
        fast, sock = fig["runs"]["fast"], fig["runs"]["sockets"]
        return {"gpus": f"{fast['world_size']}×",
                "tps": f"{fast['median_tokens_per_s_per_gpu']:,.0f} vs {sock['median_tokens_per_s_per_gpu']:,.0f} "
                       f"({fig['tokens_per_s_ratio_fast_over_sockets']:.2f}×)",
                "mfu": "—", "mem": "—"}  # fmt: skip
    if "median_tokens_per_s_per_gpu" in fig:  # a run record
        if select:
            raise ReadmeTableError(f"{where}: select={select!r} given, but a run record has one run")
        return {"gpus": f"{fig['world_size']}×", "tps": _num(fig["median_tokens_per_s_per_gpu"], ",.0f"),
                "mfu": _pct(fig.get("median_mfu")), "mem": _gib(fig.get("peak_mem_gib"))}  # fmt: skip
    raise ReadmeTableError(f"{where}: not a results file this table knows (figures: {', '.join(fig)})")


def render_table(rows_file: str | Path, root: str | Path | None = None) -> str:
    """The Markdown table for ``rows_file``; results paths are relative to ``root`` (default: the
    rows file's repository, i.e. its parent's parent).

    Raises:
        ReadmeTableError: a malformed rows file or results file, named with the entry's index.
    """
    rows_file = Path(rows_file)
    root = Path(root) if root else rows_file.resolve().parent.parent
    try:
        spec = yaml.safe_load(rows_file.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ReadmeTableError(f"{rows_file}: {e}") from None
    if not isinstance(spec, list) or not spec:
        raise ReadmeTableError(f"{rows_file}: expected a non-empty list of rows (job, file, select)")
    lines = [HEADER]
    for i, entry in enumerate(spec):
        where = f"{rows_file} entry {i}"
        if not isinstance(entry, dict) or not {"job", "file"} <= set(entry) or set(entry) - {"job", "file", "select", "label"}:
            raise ReadmeTableError(f"{where}: needs 'job' and 'file' (and optionally 'select', 'label'), got {entry!r}")
        path = root / entry["file"]
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ReadmeTableError(f"{where}: {entry['file']}: {e}") from None
        cells = row_figures(doc, entry.get("select"), where)
        label = entry.get("label") or Path(entry["file"]).stem.removeprefix(doc.get("date", "")[:10] + "-")
        lines.append(f"| {entry['job']} | {cells['gpus']} | {cells['tps']} | {cells['mfu']} | {cells['mem']} | [{label}]({entry['file']}) |")
    return "\n".join(lines) + "\n"


def update_readme(readme: str | Path, rows_file: str | Path, check: bool = False) -> bool:
    """Put the generated table between the markers of ``readme``. Returns True when the README
    was already up to date; with ``check`` nothing is written.

    Raises:
        ReadmeTableError: the markers are missing or out of order, or :func:`render_table` failed.
    """
    readme = Path(readme)
    text = readme.read_text()
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        raise ReadmeTableError(f"{readme}: needs the lines {BEGIN} and {END}, in that order")
    new = text[: b + len(BEGIN)] + "\n" + render_table(rows_file, readme.resolve().parent) + text[e:]
    if new == text:
        return True
    if not check:
        readme.write_text(new)
    return False


def register(bench_app: typer.Typer) -> None:
    """Add ``rayft bench readme`` to the bench command group."""
    from rich.console import Console
    from rich.text import Text

    @bench_app.command("readme")
    def readme_cmd(
        readme: Annotated[Path, typer.Option(help="The README holding the table markers.")] = Path("README.md"),
        rows: Annotated[Path, typer.Option(help="YAML list of rows: job, file, select, label.")] = Path("bench/readme_table.yaml"),
        check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when the README's table is out of date.")] = False,
    ) -> None:
        """Regenerate the README's performance table from the results files in bench/results."""
        console = Console(stderr=True)
        try:
            same = update_readme(readme, rows, check=check)
        except ReadmeTableError as e:
            console.print(Text.assemble(("error", "bold red"), f": {e}"), highlight=False)
            raise typer.Exit(1) from None
        if same:
            console.print(f"{readme}: the table is up to date", highlight=False, markup=False)
        elif check:
            console.print(f"{readme}: the table differs from the results files; run `rayft bench readme`", highlight=False, markup=False)
            raise typer.Exit(1)
        else:
            console.print(f"{readme}: table rewritten from {rows}", highlight=False, markup=False)

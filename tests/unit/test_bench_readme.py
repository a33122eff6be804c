"""`rayft bench readme`: the README's performance table comes from bench/results, and stays so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.bench.readme import BEGIN, END, ReadmeTableError, render_table, row_figures, update_readme
from rayft.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_what_the_results_files_say():
    # fails when a results file or the README is edited without `rayft bench readme`
    assert update_readme(ROOT / "README.md", ROOT / "bench" / "readme_table.yaml", check=True), \
        "README.md's performance table is out of date: run `rayft bench readme`"


def test_every_kind_of_results_file():
    record = {"figures": {"median_tokens_per_s_per_gpu": 43271.99, "median_mfu": 0.41091, "peak_mem_gib": 44.256, "world_size": 2}}
    assert row_figures(record, None, "e") == {"gpus": "2×", "tps": "43,272", "mfu": "41.1%", "mem": "44.3 GiB"}
    matrix = {"figures": {"rows": [{"name": "a", "gpus": 1, "tokens_per_s_per_gpu": 1000.4, "mfu": 0.5, "peak_mem_gib": 10.0},
                                   {"name": "b", "gpus": 1, "tokens_per_s_per_gpu": 2000.6, "mfu": None, "peak_mem_gib": None}]}}
    assert row_figures(matrix, "b", "e") == {"gpus": "1×", "tps": "2,001", "mfu": "—", "mem": "—"}
    bench = {"figures": {"world_size": 2, "runs": [
        {"recipe": "rayft", "workload": "random", "status": "ok", "tokens_per_s_per_gpu": 40827.3, "mfu": 0.426, "peak_mem_gib": 44.25},
        {"recipe": "sample-recipe", "workload": "random", "status": "failed: exit 124 (time limit 35 s)",
         "tokens_per_s_per_gpu": None, "mfu": None, "peak_mem_gib": None}]}}
    assert row_figures(bench, "rayft/random", "e") == {"gpus": "2×", "tps": "40,827", "mfu": "42.6%", "mem": "44.2 GiB"}
    assert row_figures(bench, "sample-recipe/random", "e")["tps"] == "failed: exit 124 (time limit 35 s)"
    fabric = {"figures": {"tokens_per_s_ratio_fast_over_sockets": 4.971, "runs": {
        "fast": {"median_tokens_per_s_per_gpu": 33032.2, "world_size": 2}, "sockets": {"median_tokens_per_s_per_gpu": 6644.9}}}}
    assert row_figures(fabric, None, "e")["tps"] == "33,032 vs 6,645 (4.97×)"


def test_what_a_row_asks_for_must_be_in_its_file():
    matrix = {"figures": {"rows": [{"name": "a", "gpus": 1, "tokens_per_s_per_gpu": 1.0}]}}
    with pytest.raises(ReadmeTableError, match=r"rows.yaml entry 3: select='zz' is not a row of this speed matrix \(rows: a\)"):
        row_figures(matrix, "zz", "rows.yaml entry 3")
    bench = {"figures": {"world_size": 2, "runs": [{"recipe": "rayft", "workload": "real", "status": "ok"}]}}
    with pytest.raises(ReadmeTableError, match=r"select='rayft/random' is not a run of this bench \(runs: rayft/real\)"):
        row_figures(bench, "rayft/random", "e")
    with pytest.raises(ReadmeTableError, match=r"e: not a results file this table knows \(figures: rows_per_s\)"):
        row_figures({"figures": {"rows_per_s": 3}}, None, "e")
    with pytest.raises(ReadmeTableError, match="has no 'figures' object"):
        row_figures({"command": "x"}, None, "e")


def test_bad_rows_files_name_the_entry(tmp_path):
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"date": "2026-11-30T00:00:00", "figures": {"median_tokens_per_s_per_gpu": 5.0, "world_size": 1}}))
    rows = tmp_path / "bench" / "rows.yaml"
    rows.parent.mkdir()
    rows.write_text("- {job: a, file: r.json}\n- {job: b, fil: r.json}\n")
    with pytest.raises(ReadmeTableError, match=r"rows.yaml entry 1: needs 'job' and 'file'"):
        render_table(rows, tmp_path)
    rows.write_text("- {job: a, file: missing.json}\n")
    with pytest.raises(ReadmeTableError, match=r"entry 0: missing.json: .*No such file"):
        render_table(rows, tmp_path)
    rows.write_text("{}\n")
    with pytest.raises(ReadmeTableError, match="expected a non-empty list of rows"):
        render_table(rows, tmp_path)


def test_update_writes_between_the_markers_and_check_fails_when_stale(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"figures": {"median_tokens_per_s_per_gpu": 5.0, "world_size": 1}}))
    rows = tmp_path / "bench" / "rows.yaml"
    rows.parent.mkdir()
    rows.write_text("- {job: tiny, file: r.json, label: r}\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    res = CliRunner().invoke(app, ["bench", "readme", "--readme", str(readme), "--rows", str(rows), "--check"])
    assert res.exit_code == 1 and "differs from the results files" in res.output
    assert "old table" in readme.read_text()  # --check writes nothing
    res = CliRunner().invoke(app, ["bench", "readme", "--readme", str(readme), "--rows", str(rows)])
    assert res.exit_code == 0
    assert readme.read_text() == (f"# x\n\n{BEGIN}\n| job | GPUs | tokens/s/GPU | MFU | peak memory | results file |\n"
                                  "| --- | --- | --- | --- | --- | --- |\n| tiny | 1× | 5 | — | — | [r](r.json) |\n"
                                  f"{END}\n\nafter\n")
    assert update_readme(readme, rows, check=True) is True
    readme.write_text("no markers\n")
    res = CliRunner().invoke(app, ["bench", "readme", "--readme", str(readme), "--rows", str(rows)])
    assert res.exit_code == 1 and "needs the lines" in res.output

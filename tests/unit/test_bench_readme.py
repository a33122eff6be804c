"""`rayft bench readme`: the README's performance table comes from bench/results, and stays so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.benchmarks.readme import BEGIN, END, ReadmeTableError, render_table, row_figures, update_readme
from rayft.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_what_the_results_files_say():
    # fails when a results file or the README is edited without `rayft bench readme`
    assert update_readme(ROOT / "README.md", ROOT / "bench" / "readme_table.yaml", check=True), (
        "README.md's performance table is out of date: run `rayft bench readme`"
    )


def test_every_kind_of_results_file():
    record = {"figures": {"median_tokens_per_s_per_gpu": 43271.99, "median_mfu": 0.41091, "peak_mem_gib": 44.256, "world_size": 2}}
    assert row_figures(record, None, "e") == {"gpus": "2×", "tps": "43,272", "mfu": "41.1%", "mem": "44.3 GiB"}
    matrix = {
        "figures": {
            "rows": [
                {"name": "a", "gpus": 1, "tokens_per_s_per_gpu": 1000.4, "mfu": 0.5, "peak_mem_gib": 10.0},
                {"name": "b", "gpus": 1, "tokens_per_s_per_gpu": 2000.6, "mfu": None, "peak_mem_gib": None},
            ]
        }
    }
    assert row_figures(matrix, "b", "e") == {"gpus": "1×", "tps": "2,001", "mfu": "—", "mem": "—"}
    bench = {
        "figures": {
            "world_size": 2,
            "runs": [
                {
                    "recipe": "rayft",
                    "workload": "random",
                    "status": "ok",
                    "tokens_per_s_per_gpu": 40827.3,
                    "mfu": 0.426,
                    "peak_mem_gib": 44.25,
                },
                # a failed run as `rayft bench train` writes it: status "failed", the reason in "error"
                {
                    "recipe": "sample-recipe",
                    "workload": "random",
                    "status": "failed",
                    "error": "exit 124 (time limit 35 s)\n    log tail",
                    "tokens_per_s_per_gpu": None,
                    "mfu": None,
                    "peak_mem_gib": None,
                },
                {"recipe": "trl-best", "workload": "random", "status": "skipped: no time left"},
            ],
        }
    }
    assert row_figures(bench, "rayft/random", "e") == {"gpus": "2×", "tps": "40,827", "mfu": "42.6%", "mem": "44.2 GiB"}
    assert row_figures(bench, "sample-recipe/random", "e")["tps"] == "failed: exit 124 (time limit 35 s)"
    assert row_figures(bench, "trl-best/random", "e") == {"gpus": "2×", "tps": "skipped: no time left", "mfu": "—", "mem": "—"}
    fabric = {
        "figures": {
            "tokens_per_s_ratio_fast_over_sockets": 4.971,
            "runs": {"fast": {"median_tokens_per_s_per_gpu": 33032.2, "world_size": 2}, "sockets": {"median_tokens_per_s_per_gpu": 6644.9}},
        }
    }
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
    with pytest.raises(ReadmeTableError, match="e: no field 'figures'"):
        row_figures({"command": "x"}, None, "e")


RECORD = {"figures": {"median_tokens_per_s_per_gpu": 5.0, "world_size": 1}}


@pytest.mark.parametrize(
    "rows, doc, message",
    [
        ("- {job: a, file: 3}", RECORD, r"entry 0: field 'file' must be str, got 3"),
        ("- {job: a, file: r.json, select: [x]}", RECORD, r"entry 0: field 'select' must be str or null, got \['x'\]"),
        ("- {job: [a], file: r.json}", RECORD, r"field 'job' must be str"),
        ("- {job: a, file: r.json}", [1, 2], r"entry 0 \(r.json\): expected an object, got list"),
        (
            "- {job: a, file: r.json}",
            {"figures": {"median_tokens_per_s_per_gpu": "fast", "world_size": 1}},
            r"entry 0 \(r.json\): field 'median_tokens_per_s_per_gpu' must be a number, got 'fast'",
        ),
        (
            "- {job: a, file: r.json}",
            {"figures": {"median_tokens_per_s_per_gpu": 5.0, "world_size": 1, "median_mfu": "x"}},
            r"field 'median_mfu' must be a number or null, got 'x'",
        ),
        ("- {job: a, file: r.json}", {"figures": {"median_tokens_per_s_per_gpu": 5.0}}, r"entry 0 \(r.json\): no field 'world_size'"),
        ("- {job: a, file: r.json}", {"figures": {"median_tokens_per_s_per_gpu": True, "world_size": 1}}, r"must be a number, got True"),
        ("- {job: a, file: r.json, select: x}", {"figures": {"rows": 3}}, r"field 'rows' must be list, got 3"),
        ("- {job: a, file: r.json, select: x}", {"figures": {"rows": [1]}}, r"figures.rows\[0\]: expected an object, got int"),
        (
            "- {job: a, file: r.json, select: x}",
            {"figures": {"rows": [{"name": "x", "tokens_per_s_per_gpu": 1}]}},
            r"row 'x': no field 'gpus'",
        ),
        (
            "- {job: a, file: r.json, select: a/b}",
            {"figures": {"world_size": 1, "runs": [3]}},
            r"figures.runs\[0\]: expected an object, got int",
        ),
        (
            "- {job: a, file: r.json, select: a/b}",
            {"figures": {"world_size": 1, "runs": [{"workload": "b"}]}},
            r"figures.runs\[0\]: no field 'recipe'",
        ),
        ("- {job: a, file: r.json}", {"figures": {"tokens_per_s_ratio_fast_over_sockets": 5.0}}, r"no field 'runs'"),
        (
            "- {job: a, file: r.json}",
            {
                "figures": {
                    "tokens_per_s_ratio_fast_over_sockets": 5.0,
                    "runs": {
                        "fast": {"median_tokens_per_s_per_gpu": None, "world_size": 2},
                        "sockets": {"median_tokens_per_s_per_gpu": 1.0},
                    },
                }
            },
            r"runs.fast: field 'median_tokens_per_s_per_gpu' must be a number, got None",
        ),
        (
            "- {job: a, file: r.json, select: x}",
            {"figures": {"tokens_per_s_ratio_fast_over_sockets": 5.0, "runs": {}}},
            r"select='x' given, but a fabric results file has one row",
        ),
        ("- {job: a, file: r.json}", b"\xff\xfe{}", r"entry 0: r.json: 'utf-8' codec can't decode"),
        ("- {job: a, file: r.json}", b"{nope", r"entry 0: r.json: not JSON"),
    ],
)
def test_malformed_rows_and_results_give_one_line_errors(tmp_path, rows, doc, message):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "rows.yaml").write_text(rows + "\n")
    (tmp_path / "r.json").write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    with pytest.raises(ReadmeTableError, match=message):
        render_table(tmp_path / "bench" / "rows.yaml", tmp_path)
    # and the command says it in one line, exit 1, no traceback
    readme = tmp_path / "README.md"
    readme.write_text(f"{BEGIN}\n{END}\n")
    res = CliRunner().invoke(app, ["bench", "readme", "--readme", str(readme), "--rows", str(tmp_path / "bench" / "rows.yaml")])
    assert res.exit_code == 1 and res.output.startswith("error: ") and isinstance(res.exception, SystemExit)


@pytest.mark.parametrize(
    "text, message",
    [
        (f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n", "once each"),
        (f"{END}\n{BEGIN}\n", "in that order"),
        (f"{BEGIN} trailing text\n{END}\n", r"marker text inside other lines: \[1\]"),
        (f"{BEGIN}\n{END}\nsee {BEGIN} above\n", r"marker text inside other lines: \[3\]"),
    ],
)
def test_readme_markers_must_be_unique_lines_in_order(tmp_path, text, message):
    (tmp_path / "r.json").write_text(json.dumps(RECORD))
    rows = tmp_path / "bench" / "rows.yaml"
    rows.parent.mkdir()
    rows.write_text("- {job: a, file: r.json}\n")
    readme = tmp_path / "README.md"
    readme.write_text(text)
    with pytest.raises(ReadmeTableError, match=message):
        update_readme(readme, rows)
    assert readme.read_text() == text
    with pytest.raises(ReadmeTableError, match="No such file"):
        update_readme(tmp_path / "missing.md", rows)


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
    assert readme.read_text() == (
        f"# x\n\n{BEGIN}\n| job | GPUs | tokens/s/GPU | MFU | peak memory | results file |\n"
        "| --- | --- | --- | --- | --- | --- |\n| tiny | 1× | 5 | — | — | [r](r.json) |\n"
        f"{END}\n\nafter\n"
    )
    assert update_readme(readme, rows, check=True) is True
    readme.write_text("no markers\n")
    res = CliRunner().invoke(app, ["bench", "readme", "--readme", str(readme), "--rows", str(rows)])
    assert res.exit_code == 1 and "needs the lines" in res.output
    rows.write_text("- {job: 'a | b', file: r.json, label: 'r|1'}\n")  # a column separator in a cell is escaped
    assert render_table(rows, tmp_path).splitlines()[-1] == "| a \\| b | 1× | 5 | — | — | [r\\|1](r.json) |"

"""The `rayft` console script's entry (rayft.cli.run)."""

from __future__ import annotations

import gc
import sys
import tomllib
from pathlib import Path

import pytest

from rayft import __version__, cli


def test_console_script_is_run():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["rayft"] == "rayft.cli:run"


@pytest.mark.parametrize("argv,code", [(["--version"], 0), (["no-such-verb"], 2)])
def test_run_exits_with_the_apps_code_and_freezes_what_is_alive(monkeypatch, capsys, argv, code):
    monkeypatch.setattr(sys, "argv", ["rayft", *argv])
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit) as e:
            cli.run()
        assert e.value.code == code
        assert gc.get_freeze_count() > 0  # the exit's collection skips them
    finally:
        gc.unfreeze()  # this test process goes on collecting as before
    if code == 0:
        assert __version__ in capsys.readouterr().out


def test_the_cli_loads_without_the_frameworks_and_the_benchmarks():
    """Every `rayft` command pays the CLI's imports: the options of every verb load, their work
    does not (torch, transformers and Ray where a command needs them; the benchmarks' modules and
    numpy when `rayft bench` runs)."""
    import subprocess

    heavy = ("numpy", "torch", "transformers", "ray", "rayft.benchmarks.train", "rayft.benchmarks.fabric", "rayft.benchmarks.train_results")
    code = f"import sys, rayft.cli; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_an_error_prints_its_brackets_as_text_and_rays_colours_decoded(capsys):
    from rayft.commands import common

    common.print_error("error", RuntimeError("training failed: \x1b[36mray::execute()\x1b[39m (pid=1) [/a/b.cc:5] [bold]x"))
    assert capsys.readouterr().err == "error: training failed: ray::execute() (pid=1) [/a/b.cc:5] [bold]x\n"
    common.print_error("error", OSError("line one\r\nline two"))  # CRLF text, as some services answer
    assert capsys.readouterr().err == "error: line one\nline two\n"
    common.print_error("error", RuntimeError("\x1b[31mred\x1b[0m\r\nnext"))
    assert capsys.readouterr().err == "error: red\nnext\n"


@pytest.mark.parametrize("failure", [SystemExit(1), BrokenPipeError(32, "Broken pipe"), None])
def test_a_stopped_runs_exit_status_survives_a_console_that_fails_to_say_why(failure):
    """`rayft train`'s exit after a stop or an error (commands.train.leave): the status is the run's
    (143 for a SIGTERM) whether or not its line could be printed (rich raises SystemExit(1) on a
    closed pipe)."""
    import typer

    from rayft.commands.train import leave

    said = []

    def tell():
        said.append(True)
        if failure is not None:
            raise failure

    with pytest.raises(typer.Exit) as e:
        leave(143, tell)
    assert e.value.exit_code == 143 and said == [True]

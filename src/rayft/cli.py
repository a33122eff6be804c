"""The `rayft` command line: the app, and each verb from its module in :mod:`rayft.commands`."""

from __future__ import annotations

import gc
import sys
from typing import Annotated

import typer

from rayft import __version__
from rayft.commands import (
    bench,
    chat,
    checkpoint,
    cluster,
    config,
    data,
    doctor,
    evaluate,
    export,
    fit,
    generate,
    manifest,
    models,
    plot,
    stop,
    submit,
    train,
)
from rayft.commands.help_format import hide_flag_types

app = typer.Typer(
    name="rayft",
    help="Full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
hide_flag_types()


def show_version(value: bool) -> None:
    if value:
        typer.echo(f"rayft {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="Print rayft's version and exit.")
    ] = False,
) -> None:
    """Full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train."""


app.command("train")(train.train)
app.command("export")(export.export)
app.command("eval")(evaluate.evaluate)
app.command("chat")(chat.chat)
app.command("generate")(generate.generate)
app.command("plot")(plot.plot)
app.command("manifest")(manifest.manifest)
app.command("capacity")(cluster.capacity)
app.command("submit")(submit.submit)
app.command("doctor")(doctor.doctor)
app.command("stop")(stop.stop)
app.command("models")(models.models)
app.command("fit")(fit.fit)
app.add_typer(config.config_app, name="config")
app.add_typer(checkpoint.checkpoint_app, name="checkpoint")  # verify
app.add_typer(cluster.cluster_app, name="cluster")  # plan, up, status, down, and local (rayft.commands.cluster_local)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(data.data_app, name="data")  # check, prepare


def run() -> None:
    """The ``rayft`` command (the console script): the app, then an exit without the interpreter's
    last pass over every live object. At exit CPython collects garbage once more before it tears
    the modules down; with torch, transformers and Ray loaded the end took 1.35 s on the 2-core
    development machine, 0.28 s after ``gc.freeze()`` (bench/results/2026-12-04-driver-start-exit-2cpu.json). Nothing is
    skipped that a command relies on: the commands close what they open, and the ``atexit``
    handlers still run. After a command that succeeded with an embedded Ray it started (`rayft
    train`), the process ends without Ray's 1.5-2 s shutdown
    (:func:`rayft.train.ray_cluster.end_embedded_ray_for_the_exit`)."""
    try:
        app()
    except SystemExit as e:
        if e.code in (0, None) and "ray" in sys.modules:
            from rayft.commands.train import exit_now
            from rayft.train.ray_cluster import end_embedded_ray_for_the_exit

            if end_embedded_ray_for_the_exit():
                exit_now(0)
        raise
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    run()

"""The `rayft bench` command group: side-by-side benchmarks that write results files."""

from __future__ import annotations

import typer

from rayft.benchmarks import fabric, readme, train


def register(app: typer.Typer) -> None:
    """Add the ``bench`` group and its commands to the rayft CLI."""
    bench_app = typer.Typer(help="Side-by-side benchmarks writing bench/results/.", no_args_is_help=True)
    fabric.register(bench_app)
    train.register(bench_app)
    readme.register(bench_app)
    app.add_typer(bench_app, name="bench")

"""The `rayft` command line: one thin command per verb (parse, load config, call one function)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from rayft.config import ConfigError, dump_config, load_config

app = typer.Typer(
    name="rayft",
    help="Full-parameter fine-tuning of open LLMs with FSDP2 through Ray Train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)
app.add_typer(config_app, name="config")

console = Console(stderr=True, soft_wrap=True)  # long paths and messages stay on one line (copy-pasteable)

ConfigArg = Annotated[Path, typer.Argument(help="The job's YAML config file.")]
SetOpt = Annotated[
    Optional[list[str]], typer.Option("--set", "-s", help="Override a key, e.g. --set train.max_steps=100 (repeatable).")
]


def _error(label: str, err: BaseException) -> None:
    """Print an error without interpreting its text as Rich markup (paths like ``[/a/b.cc:5]``)."""
    console.print(Text.assemble((label, "bold red"), ": ", str(err)), highlight=False)


def _load(path: Path, overrides: list[str] | None):
    try:
        return load_config(path, overrides or [])
    except ConfigError as e:
        _error("config error", e)
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(config: ConfigArg, set_: SetOpt = None) -> None:
    """Print the resolved config (defaults filled in, overrides applied)."""
    cfg = _load(config, set_)
    sys.stdout.write(dump_config(cfg))


@app.command()
def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[
        Optional[str], typer.Option(help="Continue a stopped run: its name or run directory.")
    ] = None,
) -> None:
    """Fine-tune: connect to Ray (RAY_ADDRESS / ray.address) or start an embedded local Ray, then train."""
    cfg = _load(config, set_)
    from rayft.train.driver import TrainError, run_training

    try:
        run_training(cfg, resume=resume, console=console)
    except TrainError as e:
        _error("error", e)
        raise typer.Exit(1) from None


@app.command()
def export(
    run: Annotated[str, typer.Argument(help="Run directory (storage_path/name).")],
    step: Annotated[Optional[int], typer.Option(help="Checkpoint step (default: latest complete).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: RUN/hf-stepN, N the checkpoint's step).")] = None,
) -> None:
    """Write a consolidated Hugging Face model (safetensors + config + tokenizer) from a checkpoint."""
    from rayft.train.checkpoint import CheckpointError, export_run

    try:
        path = export_run(run, step=step, out=out)
    except CheckpointError as e:
        _error("error", e)
        raise typer.Exit(1) from None
    console.print(f"exported Hugging Face model to {path}")


def _register_optional() -> None:
    """Attach the verbs that live in their own modules (cluster, manifests, NCCL doctor, bench)."""
    import importlib

    for mod in (
        "rayft.cluster.manifest_cli", "rayft.cluster.aws_cli", "rayft.cluster.local_cli", "rayft.nccl.commands",
        "rayft.benchmarks.cli",
    ):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name == mod:
                continue
            raise
        m.register(app)


_register_optional()

if __name__ == "__main__":  # pragma: no cover
    app()

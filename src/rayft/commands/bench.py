"""`rayft bench fabric|train|table|readme`: thin commands over :mod:`rayft.benchmarks`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from rayft.benchmarks import choices

# The benchmarks' own modules are imported by the command that runs them: every `rayft` command
# loads this module's options at its start, and those imports (numpy, the NCCL doctor, the instance
# catalog) made the CLI's import 0.265 s instead of 0.219 on the 2-core development machine
# (bench/NOTES.md §40).

bench_app = typer.Typer(help="Side-by-side benchmarks writing bench/results/.", no_args_is_help=True)


def _comma_list(values: list[str] | None) -> list[str] | None:
    """``["a,b", "c"]`` → ``["a", "b", "c"]`` (blanks dropped); None when nothing is given."""
    if not values:
        return None
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


@bench_app.command("fabric")
def bench_fabric(
    config: Annotated[Path, typer.Argument(help="The training job's YAML config file.")],
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a key in both runs (repeatable).")] = None,
    mode: Annotated[
        choices.Mode,
        typer.Option(help="onehost: NVLink vs NCCL_P2P_DISABLE+NCCL_SHM_DISABLE; efa: EFA vs NCCL_NET=Socket.", case_sensitive=False),
    ] = choices.Mode.ONEHOST,
    steps: Annotated[int | None, typer.Option(min=2, help="Optimizer steps per run (default: train.max_steps, else 30).")] = None,
    skip_steps: Annotated[int, typer.Option(min=0, help="Leading steps left out of the tokens/s median.")] = 3,
    out: Annotated[Path | None, typer.Option(help="Results file (default bench/results/<date>-fabric-<N>x<gpu>.json).")] = None,
    logs_dir: Annotated[Path | None, typer.Option(help="Where the runs' logs go (default <storage_path>/fabric-<time>-logs).")] = None,
    sweep_max_mib: Annotated[int | None, typer.Option(min=1, help="Largest collective message in MiB (default 1024 on GPUs).")] = None,
    timeout_s: Annotated[int | None, typer.Option(min=1, help="Time limit per run, in seconds.")] = None,
) -> None:
    """Train CONFIG twice, over the fast interconnect and over TCP sockets, and compare.

    Each run's NCCL log is checked with the doctor (fast: NVLink or EFA; sockets: NET/Socket);
    a run that used another transport is rejected (exit 1). Writes a results file and prints a
    Markdown table: tokens/s/GPU of each run, their ratio, and the collectives' bus bandwidth.
    """
    from rayft.benchmarks import fabric as fabric_bench

    console = Console(stderr=True)
    try:
        path, figures = fabric_bench.run_fabric(
            config,
            set_,
            mode=mode,
            steps=steps,
            out=out,
            logs_dir=logs_dir,
            skip_steps=skip_steps,
            sweep_max_bytes=sweep_max_mib * 2**20 if sweep_max_mib else None,
            timeout_s=timeout_s,
            console=console,
        )
    except fabric_bench.FabricError as e:
        console.print(Text.assemble(("error", "bold red"), ": ", str(e)), highlight=False)
        raise typer.Exit(1) from None
    sys.stdout.write(fabric_bench.markdown_table(figures) + "\n")
    console.print(f"results: {path}", highlight=False, markup=False)


@bench_app.command("train")
def bench_train(
    config: Annotated[Path, typer.Argument(help="The training job's YAML config (model, data, seq_len, micro-batch, workers).")],
    recipes: Annotated[str, typer.Option(help=f"Comma-separated, from {','.join(choices.RECIPES)}.")] = ",".join(choices.DEFAULT_RECIPES),
    workload: Annotated[str, typer.Option(help="random, real or both.")] = "both",
    steps: Annotated[int, typer.Option(min=2, help="Optimizer steps per run.")] = choices.DEFAULT_STEPS,
    warmup_steps: Annotated[int, typer.Option(min=0, help="Leading steps left out of every figure.")] = choices.DEFAULT_WARMUP,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override a config key (repeatable).")] = None,
    rayft_set: Annotated[
        list[str] | None,
        typer.Option("--rayft-set", help="Override a config key for the rayft recipes only, e.g. train.micro_batch_size=16 (repeatable)."),
    ] = None,
    trl_compile: Annotated[
        bool,
        typer.Option("--trl-compile", help="Run the TRL recipes with SFTConfig(torch_compile=True): the Trainer compiles the whole model."),
    ] = False,
    out: Annotated[Path | None, typer.Option(help="Results JSON (default bench/results/<date>-train-<model>-<N>x<gpu>.json).")] = None,
    work_dir: Annotated[Path | None, typer.Option(help="Shared inputs, runs and logs (default <storage_path>/bench-train-<time>).")] = None,
    timeout_s: Annotated[
        str | None,
        typer.Option(help="Time limit per run, seconds: one number for all runs, or per recipe as rayft=200,trl-default=120,..."),
    ] = None,
    deadline_s: Annotated[
        float | None,
        typer.Option(
            min=1,
            help="Time budget of the whole benchmark, seconds: each run is cut to what is left (less 10 s); runs that cannot fit are skipped.",
        ),
    ] = None,
    usd_per_gpu_hour: Annotated[float | None, typer.Option(min=0, help="Price per GPU-hour instead of the catalog's.")] = None,
    instance: Annotated[str | None, typer.Option(help="EC2 instance type whose catalog price is used.")] = None,
    ceiling_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="On GPUs, seconds of bf16 products first: the card's sustained matrix rate, each run's share of it (0: skip).",
        ),
    ] = choices.DEFAULT_CEILING_S,
) -> None:
    """Train CONFIG with several recipes on identical data, model and GPUs; write results, table and chart."""
    from rayft.benchmarks import train as train_bench
    from rayft.benchmarks import train_results

    console = Console(stderr=True)
    if workload not in ("random", "real", "both"):
        console.print(Text.assemble(("error", "bold red"), f": --workload {workload}: choose random, real or both"))
        raise typer.Exit(2)
    try:
        path, figures = train_bench.run_bench(
            config,
            set_,
            _comma_list([recipes]),
            list(choices.WORKLOADS) if workload == "both" else [workload],
            steps,
            warmup_steps,
            out,
            work_dir,
            train_bench.parse_timeouts(timeout_s),
            usd_per_gpu_hour,
            instance,
            console,
            deadline_s=deadline_s,
            rayft_overrides=rayft_set,
            ceiling_s=ceiling_s,
            trl_compile=trl_compile,
        )
    except train_bench.BenchInterrupted as e:
        console.print(Text.assemble(("interrupted", "bold red"), ": ", str(e)), highlight=False)
        raise typer.Exit(130) from None
    except train_results.BenchTrainError as e:
        console.print(Text.assemble(("error", "bold red"), ": ", str(e)), highlight=False)
        raise typer.Exit(1) from None
    sys.stdout.write(path.with_suffix(".md").read_text())
    console.print(f"results: {path}", highlight=False, markup=False)
    if any(r["status"] != "ok" for r in figures["runs"]):
        raise typer.Exit(1)


@bench_app.command("table")
def bench_table(results: Annotated[list[Path], typer.Argument(help="Results JSON files of `rayft bench train`.")]) -> None:
    """Regenerate the Markdown table (and PNG chart) beside each results file; print the tables.
    A file that cannot be read is reported and skipped; the others are still written (exit 1)."""
    from rayft.benchmarks import train_results

    console = Console(stderr=True)
    failed = []
    for r in results:
        try:
            md, png = train_results.write_table_files(r, console)
        except (OSError, KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError) as e:
            console.print(
                Text.assemble(("error", "bold red"), f": {r}: not a `rayft bench train` results file ({type(e).__name__}: {str(e)[:300]})"),
                highlight=False,
            )
            failed.append(r)
            continue
        sys.stdout.write(md.read_text() + "\n")
        console.print(f"wrote {md}" + (f" and {png}" if png else ""), highlight=False, markup=False)
    if failed:
        console.print(
            f"{len(failed)} of {len(results)} results files not tabulated: {', '.join(map(str, failed))}", highlight=False, markup=False
        )
        raise typer.Exit(1)


@bench_app.command("readme")
def bench_readme(
    readme: Annotated[Path, typer.Option(help="The README holding the table markers.")] = Path("README.md"),
    rows: Annotated[Path, typer.Option(help="YAML list of rows: job, file, select, label.")] = Path("bench/readme_table.yaml"),
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 when the README's table is out of date.")] = False,
) -> None:
    """Regenerate the README's performance table from the results files in bench/results."""
    from rayft.benchmarks import readme as readme_table

    console = Console(stderr=True)
    try:
        same = readme_table.update_readme(readme, rows, check=check)
    except readme_table.ReadmeTableError as e:
        console.print(Text.assemble(("error", "bold red"), f": {e}"), highlight=False)
        raise typer.Exit(1) from None
    if same:
        console.print(f"{readme}: the table is up to date", highlight=False, markup=False)
    elif check:
        console.print(f"{readme}: the table differs from the results files; run `rayft bench readme`", highlight=False, markup=False)
        raise typer.Exit(1)
    else:
        console.print(f"{readme}: table rewritten from {rows}", highlight=False, markup=False)

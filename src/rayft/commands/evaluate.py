"""`rayft eval`: a run's model (or any HF directory) scored on lm-evaluation-harness tasks
(:mod:`rayft.evals.harness`), the results written into the run directory and shown as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import console, fail, say


def _batch_size(value: str) -> int | str:
    if value == "auto" or (value.isdigit() and int(value) > 0):
        return value if value == "auto" else int(value)
    raise typer.BadParameter(f"{value!r}: give a positive integer or auto")


def evaluate(
    target: Annotated[
        str, typer.Argument(help="Run directory (its hf/ export, or a checkpoint with --step) or a Hugging Face model directory.")
    ],
    tasks: Annotated[str, typer.Option(help="Comma-separated lm-eval task names (rayft_sums runs offline).")],
    limit: Annotated[Optional[int], typer.Option(min=1, help="At most N documents per task.")] = None,
    batch_size: Annotated[str, typer.Option(help="Documents per forward pass, or auto.")] = "8",
    step: Annotated[Optional[int], typer.Option(help="Evaluate this checkpoint step (exported to a temporary directory).")] = None,
    num_fewshot: Annotated[Optional[int], typer.Option(min=0, help="Few-shot examples per prompt (default: each task's own).")] = None,
    include_path: Annotated[Optional[list[Path]], typer.Option(help="A directory of your own lm-eval YAML tasks (repeatable).")] = None,
    device: Annotated[Optional[str], typer.Option(help="cuda, cuda:1, cpu… (default: the first GPU, else the CPU).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Results directory (default: RUN/eval, or HF_DIR/eval).")] = None,
) -> None:
    """Score a model on lm-evaluation-harness tasks; write eval/<UTC time>.json (+ .samples.jsonl) and print a table."""
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        fail("--tasks: give at least one task name, e.g. --tasks rayft_sums,hellaswag", code=2)
    bs = _batch_size(batch_size)
    from rayft.evals import EvalError
    from rayft.evals.harness import evaluate_model, results_home, results_rows, write_results
    from rayft.infer.model_dir import InferError, model_dir

    try:
        run_dir, at_step = results_home(Path(target), step) if Path(target).is_dir() else (None, step)
        with model_dir(target, step, say=say) as path:
            say(f"evaluating {path}{f' (step {at_step})' if at_step is not None else ''} on {', '.join(names)}")
            results = evaluate_model(
                path,
                names,
                limit=limit,
                batch_size=bs,
                num_fewshot=num_fewshot,
                include_paths=[str(p) for p in include_path or []],
                device=device,
                say=say,
            )
            meta = {"target": str(target), "model_dir": str(path), "step": at_step, "tasks": names, "limit": limit}
            saved = write_results(results, out or (run_dir or Path(path)) / "eval", meta)
    except (EvalError, InferError) as e:
        fail(str(e))
    from rich.table import Table

    table = Table(title=f"rayft eval: {target}" + (f" (step {at_step})" if at_step is not None else ""))
    for col, justify in (("task", "left"), ("documents", "right"), ("metric", "left"), ("value", "right"), ("± stderr", "right")):
        table.add_column(col, justify=justify)
    for task, n, metric, value, err in results_rows(results):
        table.add_row(task, "" if n is None else str(n), metric, f"{value:.4f}", "" if err is None else f"{err:.4f}")
    console.print(table)
    say(f"results: {saved}")

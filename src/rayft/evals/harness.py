"""A Hugging Face model directory scored on lm-evaluation-harness tasks (the ``lm-eval`` package,
its ``HFLM`` model class), the results written as JSON and shown as a table.

Tasks are named as lm-eval names them (``hellaswag``, ``arc_easy``, groups and tags too), or are
rayft's own (:data:`OWN_TASKS`: YAML configs in ``rayft/evals/tasks`` beside their JSONL data,
which run offline), or come from YAML files in ``include_paths`` (lm-eval's ``--include_path``).
lm-eval's ~15,000 task configs are indexed (seconds) only when a name is found in neither of
the last two. A task whose dataset must come from the Hugging Face hub fails, when the hub cannot
be reached, with an error naming the task and its dataset (``HF_HUB_OFFLINE=1`` makes that
immediate and lets cached datasets run).
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import logging
from pathlib import Path
from typing import Any, Callable

import yaml

from rayft.evals import EvalError

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
#: rayft's own offline tasks: name → YAML config
OWN_TASKS = {p.stem: p for p in sorted(TASKS_DIR.glob("*.yaml"))}


def own_task_config(path: Path) -> dict[str, Any]:
    """An own task's config, its relative ``dataset_kwargs.data_files`` resolved against the
    YAML's directory (lm-eval reads them against the current directory)."""
    cfg = yaml.safe_load(path.read_text())
    files = cfg.get("dataset_kwargs", {}).get("data_files")
    if isinstance(files, dict):
        cfg["dataset_kwargs"]["data_files"] = {k: str(path.parent / v) for k, v in files.items()}
    return cfg


def _load_error(name: str, dataset: str | None, err: Exception) -> EvalError:
    """The error for a task that failed to load: a download that failed, or another cause."""
    text = f"{type(err).__name__}: {err}"
    offline = isinstance(err, ConnectionError) or any(
        w in text for w in ("Couldn't reach", "OfflineModeIsEnabled", "LocalEntryNotFound", "Name or service not known", "ConnectTimeout")
    )
    if offline:
        own = ", ".join(OWN_TASKS)
        return EvalError(
            f"task {name}: its dataset{' ' + dataset if dataset else ''} must be downloaded from the Hugging Face hub, which "
            f"cannot be reached ({text}). Offline, run a task whose data is local (rayft's own: {own}; or YAML tasks in "
            "--include-path over local files), or one whose dataset is already in the Hugging Face cache with HF_HUB_OFFLINE=1"
        )
    return EvalError(f"task {name}: cannot be loaded ({text})")


def load_tasks(names: list[str], include_paths: list[str], say: Callable[[str], None]) -> tuple[Any, list[Any]]:
    """lm-eval's ``TaskManager`` and the loaded ``Task``/``Group`` objects of ``names`` (their
    datasets read or downloaded here, one task at a time, so a failure names its task).

    Raises:
        EvalError: an unknown task name (with the closest known ones), or a task that cannot be
            loaded (a download from the hub that failed: offline).
    """
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise EvalError(f"rayft eval needs lm-evaluation-harness: pip install 'rayft[eval]' ({e})") from None

    for p in include_paths:
        if not Path(p).is_dir():
            raise EvalError(f"--include-path {p}: no such directory")
    tm = TaskManager(include_path=include_paths or None, include_defaults=False)
    if any(n not in OWN_TASKS and n not in tm.all_tasks for n in names):
        say("indexing lm-eval's task configs…")
        tm = TaskManager(include_path=include_paths or None)
    unknown = [n for n in names if n not in OWN_TASKS and n not in tm.all_tasks]
    if unknown:
        known = [*OWN_TASKS, *tm.all_tasks]
        hints = [f"{n!r}" + (f" (did you mean {c[0]!r}?)" if (c := difflib.get_close_matches(n, known, n=1)) else "") for n in unknown]
        raise EvalError(
            f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: see `lm-eval ls tasks`, or rayft's own: {', '.join(OWN_TASKS)}"
        )
    loaded = []
    for n in names:
        spec: Any = own_task_config(OWN_TASKS[n]) if n in OWN_TASKS and n not in tm.all_tasks else n
        try:
            result = tm.load([spec])
        except Exception as e:  # lm-eval and datasets raise many kinds (connection, hub, file, config)
            entry = tm.task_index.get(n)
            config = spec if isinstance(spec, dict) else (entry.cfg if entry is not None and entry.cfg else {})
            raise _load_error(n, config.get("dataset_path"), e) from None
        loaded += [*result["groups"].values()] if result["groups"] else [*result["tasks"].values()]
    return tm, loaded


def evaluate_model(
    model_dir: Path,
    tasks: list[str],
    *,
    limit: int | None = None,
    batch_size: int | str = 8,
    num_fewshot: int | None = None,
    include_paths: list[str] | None = None,
    device: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score the HF model in ``model_dir`` on ``tasks`` (lm-eval's ``simple_evaluate`` with
    ``HFLM``); ``limit``: at most this many documents per task; ``device``: default the first
    GPU (bfloat16) when there is one, else the CPU (float32). Returns lm-eval's results
    (``results``, ``n-samples``, ``configs``, ``samples``…).

    Raises:
        EvalError: see :func:`load_tasks`.
    """
    import torch

    logging.getLogger("lm_eval").setLevel(logging.WARNING)  # its per-task INFO lines; warnings stay
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    tm, loaded = load_tasks(tasks, include_paths or [], say)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    lm = HFLM(pretrained=str(model_dir), device=device, dtype=dtype, batch_size=batch_size)
    return simple_evaluate(model=lm, tasks=loaded, task_manager=tm, limit=limit, num_fewshot=num_fewshot, log_samples=True)


def _summary_steps(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / "rayft_summary.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def results_home(target: Path, step: int | None) -> tuple[Path | None, int | None]:
    """For ``rayft eval TARGET [--step N]``: the run directory the results go into (``target``
    itself, or the run an export ``RUN/hf`` sits in; None for another HF directory) and the
    training step of the weights evaluated, when known (``step``; the run's last step for its
    ``hf`` export; the newest checkpoint's when a run without export is exported on the fly)."""
    from rayft.infer.model_dir import is_hf_dir
    from rayft.train.checkpoint import find_checkpoints

    if not is_hf_dir(target):
        run = target
    elif (target.resolve().parent / "rayft.yaml").is_file():
        run = target.resolve().parent
    else:
        return None, step
    if step is not None:
        return run, step
    if is_hf_dir(run / "hf") and (target == run or target.resolve() == (run / "hf").resolve()):
        return run, _summary_steps(run)
    done = find_checkpoints(run) if target == run else []
    return run, done[-1][0] if done else None


def write_results(results: dict[str, Any], out_dir: Path, meta: dict[str, Any]) -> Path:
    """Write ``out_dir/<UTC time>.json`` (``meta`` — model, step, tasks, limit — and lm-eval's
    results without the per-document samples) and ``<UTC time>.samples.jsonl`` (one line per
    document: ``task`` and lm-eval's sample record); returns the JSON's path."""
    from lm_eval.utils import handle_non_serializable

    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"{stamp}.json"
    n = 1
    while path.exists():  # two evaluations in one second
        path, n = out_dir / f"{stamp}-{n}.json", n + 1
    body = {**meta, **{k: v for k, v in results.items() if k != "samples"}}
    path.write_text(json.dumps(body, indent=2, default=handle_non_serializable))
    with path.with_suffix(".samples.jsonl").open("w") as f:
        for task, samples in results.get("samples", {}).items():
            for s in samples:
                f.write(json.dumps({"task": task, **s}, default=handle_non_serializable) + "\n")
    return path


def results_rows(results: dict[str, Any]) -> list[tuple[str, int | None, str, float, float | None]]:
    """(task, documents scored, metric, value, stderr) for each task and metric of lm-eval's results."""
    rows = []
    for task, metrics in results["results"].items():
        n = results.get("n-samples", {}).get(task, {}).get("effective")
        for key, value in metrics.items():
            metric, comma, _filter = key.partition(",")  # "acc,none": metric, filter; "sample_len", "alias": not metrics
            if not comma or metric.endswith("_stderr") or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            err = metrics.get(f"{metric}_stderr,{_filter}")
            rows.append((task, n, metric, float(value), float(err) if isinstance(err, (int, float)) else None))
    return rows

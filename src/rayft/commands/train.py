"""`rayft train`: load the config, check that its local data files exist, then
:func:`rayft.train.driver.run_training`."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import sys
from typing import Annotated, Callable, NoReturn, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, console, load_config_or_exit, print_error
from rayft.config import RayftConfig


def train(
    config: ConfigArg,
    set_: SetOpt = None,
    resume: Annotated[Optional[str], typer.Option(help="Continue a stopped run: its name or run directory.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Train even when `rayft fit` predicts the GPUs' memory is too small (train.fit_check: off).")
    ] = False,
) -> None:
    """Fine-tune: connect to Ray (RAY_ADDRESS / ray.address) or start an embedded local Ray, then train.

    SIGTERM or Ctrl-C stops at the next step boundary with a checkpoint (checkpoint.on_signal),
    prints the --resume command and exits 143 or 130.
    """
    cfg = load_config_or_exit(config, set_)
    check_local_data_files(cfg, config, set_)
    if force:
        cfg.train.fit_check = "off"
    elif resume is None:  # a resumed run was judged when it started
        check_cluster_fit(cfg, config)
    from rayft.train.driver import TrainError, TrainStopped, run_training

    try:
        run_training(cfg, resume=resume, console=console)
    except TrainError as e:
        leave(1, functools.partial(print_error, "error", e))
    except TrainStopped as e:
        leave(e.exit_code, functools.partial(tell_stopped, e, config, set_), forced=e.forced)


def tell_stopped(e, config: str | os.PathLike[str], set_: list[str] | None) -> None:
    """Print a stopped run's line (``e``: a :class:`~rayft.train.errors.TrainStopped`), then how to
    export it (all its steps done) or resume it (a checkpoint held)."""
    console.print(str(e), highlight=False, markup=False)
    if e.finished:
        console.print(f"export with: {shlex.join(['rayft', 'export', e.run_dir])}", highlight=False, markup=False)
    elif e.checkpoint_step is not None:
        again = ["rayft", "train", str(config), *(a for kv in set_ or [] for a in ("--set", kv)), "--resume", e.run_dir]
        console.print(f"resume with: {shlex.join(again)}", highlight=False, markup=False)


def leave(code: int, tell: Callable[[], None], forced: bool = False) -> NoReturn:
    """Exit with ``code`` after ``tell()`` prints why; where that print fails (a console whose pipe
    was closed) the exit is the same. Where workers called off did not return in time (``forced``,
    :func:`fit_running`) the exit skips Ray's shutdown (:func:`exit_now`)."""
    try:
        tell()
    except (Exception, SystemExit):  # the console failed (rich: SystemExit(1) on a closed pipe): the exit status stays the run's
        pass
    finally:  # a Ctrl-C during the print too
        if forced or fit_running():
            exit_now(code)
    raise typer.Exit(code) from None


def fit_running() -> bool:
    from rayft.train.worker_launch import fit_running

    return fit_running()


def exit_now(code: int) -> None:
    """Exit at once (stdout and stderr flushed), without Ray's shutdown at exit or the interpreter's
    teardown. After a forced stop: the workers may still be running, and Ray's core worker ends the
    process with status 1 when its shutdown lands under ``fit``'s thread
    (:meth:`rayft.train.worker_launch.WorkerLaunch.cancel`); Ray's processes end with this one. After
    a finished run: :func:`rayft.train.ray_cluster.end_embedded_ray_for_the_exit`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a hung-up terminal's flush must not skip the exit
            stream.flush()
    os._exit(code)


def check_cluster_fit(cfg: RayftConfig, config: str | os.PathLike[str]) -> None:
    """With a ``cluster:`` section and GPU workers, judge the config on the instance's GPUs before Ray
    starts (``train.fit_check``; :func:`rayft.train.memory_plan.fit_problem`): refuse (exit 1) or warn."""
    from rayft.train.hub import offline_when_unreachable
    from rayft.train.memory_plan import capped, cluster_gpus, fit_problem

    target = cluster_gpus(cfg)
    if target is None or cfg.train.use_gpu is False or cfg.train.fit_check == "off":
        return
    # the model's config is read here, before the driver's own check: without the Hub, one line
    # instead of huggingface_hub's five retries (23 s)
    offline_when_unreachable([cfg.model.name_or_path], lambda text: console.print(text, highlight=False, markup=False))
    problem = fit_problem(cfg, capped(target, cfg))
    if problem is None:
        return
    level, why = problem
    hint = f"`rayft fit {config}` shows the parts; --force (or train.fit_check: warn) trains anyway"
    if level == "refuse" and cfg.train.fit_check == "refuse":
        print_error("error", ValueError(f"{config}: {why}. {hint}"))
        raise typer.Exit(1)
    console.print(f"warning: {config}: {why}", highlight=False, markup=False)


def check_local_data_files(cfg: RayftConfig, config: str | os.PathLike[str], overrides: list[str] | None = None) -> None:
    """Expand ``data.train_files`` and ``data.validation_files`` that are local paths or globs
    (:func:`rayft.data.sources.expand_files`) before Ray or torch is imported, so a missing file
    fails in a second rather than after Ray has started; ``s3://`` URIs are listed later, with
    the data, like Hugging Face Hub ids. On a :class:`~rayft.data.examples.DataError`, print it and exit 1 (as the same error
    found later would), naming the config file, the key and its line (or ``--set``), and for a
    relative path that matches nothing, where it was looked for: the config file's directory
    (:func:`rayft.config_load.load_config` resolves relative paths there when they exist there), then
    the current directory."""
    from rayft.config_load import where_given
    from rayft.data.examples import DataError
    from rayft.data.sources import expand_files, is_hub_dataset

    def stop(key: str, loc: tuple, e: DataError, note: str = "") -> NoReturn:
        where = where_given(config, ("data", key, *loc), overrides)
        print_error("error", DataError(f"{config}: data.{key}{''.join(f'[{i}]' for i in loc)}{where}: {e}{note}", kind=e.kind))
        raise typer.Exit(1) from None

    for key, patterns in (("train_files", cfg.data.train_files), ("validation_files", cfg.data.validation_files or [])):
        local = [(i, p) for i, p in enumerate(patterns) if not p.startswith("s3://") and not is_hub_dataset(p)]  # read with the data
        for i, p in local:
            try:
                expand_files([p], key=None)
            except DataError as e:
                stop(key, (i,), e, _searched(p, config))
        try:
            expand_files([p for _, p in local], key=f"data.{key}")  # a file listed twice
        except DataError as e:
            stop(key, (), e)


def _searched(pattern: str, config: str | os.PathLike[str]) -> str:
    """Where a relative ``pattern`` that matches nothing was looked for (the config file's
    directory, then the current directory), for the message; ``""`` for any other pattern."""
    import glob

    if "://" in pattern or os.path.isabs(pattern) or os.path.exists(pattern) or glob.glob(pattern):
        return ""
    here, base = os.path.abspath(os.getcwd()), os.path.dirname(os.path.abspath(config))
    if base == here:
        return f" (a relative path: looked for it in {base}, the config file's directory and the current directory)"
    return f" (a relative path: looked for it in {base}, the config file's directory, then in {here}, the current directory)"

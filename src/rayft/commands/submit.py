"""`rayft submit`: a thin command over submit.py (Ray Jobs API, token auth, streamed logs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, fail, load_config_or_exit, say


def submit(
    config: ConfigArg,
    set_: SetOpt = None,
    address: Annotated[
        Optional[str],
        typer.Option(
            help="Dashboard URL: a KubeRay head's http://HOST:8265, or the RAY_ADDRESS that `rayft cluster local up` prints (default: ray.address, then RAY_ADDRESS)."
        ),
    ] = None,
    token_file: Annotated[
        Optional[Path], typer.Option(help="File with the cluster's auth token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ...).")
    ] = None,
    working_dir: Annotated[
        Optional[Path], typer.Option(help="Folder uploaded as the job's working_dir (default: the project root above CONFIG).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Stream the logs until the job ends.")] = True,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List the files the working_dir would upload (one per line), their count and size; submit nothing."),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Upload a working_dir over 100 MB.")] = False,
) -> None:
    """Submit `rayft train CONFIG` to a running Ray cluster (Ray Jobs API, token auth) and stream its logs.

    The working_dir (the project root above CONFIG) leaves out what .gitignore, .rayignore and .rayftignore
    ignore, and secrets (.env*, keys, credentials) always; its file count and size are printed first.
    Exit status is the job's: 0 SUCCEEDED, 1 FAILED or STOPPED. Ctrl-C asks whether to stop the job.
    """
    from rayft.cluster.submit import SubmitError, check_size, describe, package, run
    from rayft.cluster.submit import submit as do_submit

    cfg = load_config_or_exit(config, set_)  # validate locally first: exit 2 on a config error
    if dry_run:
        try:
            pkg, _ = package(config, working_dir)
        except SubmitError as e:
            fail(str(e))
        for f in pkg.files:
            sys.stdout.write(f + "\n")
        say(describe(pkg))
        try:
            check_size(pkg, yes)
        except SubmitError as e:
            say(f"submitting would fail: {e}")
        say("dry run: nothing submitted")
        return
    try:
        client, sub = do_submit(
            config,
            set_ or [],
            cfg.ray.address,
            address=address,
            token_file=token_file,
            working_dir=working_dir,
            say=say,
            yes=yes,
            stop_wait_s=math.ceil(cfg.checkpoint.signal_grace_s) + 5,  # a job stop lets rayft checkpoint before Ray's SIGKILL
        )
    except SubmitError as e:
        fail(str(e))
    say(f"job {sub.job_id} submitted")
    if not wait:
        sys.stdout.write(sub.job_id + "\n")
        return
    code = run(client, sub, confirm=lambda q: typer.confirm(q, default=False, err=True), say=say)
    raise typer.Exit(code)

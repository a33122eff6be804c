"""`rayft submit`: a thin command over submit.py (Ray Jobs API, token auth, streamed logs)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import ConfigArg, SetOpt, fail, load_config_or_exit, say


def submit(
    config: ConfigArg,
    set_: SetOpt = None,
    address: Annotated[
        Optional[str], typer.Option(help="Dashboard URL, e.g. http://127.0.0.1:8265 (default: ray.address, then RAY_ADDRESS).")
    ] = None,
    token_file: Annotated[
        Optional[Path], typer.Option(help="File with the cluster's auth token (default: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ...).")
    ] = None,
    working_dir: Annotated[
        Optional[Path], typer.Option(help="Folder uploaded as the job's working_dir (default: the project root above CONFIG).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Stream the logs until the job ends.")] = True,
) -> None:
    """Submit `rayft train CONFIG` to a running Ray cluster (Ray Jobs API, token auth) and stream its logs.

    Exit status is the job's: 0 SUCCEEDED, 1 FAILED or STOPPED. Ctrl-C asks whether to stop the job.
    """
    from rayft.cluster.submit import SubmitError, run
    from rayft.cluster.submit import submit as do_submit

    cfg = load_config_or_exit(config, set_)  # validate locally first: exit 2 on a config error
    try:
        client, sub = do_submit(
            config, set_ or [], cfg.ray.address, address=address, token_file=token_file, working_dir=working_dir, say=say
        )
    except SubmitError as e:
        fail(str(e))
    say(f"job {sub.job_id} submitted")
    if not wait:
        sys.stdout.write(sub.job_id + "\n")
        return
    code = run(client, sub, confirm=lambda q: typer.confirm(q, default=False, err=True), say=say)
    raise typer.Exit(code)

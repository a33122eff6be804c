"""`rayft stop`: stop the rayft runs of a Ray cluster as a SIGTERM to their drivers would
(:func:`rayft.train.stop.request_stop`); the pods' ``preStop`` hook."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from rayft.commands.common import console, print_error


def stop(
    run: Annotated[Optional[str], typer.Option(help="Only the run with this checkpoint.name (default: every rayft run).")] = None,
    address: Annotated[str, typer.Option(help="The Ray cluster's GCS address (host:port; `auto`: this node's cluster).")] = "auto",
    wait: Annotated[float, typer.Option(help="Seconds to wait for the runs to end (checkpoint, records).")] = 0.0,
    reason: Annotated[str, typer.Option(help="Why, as the runs' summaries will say.")] = "rayft stop",
) -> None:
    """Checkpoint and stop the running rayft runs at their next step boundary (exit 1: some run
    did not end within --wait)."""
    import os

    import ray

    from rayft.cluster.loopback import keep_localhost
    from rayft.train.stop import request_stop

    if os.environ.get("RAY_ADDRESS", "").startswith(("http://", "https://")):
        os.environ.pop("RAY_ADDRESS")  # a dashboard URL (`rayft cluster local up` exports one): ray.init wants the GCS
    try:
        if not ray.is_initialized():
            with keep_localhost():  # a cluster on 127.0.0.1 (rayft's local one) stays there
                ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError) as e:
        print_error("error", f"cannot reach the Ray cluster at {address}: {e}")
        raise typer.Exit(1) from None
    alive = request_stop(reason, run, wait, say=lambda s: console.print(s, highlight=False, markup=False))
    if alive:
        raise typer.Exit(1)

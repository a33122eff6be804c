"""Ray on 127.0.0.1 only: the embedded Ray of `rayft train` and every node of `rayft cluster local`.

Ray binds its gRPC servers (GCS, raylet, object manager, every worker's core worker), its agents
(dashboard agent HTTP and gRPC, runtime-env agent) and the Prometheus metrics export to loopback
only when the node's IP address is exactly ``127.0.0.1``; with any other node IP they listen on all
interfaces (``0.0.0.0``) or on that IP. But on Linux, Ray replaces a ``127.0.0.1`` given as
``--node-ip-address`` / ``_node_ip_address`` (or as the host of a GCS address) with the host's
routable address, unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which Ray reads once, when it
is imported, and which also makes ``ray start --address`` (a worker node) refuse to start.

So:

* :func:`loopback_env` puts ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` into an environment: every Ray
  process started with it (and everything those start: agents, workers, job drivers) keeps
  ``127.0.0.1`` as it is.
* ``python -m rayft.cluster.loopback start ARGS`` is ``ray start ARGS`` that keeps ``127.0.0.1``
  while still allowing worker nodes (``rayft cluster local`` starts every node with it).
* :func:`keep_localhost` wraps ``ray.init`` in a driver process that may have imported Ray already:
  the embedded Ray of ``rayft train``, or joining a cluster at a loopback GCS address.

docs/network.md lists what listens where afterwards; tests/integration/test_loopback.py checks it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

LOOPBACK = "127.0.0.1"
KEEP_LOCALHOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback_address(address: str) -> bool:
    """Whether a Ray address (``host:port``) names this host's loopback: ``127.0.0.1`` or ``localhost``."""
    return address.rsplit(":", 1)[0].strip("[]") in (LOOPBACK, "localhost")


def loopback_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with Ray told to keep 127.0.0.1 as the node IP (for the processes started with it)."""
    env[KEEP_LOCALHOST_ENV] = "0"
    return env


@contextlib.contextmanager
def keep_localhost() -> Iterator[None]:
    """While inside: this process's Ray keeps 127.0.0.1 as it is, and the processes it starts too.

    Sets what Ray read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when it was imported (a module
    constant) and the variable itself (for child processes), and restores both on the way out.
    """
    from ray._private import ray_constants

    saved_env = os.environ.get(KEEP_LOCALHOST_ENV)
    saved_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)  # None: a Ray without it (tests/integration/test_loopback.py tells)
    os.environ[KEEP_LOCALHOST_ENV] = "0"
    if saved_const is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_const is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_const
        if saved_env is None:
            os.environ.pop(KEEP_LOCALHOST_ENV, None)
        else:
            os.environ[KEEP_LOCALHOST_ENV] = saved_env


def ray_start_main(argv: list[str]) -> None:
    """``ray start argv`` keeping 127.0.0.1 as node IP and GCS host, worker nodes allowed.

    This process reads Ray's multi-node default (a worker node's ``ray start`` refuses to run
    without it); the processes it starts get ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; and a
    loopback address given to it stays loopback instead of becoming the host's routable address.
    """
    os.environ.pop(KEEP_LOCALHOST_ENV, None)
    from ray._private import services
    from ray.scripts.scripts import main

    loopback_env(os.environ)  # type: ignore[arg-type]
    resolve = services.resolve_ip_for_localhost

    def keep(host: str) -> str:
        return host if host == LOOPBACK else resolve(host)

    services.resolve_ip_for_localhost = keep
    sys.argv = ["ray", *argv]
    main()


if __name__ == "__main__":  # pragma: no cover (run as `ray start` by rayft cluster local up)
    ray_start_main(sys.argv[1:])

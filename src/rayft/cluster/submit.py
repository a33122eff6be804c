"""`rayft submit CONFIG`: run `rayft train CONFIG` on a running Ray cluster through the Ray Jobs API.

* Address: ``--address``, else ``ray.address`` of the config, else ``RAY_ADDRESS`` — the dashboard
  URL (``http://HOST:8265``); ``host:port`` without a scheme means ``http://``.
* Token (Ray token authentication, Ray >= 2.52): ``--token-file``, else ``RAY_AUTH_TOKEN``, else the
  file at ``RAY_AUTH_TOKEN_PATH``, else the token of ``rayft cluster local`` when the address is
  its dashboard, else ``~/.ray/auth_token``. It is sent as ``Authorization: Bearer <token>``; none
  found means no header (a cluster without auth accepts that, one with auth answers 401).
* Code: the project root (the nearest folder above CONFIG with a pyproject.toml, else CONFIG's
  folder) is the job's ``working_dir``, minus runs/, .venv/, .gpu/, .git/, what its .gitignore,
  .rayignore and .rayftignore files ignore, and secrets (``.env*``, keys, credentials: always),
  see :mod:`rayft.cluster.packaging`. Its file count and size are printed first; more than
  100 MB needs ``yes=True`` (``--yes``). rayft zips exactly the files it lists and hands Ray that
  zip. The rayft package itself travels as a ``py_modules`` entry so the driver and every Ray Train
  worker import the submitter's rayft even where the cluster image lacks it.
* Entrypoint: ``python -m rayft.cli train <CONFIG relative to the working dir> [--set ...]``.
* Logs stream until the job ends; Ctrl-C asks whether to stop the job (``stop_job``) or leave it
  running. Exit status: 0 SUCCEEDED, 1 FAILED or STOPPED.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TextIO

from rayft.cluster.packaging import ALWAYS_EXCLUDED, MAX_UPLOAD_BYTES, SECRET_PATTERNS, Package, format_size, scan, write_zip

#: what Ray leaves out of the rayft package it uploads (py_modules); the working_dir is rayft's own zip
EXCLUDES = ALWAYS_EXCLUDED + SECRET_PATTERNS
DEFAULT_TOKEN_FILE = Path.home() / ".ray" / "auth_token"


class SubmitError(RuntimeError):
    """The job could not be submitted (no address, refused token, config outside the working dir...)."""


@dataclass
class Submission:
    address: str
    job_id: str
    entrypoint: str
    working_dir: str
    token_source: str | None


def normalize_address(addr: str) -> str:
    addr = addr.strip().rstrip("/")
    if addr in ("auto", "local") or addr.startswith("ray://"):
        raise SubmitError(
            f"address {addr!r} is a Ray client/GCS address; `rayft submit` needs the dashboard URL, e.g. --address http://127.0.0.1:8265"
        )
    return addr if "://" in addr else f"http://{addr}"


def resolve_address(cli_address: str | None, cfg_address: str | None) -> tuple[str, str]:
    """(dashboard URL, where it came from)."""
    for value, source in ((cli_address, "--address"), (cfg_address, "ray.address"), (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS")):
        if value:
            return normalize_address(value), source
    raise SubmitError(
        "no cluster address: pass --address http://HOST:8265, set ray.address in the config, or RAY_ADDRESS "
        "(`rayft cluster local up` prints one)"
    )


def resolve_token(address: str, token_file: Path | None = None) -> tuple[str | None, str | None]:
    """(token, where it came from) or (None, None). Never logs the token itself."""

    def read(p: Path, what: str) -> str:
        try:
            t = p.expanduser().read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SubmitError(f"cannot read the token file {p} ({what}): {e.strerror}") from None
        if not t:
            raise SubmitError(f"the token file {p} ({what}) is empty")
        return t

    if token_file is not None:
        return read(token_file, "--token-file"), f"--token-file {token_file}"
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        p = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
        return read(p, "RAY_AUTH_TOKEN_PATH"), f"RAY_AUTH_TOKEN_PATH {p}"
    from rayft.cluster.local import load_state

    lc = load_state()
    if lc is not None and lc.dashboard_url.rstrip("/") == address.rstrip("/"):
        return read(Path(lc.token_file), "rayft cluster local"), f"rayft cluster local ({lc.token_file})"
    if DEFAULT_TOKEN_FILE.exists():
        return read(DEFAULT_TOKEN_FILE, "Ray's default"), str(DEFAULT_TOKEN_FILE)
    return None, None


def project_root(config: Path) -> Path:
    """The nearest folder at or above CONFIG's that holds a pyproject.toml, else CONFIG's folder."""
    start = config.resolve().parent
    for d in (start, *start.parents):
        if (d / "pyproject.toml").is_file():
            return d
    return start


def build_entrypoint(config_rel: str, overrides: list[str], clear_address: bool) -> str:
    sets = list(overrides)
    if clear_address:  # the config's ray.address is the dashboard URL here; the job joins via RAY_ADDRESS
        sets.append("ray.address=null")
    parts = ["python", "-m", "rayft.cli", "train", config_rel]
    for s in sets:
        parts += ["--set", s]
    return " ".join(shlex.quote(p) for p in parts)


def runtime_env(working_dir: Path, stop_wait_s: int | None = None) -> dict[str, Any]:
    """The job's runtime_env; ``working_dir`` is the zip :func:`submit` writes (or a folder).

    ``stop_wait_s``: seconds Ray's job supervisor waits between the SIGTERM of a job stop (`ray job
    stop`, Ctrl-C on `rayft submit`) and its SIGKILL (``RAY_JOB_STOP_WAIT_TIME_S``, Ray's default
    3): set to cover rayft's own stop (``checkpoint.signal_grace_s``), which checkpoints first.
    """
    import rayft

    pkg = Path(rayft.__file__).resolve().parent
    env_vars = {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if stop_wait_s is not None:
        env_vars["RAY_JOB_STOP_WAIT_TIME_S"] = str(stop_wait_s)
    return {"working_dir": str(working_dir), "py_modules": [str(pkg)], "excludes": EXCLUDES, "env_vars": env_vars}


def client_for(address: str, token: str | None):
    """A JobSubmissionClient with the bearer token; auth failures become SubmitError."""
    from ray.job_submission import JobSubmissionClient

    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        return JobSubmissionClient(address, headers=headers)
    except Exception as e:  # AuthenticationError, ConnectionError, RuntimeError, requests errors
        raise SubmitError(f"cannot reach the Ray job server at {address}: {_auth_hint(e, token)}") from None


def _auth_hint(e: BaseException, token: str | None) -> str:
    text = str(e).strip() or type(e).__name__
    if "401" in text or "Authentication required" in text:
        return f"{text.splitlines()[0]} — the cluster needs a token: set RAY_AUTH_TOKEN or pass --token-file"
    if "403" in text or "Authentication failed" in text:
        return f"{text.splitlines()[0]} — the token was refused (wrong cluster or rotated token?)"
    return text


def package(config: Path, working_dir: Path | None = None) -> tuple[Package, str]:
    """The working_dir that would be uploaded for CONFIG, scanned, and CONFIG's path inside it.

    Raises:
        SubmitError: CONFIG outside the working dir or left out of it, or a folder, file or ignore
            file that cannot be read.
    """
    wd = (working_dir or project_root(config)).resolve()
    try:
        rel = config.resolve().relative_to(wd).as_posix()
    except ValueError:
        raise SubmitError(f"{config} is outside the working dir {wd}; move it there or pass --working-dir") from None
    try:
        pkg = scan(wd)
    except (OSError, ValueError) as e:
        raise SubmitError(f"cannot package the working dir {wd}: {e}") from None
    if rel not in pkg.files:
        why = (
            "it matches rayft's secret patterns"
            if rel in pkg.withheld
            else "an ignore file (.gitignore, .rayignore, .rayftignore) or rayft's default excludes leave it out"
        )
        raise SubmitError(f"{config} would not be uploaded with the working dir {wd}: {why}; rename it or change the ignore file")
    return pkg, rel


def describe(pkg: Package) -> str:
    """One line: the folder, its file count and size, and any secrets withheld."""
    line = f"working_dir {pkg.root}: {len(pkg.files)} files, {format_size(pkg.total_bytes)}"
    if pkg.withheld:
        line += f"; never uploaded (secret patterns): {', '.join(pkg.withheld)}"
    return line


def check_size(pkg: Package, yes: bool) -> None:
    """Refuse a working_dir over :data:`MAX_UPLOAD_BYTES` unless ``yes``.

    Raises:
        SubmitError: naming the size, the limit and the ways out.
    """
    if pkg.total_bytes > MAX_UPLOAD_BYTES and not yes:
        raise SubmitError(
            f"the working dir {pkg.root} holds {format_size(pkg.total_bytes)} in {len(pkg.files)} files, more than the "
            f"{format_size(MAX_UPLOAD_BYTES)} `rayft submit` uploads without --yes: leave out what the job does not need "
            "with a .rayftignore (gitignore syntax; `rayft submit --dry-run` lists every file), or pass --yes"
        )


def submit(
    config: Path,
    overrides: list[str],
    cfg_address: str | None,
    address: str | None = None,
    token_file: Path | None = None,
    working_dir: Path | None = None,
    say: Callable[[str], None] = print,
    yes: bool = False,
    stop_wait_s: int | None = None,
):
    """Submit the job; returns (client, Submission).

    The working dir is scanned, described and size-checked before the cluster is contacted.
    """
    addr, addr_source = resolve_address(address, cfg_address)
    token, token_source = resolve_token(addr, token_file)
    pkg, rel = package(config, working_dir)
    wd = pkg.root
    say(describe(pkg))
    check_size(pkg, yes)
    entry = build_entrypoint(rel, overrides, clear_address=bool(cfg_address))
    client = client_for(addr, token)
    job_id = f"rayft-{config.stem}-{dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    say(f"submitting to {addr} (address from {addr_source}; token from {token_source or 'nowhere: no auth header'})")
    say(f"working_dir {wd}; entrypoint: {entry}")
    with tempfile.TemporaryDirectory(prefix="rayft-submit-") as tmp:
        try:
            zipped = write_zip(pkg, Path(tmp) / "working_dir.zip")
        except OSError as e:
            raise SubmitError(f"cannot package the working dir {wd}: {e}") from None
        try:
            with quiet_ray_packaging():
                job_id = client.submit_job(entrypoint=entry, runtime_env=runtime_env(zipped, stop_wait_s), submission_id=job_id)
        except Exception as e:
            raise SubmitError(f"job submission failed: {_auth_hint(e, token)}") from None
    return client, Submission(addr, job_id, entry, str(wd), token_source)


#: Ray's loggers that narrate packaging and uploading a job's runtime_env at INFO (a dozen lines per submit)
RAY_PACKAGING_LOGGERS = ("ray._private.runtime_env.packaging", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk")


@contextlib.contextmanager
def quiet_ray_packaging():
    """While submitting: Ray's INFO lines about creating, pushing and uploading packages are
    dropped (``describe`` already said what is uploaded); its warnings and errors still show."""
    loggers = [logging.getLogger(n) for n in RAY_PACKAGING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def wait_terminal(client, job_id: str, timeout_s: float | None = 60) -> str:
    """Poll until the job ends (or ``timeout_s`` passes; None: no limit); returns the last status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    status = str(client.get_job_status(job_id).value)
    while status not in TERMINAL and (deadline is None or time.monotonic() < deadline):
        time.sleep(0.5)
        status = str(client.get_job_status(job_id).value)
    return status


def follow(client, job_id: str, out: TextIO = sys.stdout) -> None:
    """Stream the job's logs to ``out`` until the job ends (raises KeyboardInterrupt on Ctrl-C)."""

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            out.write(chunk)
            out.flush()

    asyncio.run(tail())


def exit_code(status: str) -> int:
    return 0 if status == "SUCCEEDED" else 1


def run(
    client,
    sub: Submission,
    confirm: Callable[[str], bool],
    say: Callable[[str], None],
    out: TextIO = sys.stdout,
) -> int:
    """Follow a submitted job to its end; Ctrl-C asks whether to stop it. Returns the exit status."""
    limit: float | None = 60
    try:
        follow(client, sub.job_id, out)
    except KeyboardInterrupt:
        try:
            stop = confirm(f"Stop job {sub.job_id} on {sub.address}?")
        except (KeyboardInterrupt, EOFError):
            stop = False
        if not stop:
            say(f"job {sub.job_id} keeps running; follow it with: ray job logs -f {sub.job_id} --address {sub.address}")
            return 130
        client.stop_job(sub.job_id)
        say(f"stop requested for {sub.job_id}")
    except Exception as e:  # the log stream broke (server restart...): fall back to polling the status
        say(f"log stream ended early ({e}); waiting for the job's status")
        limit = None
    status = wait_terminal(client, sub.job_id, timeout_s=limit)
    info = client.get_job_info(sub.job_id)
    msg = f": {info.message}" if info.message and status != "SUCCEEDED" else ""
    say(f"job {sub.job_id}: {status}{msg}")
    return exit_code(status) if status in TERMINAL else 1

"""Gloo ranks for tests that need several real processes: one launcher process imports the heavy
modules once (torch, transformers, rayft's model code: ~5 CPU-seconds a process on the 2-core CI
machine), then forks one child per rank, which runs the rank script as ``__main__`` with its own
``sys.argv``, its stdout and stderr in its own log file. Forking before any tensor work or process
group is made keeps the children independent (gloo, its threads and its store are created in each
child); a child's exit status and output come back as a spawned process's would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: What the launcher imports before it forks: what every rank script here imports.
PRELOAD = ("torch", "torch.distributed", "transformers", "rayft.config", "rayft.train.model")

LAUNCHER = r"""
import json, os, runpy, sys, traceback
spec = json.load(open(sys.argv[1]))
for m in spec["preload"]:
    __import__(m)
shared = {}
exec(spec["warm"], shared)  # what every rank would build alike: built once, inherited by the fork
shared = {k: v for k, v in shared.items() if not k.startswith("__")}
children = {}
for r, (argv, log) in enumerate(zip(spec["argvs"], spec["logs"])):
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 0
        try:
            sys.argv = [spec["script"], *argv]
            runpy.run_path(spec["script"], init_globals=shared, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    children[pid] = r
codes = [None] * len(children)
while children:
    pid, status = os.wait()
    codes[children.pop(pid)] = os.waitstatus_to_exitcode(status)
json.dump(codes, open(spec["codes"], "w"))
"""


def run_ranks(
    script: Path, argvs: list[list[str]], work: Path, timeout: float = 600, env: dict | None = None, warm: str = ""
) -> list[tuple[int, str]]:
    """Run ``script`` once per entry of ``argvs`` (rank r gets ``argvs[r]`` as its arguments), all at
    once, forked from one launcher: ``[(exit status, output), ...]`` in rank order (a negative status:
    killed by that signal). ``warm``: code the launcher runs once before forking; the names it
    defines are in every rank script's globals (e.g. tokenizers every rank loads alike).

    Raises:
        subprocess.TimeoutExpired: the ranks did not all end within ``timeout`` seconds (the launcher
            and its children are killed first, each rank's log's end printed to stderr).
    """
    work.mkdir(parents=True, exist_ok=True)
    launcher, spec = work / "launcher.py", work / "launcher.json"
    launcher.write_text(LAUNCHER)
    logs = [str(work / f"rank{r}.log") for r in range(len(argvs))]
    codes = work / "codes.json"
    spec.write_text(
        json.dumps({"preload": PRELOAD, "warm": warm, "script": str(script), "argvs": argvs, "logs": logs, "codes": str(codes)})
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    proc = subprocess.Popen([sys.executable, str(launcher), str(spec)], env=env, start_new_session=True)
    try:
        proc.wait(timeout=timeout)
    except BaseException:  # a timeout, Ctrl-C, the test process stopped: no rank left behind
        os.killpg(proc.pid, 9)
        proc.wait()
        tails = "\n".join(f"rank {r}: {Path(log).read_text()[-1500:] if Path(log).exists() else '(no log)'}" for r, log in enumerate(logs))
        print(f"the ranks did not end; their logs' ends:\n{tails}", file=sys.stderr)
        raise
    assert proc.returncode == 0, f"the launcher itself failed (exit {proc.returncode})"
    return list(zip(json.loads(codes.read_text()), (Path(log).read_text() for log in logs)))

"""The one door to eksctl, helm and kubectl.

Every external command the cluster lifecycle runs goes through a :class:`Runner`. The real one,
:class:`SubprocessRunner`, captures a subprocess (or streams it while keeping a copy, for the long
eksctl steps); tests substitute a recorder with the same ``run`` signature. We never
re-implement those tools, we only call them.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

TOOLS = ("eksctl", "helm", "kubectl")


@dataclass(frozen=True)
class Result:
    """What one command did: its argv, exit status and output (stderr folded in when streamed)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def line(self) -> str:
        return shlex.join(self.argv)


class CommandError(RuntimeError):
    """A command that exited non-zero when ``check=True``."""

    def __init__(self, result: Result):
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        super().__init__(f"`{result.line}` exited {result.returncode}" + ("\n  " + "\n  ".join(tail) if tail else ""))
        self.result = result


class Runner(Protocol):
    """Runs one command.

    ``stream``: show its output live (long eksctl steps) while still returning a copy of it.
    ``check``: raise :class:`CommandError` on a non-zero exit.
    """

    def run(self, argv: Sequence[str], *, check: bool = True, stream: bool = False) -> Result: ...


class SubprocessRunner:
    """Runs commands for real."""

    def __init__(self, echo: Callable[[str], None] | None = None):
        self._echo = echo  # shown before each command, e.g. console.print

    def run(self, argv: Sequence[str], *, check: bool = True, stream: bool = False) -> Result:
        argv = tuple(str(a) for a in argv)
        if self._echo is not None:
            self._echo(f"$ {shlex.join(argv)}")
        try:
            if stream:
                lines: list[str] = []
                with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
                    assert proc.stdout is not None
                    for line in proc.stdout:
                        sys.stderr.write(line)
                        lines.append(line)
                res = Result(argv, proc.returncode, "".join(lines), "")
            else:
                proc = subprocess.run(argv, capture_output=True, text=True, check=False)
                res = Result(argv, proc.returncode, proc.stdout or "", proc.stderr or "")
        except FileNotFoundError:
            res = Result(argv, 127, "", f"{argv[0]}: command not found")
        if check and not res.ok:
            raise CommandError(res)
        return res


def missing_tools(tools: Sequence[str] = TOOLS) -> list[str]:
    """The tools of ``tools`` that are not on PATH."""
    return [t for t in tools if shutil.which(t) is None]

"""``train.profile_steps``: torch.profiler over a window of optimizer steps, on every rank.

Each rank records CPU and GPU activity (with input shapes) from the start of step FIRST to the end
of step LAST (1-based) and then writes, under ``RUN_DIR/profile/``:

* ``rank<N>.trace.json.gz``: the Chrome trace (open it in Perfetto or ``chrome://tracing``; read
  its GPU kernels by category with :mod:`rayft.benchmarks.trace_kernels`);
* ``rank<N>.ops.txt``: the operators' table from ``key_averages()``, by self GPU time (by self CPU
  time on CPU workers), 40 rows.

A run directory on object storage (``s3://``) gets the files through a local temporary folder.
The profiler's own overhead lands in the traced steps' times: those steps' metrics say
``profiled: true``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function


class StepProfiler:
    """torch.profiler over steps ``window`` = (FIRST, LAST) of one rank; does nothing when ``window`` is None.

    Call :meth:`before` with the 1-based step about to run and :meth:`after` once it finished;
    :meth:`after` of step LAST writes the files and returns their folder (else None). A run that
    starts inside the window (a resume) traces from its first step; :meth:`discard` drops an open
    window (a stop before LAST: nothing is written). The training loop makes the next step's rows
    while a step runs, so each traced step holds the next one's collate and host-to-device copies
    (and step FIRST's own were made before the window opened).
    """

    def __init__(self, window: tuple[int, int] | None, run_dir: str, rank: int, device: torch.device):
        self.window = window
        self.run_dir = run_dir
        self.rank = rank
        self.on_gpu = device.type == "cuda"
        self.first_traced: int | None = None  # the step the open window started at
        self._prof: profile | None = None
        self._step_range: record_function | None = None

    def covers(self, step: int) -> bool:
        return self.window is not None and self.window[0] <= step <= self.window[1]

    def before(self, step: int) -> None:
        if not self.covers(step):
            return
        if self._prof is None:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
            self._prof = profile(activities=activities, record_shapes=True)
            self._prof.__enter__()
            self.first_traced = step
        # each step under a range of its own, named after the run's step number
        self._step_range = record_function(f"ProfilerStep#{step}")
        self._step_range.__enter__()

    def after(self, step: int) -> str | None:
        if self._prof is None or not self.covers(step):
            return None
        if self.on_gpu:
            torch.cuda.synchronize()  # the step's kernels inside its range and the trace
        self._step_range.__exit__(None, None, None)
        if step != self.window[1]:
            return None
        self._prof.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        return self._write(prof, step)

    def discard(self) -> None:
        """Stop an open window without writing anything."""
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None

    def _write(self, prof: profile, last: int) -> str:
        remote = "://" in self.run_dir
        folder = Path(tempfile.mkdtemp(prefix="rayft-profile-")) if remote else Path(self.run_dir) / "profile"
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / f"rank{self.rank}.trace.json.gz"
        prof.export_chrome_trace(str(trace))  # gzip-compressed: the name ends in .gz
        sort = "self_device_time_total" if self.on_gpu else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=80)
        (folder / f"rank{self.rank}.ops.txt").write_text(f"steps {self.first_traced}-{last}, rank {self.rank}\n{table}\n")
        if not remote:
            return str(folder)
        import pyarrow.fs

        dest = f"{self.run_dir.rstrip('/')}/profile"
        try:
            fs, path = pyarrow.fs.FileSystem.from_uri(dest)
            fs.create_dir(path, recursive=True)
            for f in folder.iterdir():
                pyarrow.fs.copy_files(str(f), f"{dest}/{f.name}")
        except OSError as e:  # the profile is an aid: a failed upload must not end the training run
            print(f"[rayft] warning: rank {self.rank}: the profile could not be copied to {dest} ({e}); it stays in {folder}", flush=True)
            return str(folder)
        shutil.rmtree(folder, ignore_errors=True)
        return dest

"""train.profile_steps' StepProfiler on the CPU, without Ray: the window, a run that starts inside
it (a resume), a stop that cuts it short, and a run directory given as a URI (``file://``, the
``s3://`` path's code)."""

from __future__ import annotations

import torch

from rayft.benchmarks.trace_kernels import load_events
from rayft.train.profiling import StepProfiler

CPU = torch.device("cpu")


def run(prof: StepProfiler, steps: range) -> list[str | None]:
    out = []
    for step in steps:
        prof.before(step)
        torch.ones(32, 32) @ torch.ones(32, 32)
        out.append(prof.after(step))
    return out


def traced_steps(folder, rank=0) -> set[str]:
    return {e["name"] for e in load_events(folder / f"rank{rank}.trace.json.gz") if str(e.get("name", "")).startswith("ProfilerStep#")}


def test_the_window_is_traced_and_written_once_at_its_last_step(tmp_path):
    prof = StepProfiler((2, 3), str(tmp_path), rank=1, device=CPU)
    assert [prof.covers(s) for s in range(1, 5)] == [False, True, True, False]
    written = run(prof, range(1, 5))
    assert written == [None, None, str(tmp_path / "profile"), None]
    assert traced_steps(tmp_path / "profile", rank=1) == {"ProfilerStep#2", "ProfilerStep#3"}
    ops = (tmp_path / "profile" / "rank1.ops.txt").read_text()
    assert ops.startswith("steps 2-3, rank 1\n") and "aten::mm" in ops and "Self CPU" in ops


def test_a_run_that_starts_inside_the_window_says_what_it_traced(tmp_path):
    prof = StepProfiler((2, 4), str(tmp_path), rank=0, device=CPU)
    assert run(prof, range(3, 6))[1] == str(tmp_path / "profile")  # resumed after step 2
    assert prof.first_traced == 3 and traced_steps(tmp_path / "profile") == {"ProfilerStep#3", "ProfilerStep#4"}
    assert (tmp_path / "profile" / "rank0.ops.txt").read_text().startswith("steps 3-4, rank 0\n")


def test_a_stop_inside_the_window_writes_nothing(tmp_path):
    prof = StepProfiler((2, 3), str(tmp_path), rank=0, device=CPU)
    assert run(prof, range(1, 3)) == [None, None]
    prof.discard()
    assert not (tmp_path / "profile").exists() and prof.after(3) is None
    assert run(StepProfiler(None, str(tmp_path), rank=0, device=CPU), range(1, 4)) == [None] * 3  # no window: nothing


def test_a_run_directory_uri_gets_the_files_through_a_local_folder(tmp_path):
    uri = f"file://{tmp_path}/runs/r"
    prof = StepProfiler((1, 1), uri, rank=0, device=CPU)
    assert run(prof, range(1, 2)) == [f"{uri}/profile"]
    assert sorted(p.name for p in (tmp_path / "runs" / "r" / "profile").iterdir()) == ["rank0.ops.txt", "rank0.trace.json.gz"]

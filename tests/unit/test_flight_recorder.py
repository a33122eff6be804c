"""rayft doctor --flight-recorder: PyTorch flight-recorder dumps read for a hang (issue 20, part 5).

The dumps here are written in the format of torch 2.13's FlightRecorder (the keys of
torch/csrc/distributed/c10d/FlightRecorder.hpp, version "2.10"), as plain-data pickles; the
integration test tests/integration/test_doctor_job.py reads real ones from a 2-rank gloo job.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.nccl.errors import DoctorError
from rayft.nccl.flight_recorder import analyse, read_dumps

runner = CliRunner()
FRAME = {"name": "train_step", "filename": "/app/rayft/train/step.py", "line": 88}
TORCH_FRAME = {"name": "all_reduce", "filename": "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", "line": 3245}


def entry(seq: int, op: str, state: str = "completed", pg: tuple[str, str] = ("0", "default_pg"), sizes=((1024,),)) -> dict:
    return {
        "frames": [TORCH_FRAME, FRAME],
        "record_id": seq,
        "pg_id": int(pg[0]),
        "process_group": pg,
        "thread_name": "python",
        "thread_id": "140306469378944",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": op,
        "time_created_ns": 1_796_134_648_516_627_983 + seq,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"],
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def write_dumps(folder: Path, per_rank: dict[int, list[dict]], ranks: str = "[0, 1]") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, entries in per_rank.items():
        last = max((e["collective_seq_id"] for e in entries), default=0)
        dump = {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last, "last_completed_collective": last - 1}},
            "comm_lib_version": "2.23.4",
            "entries": entries,
        }
        (folder / f"rank_{rank}").write_bytes(pickle.dumps(dump))
    return folder


def test_the_collective_a_rank_never_entered(tmp_path):
    d = write_dumps(
        tmp_path / "fr",
        {
            0: [entry(3, "nccl:all_reduce"), entry(4, "nccl:broadcast"), entry(5, "nccl:all_reduce", "started")],
            1: [entry(3, "nccl:all_reduce"), entry(4, "nccl:broadcast", "completed")],
        },
    )
    dumps = read_dumps(d)
    assert [(x.rank, x.version, len(x.entries)) for x in dumps] == [(0, "2.10", 3), (1, "2.10", 2)]
    [f] = analyse(dumps)
    assert (f.group, f.seq, f.op, f.hung) == ("0 (default_pg)", 5, "nccl:all_reduce", [1])
    assert f.text == (
        "process group 0 (default_pg): collective #5 nccl:all_reduce (input [[1024]] Float) at /app/rayft/train/step.py:88 "
        "(train_step) was entered by rank 0 and never by rank 1 (last entered: rank 1: #4 nccl:broadcast at "
        "/app/rayft/train/step.py:88 (train_step))"
    )
    assert f.next_step.startswith("look at rank 1: its last collective and stack say where it stopped")


def test_ranks_that_disagree_on_a_collective(tmp_path):
    d = write_dumps(tmp_path / "fr", {0: [entry(7, "nccl:all_reduce")], 1: [entry(7, "nccl:all_gather", sizes=((4, 8),))]})
    [f] = analyse(read_dumps(d))
    assert f.text == (
        "process group 0 (default_pg): the ranks disagree on collective #7 (rank 0: nccl:all_reduce (input [[1024]] Float); "
        "rank 1: nccl:all_gather (input [[4, 8]] Float))"
    )


def test_a_collective_every_rank_entered_but_that_never_completed(tmp_path):
    d = write_dumps(tmp_path / "fr", {0: [entry(12, "nccl:reduce_scatter", "completed")], 1: [entry(12, "nccl:reduce_scatter", "started")]})
    [f] = analyse(read_dumps(d))
    assert f.hung == [1] and f.text.startswith(
        "process group 0 (default_pg): every rank entered collective #12 nccl:reduce_scatter (input [[1024]] Float) and it never completed on rank 1"
    )


def test_healthy_dumps_and_a_missing_rank(tmp_path):
    same = [entry(1, "nccl:all_reduce"), entry(2, "nccl:all_reduce")]
    assert analyse(read_dumps(write_dumps(tmp_path / "ok", {0: same, 1: same}))) == []
    [f] = analyse(read_dumps(write_dumps(tmp_path / "gone", {0: same, 1: same}, ranks="[0, 1, 2]")))
    assert (f.hung, f.text) == ([2], "process group 0 (default_pg): no dump from rank 2")


def test_only_plain_data_is_unpickled(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    d = tmp_path / "fr"
    d.mkdir()
    (d / "rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    with pytest.raises(DoctorError, match=r"rank_0 is not a flight-recorder dump \(UnpicklingError: posix.system is not plain data\)"):
        read_dumps(d)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(DoctorError, match="is not a folder"):
        read_dumps(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DoctorError, match="no flight-recorder dump in"):
        read_dumps(tmp_path / "empty")


def test_cli(tmp_path):
    hang = write_dumps(tmp_path / "hang", {0: [entry(5, "gloo:all_reduce", "scheduled")], 1: [entry(4, "gloo:broadcast", "scheduled")]})
    res = runner.invoke(app, ["doctor", "--flight-recorder", str(hang)])
    err = " ".join(res.stderr.split())
    assert res.exit_code == 1
    assert "hang: process group 0 (default_pg): collective #5 gloo:all_reduce" in err and "never by rank 1" in err
    assert "next: look at rank 1" in err
    ok = write_dumps(tmp_path / "ok", {0: [entry(5, "gloo:all_reduce", "scheduled")], 1: [entry(5, "gloo:all_reduce", "scheduled")]})
    res = runner.invoke(app, ["doctor", "--flight-recorder", str(ok)])
    assert res.exit_code == 0 and "every rank entered the same collectives" in res.stderr
    res = runner.invoke(app, ["doctor", "--flight-recorder", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "is not a folder" in res.stderr


def test_cli_with_a_log_too_judges_both(tmp_path):
    log = Path(__file__).parent / "fixtures" / "nccl" / "efa_2x8.log"
    hang = write_dumps(tmp_path / "hang", {0: [entry(5, "nccl:all_reduce", "started")], 1: [entry(4, "nccl:all_reduce")]})
    res = runner.invoke(app, ["doctor", str(log), "--expect", "efa", "--flight-recorder", str(hang)])
    assert res.exit_code == 1  # the log passes, the dumps show a hang
    assert "all 16 ranks used efa" in res.stderr and "hang: process group 0 (default_pg): collective #5" in res.stderr
    ok = write_dumps(tmp_path / "ok", {0: [entry(5, "nccl:all_reduce")], 1: [entry(5, "nccl:all_reduce")]})
    assert runner.invoke(app, ["doctor", str(log), "--expect", "efa", "--flight-recorder", str(ok)]).exit_code == 0

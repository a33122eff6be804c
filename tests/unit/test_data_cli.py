"""The data commands of the CLI: `rayft train` naming a missing data file before Ray or torch
start, and `rayft data check` (every bad record listed, JSON, exit codes)."""

import re
import subprocess
import sys

import pytest


def _imported(stderr: str) -> set[str]:
    """Top-level packages in `python -X importtime` output."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", stderr, re.M)}


@pytest.mark.parametrize(
    "data,message",
    [
        ("train_files: [nope.jsonl]", "error: nope.jsonl: no such data file (data.train_files)"),
        ("train_files: [data/*.jsonl]", "error: data/*.jsonl: no such data file (data.train_files)"),
        ("{train_files: [ok.jsonl], validation_files: [val*.jsonl]}", "error: val*.jsonl: no such data file (data.validation_files)"),
    ],
)
def test_train_names_a_missing_data_file_before_importing_torch_or_ray(tmp_path, data, message):
    (tmp_path / "ok.jsonl").write_text('{"text": "x"}\n')
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"data: {data}\n" if data.startswith("{") else f"data:\n  {data}\n")
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rayft.cli", "train", str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1] == message
    mods = _imported(r.stderr)
    assert "rayft" in mods and "yaml" in mods  # the import trace is read right
    assert not mods & {"torch", "ray", "transformers"}, mods & {"torch", "ray", "transformers"}

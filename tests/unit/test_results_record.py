"""Results files' helpers (rayft.benchmarks.record): a results file as written, another commit's
source tree for an A/B."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rayft.benchmarks.record import commit_src, write_result

ROOT = Path(__file__).resolve().parents[2]


def test_a_results_file_holds_the_command_the_commit_and_the_figures(tmp_path):
    path = write_result(tmp_path / "deep" / "r.json", "python x.py", {"a": 1.5}, note="n")
    doc = json.loads(path.read_text())
    assert doc["command"] == "python x.py" and doc["figures"] == {"a": 1.5} and doc["note"] == "n"
    assert {"git_commit", "date", "environment"} <= set(doc)


def test_commit_src_unpacks_that_commits_tree(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    src = commit_src(ROOT, head, tmp_path)
    want = subprocess.run(["git", "-C", str(ROOT), "show", f"{head}:src/rayft/cli.py"], capture_output=True, check=True).stdout
    assert src == tmp_path / "src" and (src / "rayft" / "cli.py").read_bytes() == want
    with pytest.raises(subprocess.CalledProcessError):
        commit_src(ROOT, "0" * 40, tmp_path / "none")

"""Results files under bench/results/: one JSON per measurement, with everything needed to trust it.

Each file records the command, the git commit, the GPU model and count, library versions, and the
figures. ``python -m rayft.benchmarks.record RUN_DIR OUT.json --command "..."`` turns a finished training
run (its ``rayft_summary.json`` and ``rayft_metrics.jsonl``) into such a file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
from pathlib import Path


def environment() -> dict:
    """Versions and hardware of this machine (GPU name/count, torch, CUDA, NCCL, Ray, transformers)."""
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    from importlib.metadata import PackageNotFoundError, version

    for mod, dist_name in (("ray", "ray"), ("transformers", "transformers"), ("liger_kernel", "liger-kernel")):
        try:
            env[mod] = version(dist_name)
        except PackageNotFoundError:
            env[mod] = None
    if torch.cuda.is_available():
        env["gpu_model"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        env["gpu_model"], env["gpu_count"] = "cpu", 0
    return env


def git_commit() -> str | None:
    if os.environ.get("RAYFT_GIT_COMMIT"):
        return os.environ["RAYFT_GIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None


def commit_src(repo: str | os.PathLike, commit: str, into: str | os.PathLike) -> Path:
    """``commit``'s ``src`` tree from the git repository ``repo``, unpacked under ``into``: the old arm
    of an A/B that puts it first on ``PYTHONPATH``. Returns ``into/src``.

    Raises:
        subprocess.CalledProcessError: no such commit, or ``git``/``tar`` failed.
    """
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit, "src"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return Path(into) / "src"


def write_result(out: str | os.PathLike, command: str, figures: dict, **extra) -> Path:
    """Write one results file (pretty JSON) and return its path."""
    doc = {
        "command": command,
        "git_commit": git_commit(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "figures": figures,
        **extra,
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--command", required=True)
    a = ap.parse_args()
    run = Path(a.run_dir)
    summary = json.loads((run / "rayft_summary.json").read_text())
    history = [json.loads(line) for line in (run / "rayft_metrics.jsonl").read_text().splitlines()]
    curve = [{"step": h["step"], "loss": round(h["loss"], 5), "tokens_per_s_per_gpu": round(h["tokens_per_s_per_gpu"], 1)} for h in history]
    export = {}
    check = run / "hf" / "rayft_export_check.json"
    if check.exists():
        export = json.loads(check.read_text())
    print(write_result(a.out, a.command, summary, loss_curve=curve, export_check=export))


if __name__ == "__main__":
    main()

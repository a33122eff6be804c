"""The GPU's sustained matrix rate in `rayft bench train` (issue 23, part 5): nvidia-smi's lines,
the sustained window, the sampler as a real process, the CPU refusal, and the bench's wiring (a run's
share of the rate, the table's lines, a failed measurement that does not stop the recipes)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayft.benchmarks import ceiling as ce
from rayft.benchmarks import train as bt
from rayft.benchmarks import train_recipes as brc
from rayft.benchmarks import train_results as br


def test_smi_lines_as_nvidia_smi_prints_them():
    assert ce.parse_smi_line("1485, 699.12, 700.00, 0x0000000000000004\n") == {
        "sm_mhz": 1485.0,
        "power_w": 699.12,
        "power_limit_w": 700.0,
        "reasons": 4,
    }
    # a field the card does not report, the idle reason (0x1), a header, an error line, an empty line
    assert ce.parse_smi_line("1980, [N/A], 700.00, 0x0000000000000001") == {
        "sm_mhz": 1980.0,
        "power_w": None,
        "power_limit_w": 700.0,
        "reasons": 1,
    }
    assert ce.parse_smi_line("clocks.current.sm [MHz], power.draw [W], power.limit [W], clocks_event_reasons.active") is None
    assert ce.parse_smi_line("Failed to initialize NVML: Driver/library version mismatch") is None
    assert ce.parse_smi_line("") is None


def test_the_sustained_rate_is_the_median_of_the_second_half():
    tf = [790.2, 701.0, 668.0, 652.5, 649.0, 655.1, 640.0]
    windows = [{"t0": i, "t1": i + 1, "tflops": v} for i, v in enumerate(tf)]
    assert ce.sustained_tflops(windows) == 650.75  # median of the last four: (649.0 + 652.5) / 2
    assert ce.sustained_tflops(windows[:1]) == 790.2
    with pytest.raises(ce.CeilingError, match="no window"):
        ce.sustained_tflops([])


def test_smi_summary_reads_only_the_sustained_span():
    samples = [{"t": 10.0, "sm_mhz": 1980.0, "power_w": 120.0, "power_limit_w": 700.0, "reasons": 0x1}]  # idle, before
    samples += [{"t": 20.0 + i, "sm_mhz": 1450.0 + 10 * i, "power_w": 699.0, "power_limit_w": 700.0, "reasons": 0x4} for i in range(3)]
    samples += [{"t": 23.5, "sm_mhz": 1700.0, "power_w": None, "power_limit_w": 700.0, "reasons": 0x0}]
    s = ce.smi_summary(samples, 20.0, 24.0)
    assert s == {
        "samples": 4,
        "sm_mhz_median": 1465.0,  # 1450, 1460, 1470, 1700
        "power_w_median": 699.0,
        "power_limit_w": 700.0,
        "power_cap_share": 0.75,
        "reasons_seen": ["0x0", "0x4"],
    }
    assert ce.smi_summary(samples, 100.0, 101.0)["sm_mhz_median"] is None


def fake_nvidia_smi(tmp_path: Path, lines: list[str]) -> Path:
    """A directory holding an ``nvidia-smi`` that prints ``lines`` 50 ms apart, then waits to be stopped
    (as ``nvidia-smi -lms`` does), for the sampler's reading thread and its process handling."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "nvidia-smi"
    exe.write_text(
        f"#!{sys.executable}\nimport sys, time\nfor line in {lines!r}:\n    print(line, flush=True)\n    time.sleep(0.05)\ntime.sleep(60)\n"
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return d


def test_sampler_reads_a_running_nvidia_smi_and_stops_it(tmp_path, monkeypatch):
    lines = ["1490, 698.5, 700.00, 0x0000000000000004", "garbage", "1510, 701.0, 700.00, 0x0000000000000004"]
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, lines)}{os.pathsep}{os.environ['PATH']}")
    t0 = time.time()
    with ce.SmiSampler(device_index=3, interval_ms=100) as smi:
        deadline = time.time() + 30
        while len(smi.samples) < 2 and time.time() < deadline:
            time.sleep(0.05)
    assert smi.cmd[:3] == ["nvidia-smi", "-i", "3"] and smi.cmd[-2:] == ["-lms", "100"]
    assert [s["sm_mhz"] for s in smi.samples] == [1490.0, 1510.0] and smi.error is None
    assert all(t0 <= s["t"] <= time.time() for s in smi.samples)
    assert smi.proc.poll() is not None  # stopped with the block, not left sleeping


def test_sampler_without_nvidia_smi_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with ce.SmiSampler(0) as smi:
        pass
    assert smi.samples == [] and smi.error == "nvidia-smi is not on PATH: no clock or power samples"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_the_measurement_refuses_a_machine_without_a_gpu(tmp_path):
    out = tmp_path / "c.json"
    r = subprocess.run(
        [sys.executable, "-m", "rayft.benchmarks.ceiling", "--seconds", "5", "--out", str(out)], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.strip() == "error: no CUDA GPU: the matrix rate is measured on GPUs only"
    assert not out.exists()


CEILING = {
    "gpu": "NVIDIA H200",
    "n": 8192,
    "seconds": 15.0,
    "first_window_tflops": 671.3,
    "sustained_tflops": 650.0,
    "windows": [{"t0": 0.0, "t1": 1.0, "tflops": 671.3}, {"t0": 1.0, "t1": 2.0, "tflops": 650.0}],
    "smi": {"samples": 70, "sm_mhz_median": 1480.0, "power_w_median": 699.4, "power_limit_w": 700.0, "power_cap_share": 1.0},
    "smi_error": None,
    "torch": "2.11.0",
    "cuda": "13.0",
}


def gpu_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "model: {name_or_path: mistral-tiny}\ndata: {synthetic: {rows: 4}, seq_len: 16}\n"
        f"train: {{num_workers: 2, use_gpu: true, micro_batch_size: 1}}\ncheckpoint: {{storage_path: {tmp_path}}}\n"
    )
    return cfg


def runner_with_ceiling(ceiling_rc: int, calls: list):
    """A runner whose ceiling process writes :data:`CEILING` (or exits ``ceiling_rc``) and whose
    sample-recipe writes two ranks' step records (each rank 16 tokens in 0.5 s a step)."""

    def runner(cmd, env, log, timeout_s):
        calls.append((cmd, timeout_s))
        log.write_text("ok\n")
        if cmd[1:3] == ["-m", "rayft.benchmarks.ceiling"]:
            if ceiling_rc == 0:
                Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps(CEILING))
            else:
                log.write_text("RuntimeError: CUDA error: out of memory\n")
            return ceiling_rc
        run_dir = Path(json.loads(Path(cmd[-1]).read_text())["out_dir"])
        for rank in (0, 1):
            (run_dir / f"steps.rank{rank}.jsonl").write_text(
                "".join(
                    json.dumps({"step": s, "step_time_s": 0.5, "tokens": 16, "attn_tokens_sq": 256.0, "peak_mem_gib": 1.0}) + "\n"
                    for s in (1, 2, 3)
                )
            )
        return 0

    return runner


def test_bench_measures_the_rate_first_and_states_each_runs_share(tmp_path):
    calls = []
    path, figs = bt.run_bench(
        gpu_config(tmp_path),
        recipes=["sample-recipe"],
        workloads=["random"],
        steps=3,
        warmup_steps=1,
        out=tmp_path / "res.json",
        work_dir=tmp_path / "wd",
        runner=runner_with_ceiling(0, calls),
        ceiling_s=12,
    )
    (cmd, limit), _ = calls  # the ceiling first, then the one recipe
    assert cmd[1:] == ["-m", "rayft.benchmarks.ceiling", "--seconds", "12", "--out", str(tmp_path / "wd" / "ceiling.json")]
    assert limit == 132
    c = figs["ceiling"]
    assert c["status"] == "ok" and c["sustained_tflops"] == 650.0 and c["windows_tflops"] == [671.3, 650.0] and "windows" not in c
    [run] = figs["runs"]
    assert run["tokens_per_s_per_gpu"] == 32.0  # 2 ranks × 16 tokens / 0.5 s / 2 GPUs
    assert run["of_ceiling"] == pytest.approx(32.0 * run["flops_per_token"] / 650e12, rel=1e-12)
    doc = json.loads(path.read_text())
    assert doc["figures"]["ceiling"]["sustained_tflops"] == 650.0 and "--ceiling-s 12" in doc["command"]
    md = path.with_suffix(".md").read_text()
    assert (
        "This GPU's sustained bf16 matrix rate in this call: 650.0 TFLOP/s (8192² products for 15 s, median of the second half; "
        "first second 671.3; SM clock 1,480 MHz, 699 W of 700 W, power cap in 100% of samples)." in md
    )
    share = 100 * run["of_ceiling"]
    assert f"as a share of it (float8 runs too, against this bf16 rate): sample-recipe × random {share:.1f}%." in md


def test_a_failed_measurement_is_recorded_and_the_recipes_still_run(tmp_path):
    calls = []
    path, figs = bt.run_bench(
        gpu_config(tmp_path),
        recipes=["sample-recipe"],
        workloads=["random"],
        steps=3,
        warmup_steps=1,
        out=tmp_path / "res.json",
        work_dir=tmp_path / "wd",
        runner=runner_with_ceiling(1, calls),
    )
    assert len(calls) == 2 and calls[0][0][4] == "15"  # the default 15 s
    c = figs["ceiling"]
    assert c["status"] == "failed" and c["error"].startswith("exit 1\n") and "CUDA error: out of memory" in c["error"]
    [run] = figs["runs"]
    assert run["status"] == "ok" and run["of_ceiling"] is None
    md = path.with_suffix(".md").read_text()
    assert "This GPU's matrix rate was not measured in this call: exit 1." in md and "as a share of it" not in md


def test_cpu_runs_and_ceiling_s_0_measure_nothing(tmp_path):
    calls = []
    plan = brc.Plan(tmp_path / "job.yaml", [], ["rayft"], ["random"], 3, 1, tmp_path, None)
    console = __import__("rich.console").console.Console(quiet=True)
    assert bt.measure_ceiling(plan, True, 0, runner_with_ceiling(0, calls), console) == {
        "status": "not measured",
        "reason": "--ceiling-s 0",
    }
    assert bt.measure_ceiling(plan, False, 15, runner_with_ceiling(0, calls), console) == {
        "status": "not measured",
        "reason": "CPU workers",
    }
    tight = brc.Plan(tmp_path / "job.yaml", [], ["rayft"], ["random"], 3, 1, tmp_path, None, deadline_s=40)
    got = bt.measure_ceiling(tight, True, 15, runner_with_ceiling(0, calls), console, t0=bt._clock())
    # 40 s less the 10 s margin: under the 15 s + 30 s it needs
    assert got["status"] == "not measured" and re.fullmatch(r"(29|30) s left before --deadline-s 40", got["reason"]), got
    assert calls == []
    doc = {"figures": {"runs": [], "price": {}, "use_gpu": False, "ceiling": {"status": "not measured", "reason": "CPU workers"}}}
    assert "matrix rate" not in br.markdown_table(doc)  # a CPU run's table says nothing of it
    doc["figures"].update(use_gpu=True, ceiling={"status": "not measured", "reason": "--ceiling-s 0"})
    assert "This GPU's matrix rate was not measured in this call: --ceiling-s 0." in br.markdown_table(doc)
    with pytest.raises(br.BenchTrainError, match=r"--ceiling-s 1: 0 \(not measured\) or 2 to 600 seconds"):
        bt.run_bench(
            gpu_config(tmp_path),
            recipes=["sample-recipe"],
            workloads=["random"],
            steps=3,
            warmup_steps=1,
            runner=runner_with_ceiling(0, []),
            ceiling_s=1,
        )


def test_the_table_line_leaves_out_what_nvidia_smi_did_not_report():
    c = {
        **CEILING,
        "status": "ok",
        "smi": {"sm_mhz_median": 1480.0, "power_w_median": None, "power_limit_w": None, "power_cap_share": None},
    }
    assert ce.describe(c).endswith("first second 671.3; SM clock 1,480 MHz).")
    c = {**CEILING, "status": "ok", "smi": {}, "smi_error": "nvidia-smi is not on PATH: no clock or power samples"}
    assert ce.describe(c).endswith("first second 671.3; nvidia-smi is not on PATH: no clock or power samples).")
    assert ce.describe({"status": "failed", "error": ""}) == "This GPU's matrix rate was not measured in this call: no reason recorded."

"""rayft.benchmarks.trace_kernels on traces of known content: a CPU trace torch.profiler writes (no
GPU events: nothing counted, its step ranges found), and a trace with GPU kernels laid out by hand
(categories, per-step milliseconds, the busy union of overlapping kernels)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rayft.benchmarks import trace_kernels as tk


def kernel(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def test_categories_per_step_and_the_busy_union(tmp_path, capsys):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 0, "dur": 5000},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 5000, "dur": 5000},
        kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NTT", 0, 2000),  # matmul
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1000, 2000),  # matmul, overlapping the first by 1 ms
        kernel("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", 4000, 1000),
        kernel("triton_per_fused__fused_rms_norm__to_copy_0", 6000, 500),
        kernel("_rms_norm_forward_kernel", 6500, 500),  # liger's; Inductor's own fused norm is named triton_..._rms_norm_...
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 7000, 1000),
        kernel("Memcpy HtoD (Pageable -> Device)", 8000, 200, cat="gpu_memcpy"),
        kernel("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 8200, 800),
        kernel("some_custom_kernel", 9000, 100),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99999},  # CPU side: not GPU time
        *({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 5} for t in range(0, 9000, 1000)),
    ]
    f = tmp_path / "t.json.gz"
    with gzip.open(f, "wt") as out:
        json.dump({"traceEvents": events}, out)
    s = tk.summarize(tk.load_events(f))
    assert s.steps == 2
    assert s.ms_per_step == pytest.approx(
        {
            "matmul (cuBLAS/CUTLASS)": 2.0,
            "attention": 0.5,
            "Inductor (Triton)": 0.25,
            "liger kernels": 0.25,
            "collectives (NCCL)": 0.5,
            "copies, casts, fills": 0.1,
            "optimizer (foreach/fused)": 0.4,
            "other": 0.05,
        }
    )
    assert s.kernel_ms_per_step == pytest.approx(4.05)
    # kernels cover 0–3 ms (two overlapping), 4–5 ms and 6–9.1 ms: 7.1 ms busy of a 9.1 ms span
    assert s.busy_ms == pytest.approx(7.1) and s.span_ms == pytest.approx(9.1) and s.idle_ms_per_step == pytest.approx(1.0)
    assert s.runtime_calls == 9
    assert s.top[0] == ("nvjet_tst_128x256_64x4_1x2_h_bz_coopB_NTT", pytest.approx(1.0), 0.5)
    tk.main([f"a={f}", f"b={f}", "--top", "2"])
    out = capsys.readouterr().out
    assert "| matmul (cuBLAS/CUTLASS) | 2.0 | 2.0 |" in out and "| GPU busy share of the traced steps | 78.0% | 78.0% |" in out
    assert (
        "| GPU idle within the traced steps, ms per step | 1.0 | 1.0 |" in out
        and "| CUDA runtime and driver calls per step (CPU) | 4 | 4 |" in out
    )


def test_only_kernels_inside_the_steps_gpu_ranges_count():
    """With the steps' GPU-side ranges in the trace, what ran between two steps stays out."""
    events = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#7", "ts": 0, "dur": 3000},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#8", "ts": 10000, "dur": 2000},
        kernel("nvjet_tst_a", 0, 2500),
        kernel("nvjet_tst_a", 10000, 2000),
        kernel("Memcpy HtoD (Pageable -> Device)", 5000, 4000, cat="gpu_memcpy"),  # the next batch, between the steps
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 1, "dur": 3},
    ]
    s = tk.summarize(events)
    assert s.steps == 2 and s.ms_per_step == {"matmul (cuBLAS/CUTLASS)": pytest.approx(2.25)}
    assert s.span_ms == pytest.approx(5.0) and s.busy_ms == pytest.approx(4.5) and s.idle_ms_per_step == pytest.approx(0.25)
    assert s.runtime_calls == 1


def test_a_cpu_trace_from_torch_profiler_has_its_steps_and_no_gpu_time(tmp_path):
    f = tmp_path / "cpu.trace.json.gz"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in (3, 4, 5):
            with record_function(f"ProfilerStep#{step}"):
                torch.ones(64, 64) @ torch.ones(64, 64)
    prof.export_chrome_trace(str(f))
    s = tk.summarize(tk.load_events(f))
    assert s.steps == 3 and s.ms_per_step == {} and s.busy_ms == 0.0


def test_a_file_that_is_not_a_trace_is_named(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"something": 1}')
    with pytest.raises(ValueError, match=r"x.json: no traceEvents list"):
        tk.load_events(f)

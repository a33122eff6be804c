"""The collectives sweep on a real embedded local Ray: 2 CPU workers in a gloo process group."""

import pytest

from rayft.benchmarks.collectives import OPS, bus_factor, run_sweep

pytestmark = pytest.mark.integration


def test_sweep_on_two_gloo_workers(ray_local):
    sizes = [4096, 65536]
    r = run_sweep(2, use_gpu=False, sizes_bytes=sizes, warmup_iters=1, timed_iters=3)

    assert (r["backend"], r["world_size"], r["device"], r["dtype"]) == ("gloo", 2, "cpu", "float32")
    assert [(row["op"], row["size_bytes"]) for row in r["results"]] == [(op, s) for op in OPS for s in sizes]
    for row in r["results"]:
        assert row["time_ms"] > 0 and row["algbw_GB_s"] > 0
        assert row["algbw_GB_s"] == pytest.approx(row["size_bytes"] / (row["time_ms"] / 1e3) / 1e9)
        assert row["busbw_GB_s"] == pytest.approx(row["algbw_GB_s"] * bus_factor(row["op"], 2))
    for op in OPS:
        assert r["peak_busbw_GB_s"][op] == max(row["busbw_GB_s"] for row in r["results"] if row["op"] == op)
    # every rank contributed rank + 1: the sums seen on rank 0 are exactly 1 + 2
    for op in OPS:
        assert r["checks"][op] == {"expected_sum": 3.0, "min": 3.0, "max": 3.0}

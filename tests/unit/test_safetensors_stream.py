"""rayft.train.safetensors_stream: a file written one tensor at a time reads back through
safetensors' own readers exactly, and a wrong order, shape or early close is refused."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rayft.train.safetensors_stream import DTYPE_NAMES, SafetensorsStream


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {
        "model.embed_tokens.weight": torch.randn(7, 5, generator=g),
        "model.norm.weight": torch.randn(3, generator=g).to(torch.bfloat16),
        "transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous: written row-major
        "step": torch.tensor(12345678901, dtype=torch.int64),  # 0-d
        "empty": torch.empty(0, 4),
        "mask": torch.tensor([True, False, True]),
        "f16": torch.randn(2, 3, generator=g).half(),
        "fp8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
    }


def test_streamed_file_reads_back_exactly_through_safetensors(tmp_path):
    want = tensors()
    path = tmp_path / "model.safetensors"
    with SafetensorsStream(path, {k: (v.dtype, tuple(v.shape)) for k, v in want.items()}, {"format": "pt"}) as s:
        for k, v in want.items():
            s.write(k, v)
    got = load_file(str(path))
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].reshape(-1).view(torch.uint8), v.contiguous().reshape(-1).view(torch.uint8)), k  # bit for bit
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert torch.equal(f.get_slice("model.embed_tokens.weight")[2:4], want["model.embed_tokens.weight"][2:4])
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_len) % 8 == 0  # the data starts 8-byte aligned
    assert path.stat().st_size == 8 + header_len + sum(v.numel() * v.element_size() for v in want.values())


@pytest.mark.parametrize("dtype", sorted(DTYPE_NAMES, key=str))
def test_every_named_dtype_reads_back_bit_for_bit_without_metadata(dtype, tmp_path):
    raw = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4)
    if dtype == torch.bool:
        t = raw % 3 == 0
    else:  # every byte pattern of the dtype's size: the bits, not the values, are what must survive
        t = torch.randint(0, 256, (2, 3, 4 * dtype.itemsize), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)).view(dtype)
    path = tmp_path / "one.safetensors"
    with SafetensorsStream(path, {"t": (t.dtype, tuple(t.shape))}) as s:
        s.write("t", t)
    got = load_file(str(path))["t"]
    assert got.dtype == dtype and got.shape == t.shape
    assert torch.equal(got.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() is None


def test_wrong_order_shape_dtype_or_early_close_is_refused_and_leaves_no_file(tmp_path):
    a, b = torch.zeros(2, 3), torch.ones(4)
    entries = {"a": (a.dtype, (2, 3)), "b": (b.dtype, (4,))}
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match=r"x.safetensors: got tensor 'b', expected 'a'"), SafetensorsStream(path, entries) as s:
        s.write("b", b)
    assert not path.exists()
    with (
        pytest.raises(ValueError, match=r"tensor 'a' is torch.float32 \(3, 2\), its entry says torch.float32 \(2, 3\)"),
        SafetensorsStream(path, entries) as s,
    ):
        s.write("a", a.t())
    with pytest.raises(ValueError, match=r"tensor 'a' is torch.float64"), SafetensorsStream(path, entries) as s:
        s.write("a", a.double())
    s = SafetensorsStream(path, entries)
    s.write("a", a)
    with pytest.raises(ValueError, match=r"closed with 1 tensor\(s\) not written, first 'b'"):
        s.close()
    s.abort()
    assert not path.exists()
    with pytest.raises(ValueError, match=r"tensor 'c' has dtype torch.complex64, which safetensors cannot store"):
        SafetensorsStream(path, {"c": (torch.complex64, (2,))})
    with pytest.raises(ValueError, match=r"metadata holds strings only"):
        SafetensorsStream(path, entries, {"step": 3})
    with SafetensorsStream(path, entries) as s:
        s.write("a", a)
        s.write("b", b)
        with pytest.raises(ValueError, match=r"got tensor 'a', expected 'nothing more'"):
            s.write("a", a)
    assert set(load_file(str(path))) == {"a", "b"}


FILE_SIZE_LIMITED = r"""
import resource, signal, sys, threading, torch
from rayft.train.safetensors_stream import SafetensorsStream
path, limit, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write then fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # files of `limit` bytes at most: a disk that fills up
parts = [torch.full((64, 1024), float(i)) for i in range(n)]  # 256 KiB each
try:
    with SafetensorsStream(path, {f"t{i}": (p.dtype, tuple(p.shape)) for i, p in enumerate(parts)}) as s:
        for i, p in enumerate(parts):
            s.write(f"t{i}", p)
except OSError as e:
    print("RAISED", type(e).__name__, e.errno)
print("THREADS", sorted(t.name for t in threading.enumerate() if t.name.startswith("safetensors-writer")))
try:
    s.write("t0", parts[0])
except ValueError as e:
    print("AFTER", e)
"""


def write_file_size_limited(path, limit: int, n: int) -> str:
    """Stream ``n`` tensors of 256 KiB into ``path`` in a process whose files may hold ``limit``
    bytes (RLIMIT_FSIZE: the kernel's own EFBIG, as a full disk gives ENOSPC); its output."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMITED, str(path), str(limit), str(n)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout + out.stderr[-2000:]


def test_a_failed_write_in_the_writer_thread_reaches_the_caller_and_leaves_no_file(tmp_path):
    """The writer thread's own failure is raised to the caller by a later write, the partial file
    is deleted, the thread is gone, and a write after that is refused instead of waiting forever."""
    import errno

    path = tmp_path / "big.safetensors"
    out = write_file_size_limited(path, 1 << 20, 8)  # the fifth tensor fails, three more follow
    assert f"RAISED OSError {errno.EFBIG}" in out and "THREADS []" in out, out
    assert "write after the stream was closed or aborted" in out
    assert not path.exists()


def test_a_failure_of_the_last_tensor_surfaces_at_close_and_the_with_block_deletes_the_file(tmp_path):
    """The writer thread's failure on the last tensor is raised by close() at the with block's end,
    which then deletes the partial file."""
    import errno

    path = tmp_path / "last.safetensors"
    out = write_file_size_limited(path, 900 << 10, 4)  # room for 3 of the 4 tensors
    assert f"RAISED OSError {errno.EFBIG}" in out and "THREADS []" in out, out
    assert not path.exists()


def test_many_large_tensors_through_the_writer_thread_land_in_order_bit_for_bit(tmp_path):
    """Tensors queued faster than one is written (each one's writeback started as it lands) read
    back bit for bit at their header's offsets; no writer thread outlives close."""
    import json
    import threading

    want = {f"w{i}": torch.randn(256, 1024, generator=torch.Generator().manual_seed(i)) for i in range(6)}  # 1 MiB each
    path = tmp_path / "model.safetensors"
    with SafetensorsStream(path, {k: (v.dtype, tuple(v.shape)) for k, v in want.items()}) as s:
        for k, v in want.items():
            s.write(k, v)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert [header[k]["data_offsets"][0] for k in want] == [i * (1 << 20) for i in range(6)]
    for k, v in want.items():
        begin, end = header[k]["data_offsets"]
        assert torch.equal(torch.frombuffer(bytearray(raw[8 + n + begin : 8 + n + end]), dtype=torch.float32).reshape(256, 1024), v), k
    assert not [t for t in threading.enumerate() if t.name.startswith("safetensors-writer")]


def test_the_host_holds_at_most_two_copies_while_the_writer_is_slow(tmp_path, monkeypatch):
    """With the disk slower than the copies, a third write waits until the first tensor is written:
    never more than two host copies queued or being written."""
    import threading
    import time

    from rayft.train import safetensors_stream

    alive, peak, lock = [0], [0], threading.Lock()

    real_to = torch.Tensor.to

    def counting_to(self, *a, **k):
        out = real_to(self, *a, **k).clone()  # a fresh host copy, as a device tensor's would be
        with lock:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
        import weakref

        weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
        return out

    slow = safetensors_stream.start_writeback

    def slow_writeback(fd, offset, nbytes):
        time.sleep(0.05)  # a disk slower than the copies
        return slow(fd, offset, nbytes)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    monkeypatch.setattr(safetensors_stream, "start_writeback", slow_writeback)
    want = {f"w{i}": torch.full((256, 256), float(i)) for i in range(8)}
    with SafetensorsStream(tmp_path / "m.safetensors", {k: (v.dtype, tuple(v.shape)) for k, v in want.items()}) as s:
        for k, v in want.items():
            s.write(k, v)
    assert peak[0] == 2
    assert torch.equal(load_file(str(tmp_path / "m.safetensors"))["w7"], want["w7"])

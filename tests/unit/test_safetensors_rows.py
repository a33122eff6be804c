"""Reading rows back from safetensors files written by safetensors itself (rayft.train.safetensors_rows)."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from safetensors.torch import save_file

from rayft.train import safetensors_rows
from rayft.train.safetensors_rows import LayoutError, RowComparer, read_layout, tensor_gap

CPU = torch.device("cpu")


@pytest.fixture
def stored(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a": torch.randn(7, 5, generator=g),
        "b": torch.randn(3, 4, 2, generator=g).to(torch.bfloat16),
        "s": torch.tensor(2.5),
        "e": torch.empty(0, 3),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path, tensors


def test_layout_matches_what_safetensors_wrote(stored):
    path, tensors = stored
    start, entries = read_layout(path)
    assert set(entries) == set(tensors)  # __metadata__ left out
    raw = path.read_bytes()
    for name, t in tensors.items():
        assert entries[name]["shape"] == list(t.shape)
        begin, end = entries[name]["data_offsets"]
        assert end - begin == t.numel() * t.element_size()
        assert raw[start + begin : start + end] == t.reshape(-1).view(torch.uint8).numpy().tobytes()


# through the file's mapping (host tensors), and through the buffer as GPU tensors are read: one read
# per tensor, or 8-byte reads (several per tensor, a short last one)
@pytest.mark.parametrize("through_buffer,chunk", [(False, None), (True, 1 << 20), (True, 8)])
def test_rows_equal_and_unequal(stored, monkeypatch, through_buffer, chunk):
    if chunk:
        monkeypatch.setattr(safetensors_rows, "READ_CHUNK", chunk)
    path, tensors = stored
    start, entries = read_layout(path)
    cmp = RowComparer(through_buffer=through_buffer)
    a = tensors["a"]
    for rows in [(0, 7), (2, 5), (6, 7)]:
        assert cmp.gap(path, start, entries["a"], "a", rows, a[rows[0] : rows[1]].contiguous()) == 0.0
    assert cmp.gap(path, start, entries["b"], "b", (1, 3), tensors["b"][1:3].contiguous()) == 0.0
    assert cmp.gap(path, start, entries["s"], "s", (0, 1), tensors["s"].reshape(1)) == 0.0
    changed = a[2:5].clone()
    changed[1, 3] += 0.75
    assert cmp.gap(path, start, entries["a"], "a", (2, 5), changed) == pytest.approx(0.75, abs=1e-6)
    changed[2, 4] = float("nan")
    assert cmp.gap(path, start, entries["a"], "a", (2, 5), changed) == math.inf


@pytest.mark.parametrize("through_buffer", [False, True])
def test_nan_in_both_counts_as_equal(tmp_path, through_buffer):
    t = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    path = tmp_path / "n.safetensors"
    save_file({"t": t}, str(path))
    start, entries = read_layout(path)
    assert RowComparer(through_buffer=through_buffer).gap(path, start, entries["t"], "t", (0, 2), t.clone()) == 0.0


def test_wrong_dtype_or_shape_or_rows_named(stored):
    path, tensors = stored
    start, entries = read_layout(path)
    cmp = RowComparer()
    with pytest.raises(LayoutError, match=r"x\.safetensors: a is stored as F32, the trained tensor is torch.float64"):
        cmp.gap(path, start, entries["a"], "a", (0, 7), tensors["a"].double())
    with pytest.raises(LayoutError, match=r"a is stored with shape \[7, 5\]"):
        cmp.gap(path, start, entries["a"], "a", (0, 7), torch.zeros(7, 4))
    with pytest.raises(LayoutError, match=r"rows 0:3 compared with a tensor of 2 rows"):
        cmp.gap(path, start, entries["a"], "a", (0, 3), tensors["a"][:2].contiguous())
    with pytest.raises(LayoutError, match=r"rows 5:9"):
        cmp.gap(path, start, entries["a"], "a", (5, 9), torch.zeros(4, 5))


@pytest.mark.parametrize("through_buffer", [False, True])
def test_a_file_of_another_size_than_its_header_says_is_named(stored, tmp_path, through_buffer):
    path, tensors = stored
    start, entries = read_layout(path)
    short = tmp_path / "short.safetensors"
    short.write_bytes(path.read_bytes()[: start + entries["a"]["data_offsets"][0] + 20])
    with pytest.raises(LayoutError, match=r"short\.safetensors: [\d,]+ bytes, its header describes"):
        read_layout(short)  # every rank sees it, whichever rows it reads
    with pytest.raises(LayoutError, match=r"short\.safetensors: ends"):  # a file cut after its header was read
        RowComparer(through_buffer=through_buffer).gap(short, start, entries["a"], "a", (0, 7), tensors["a"])
    longer = tmp_path / "longer.safetensors"
    longer.write_bytes(path.read_bytes() + b"\0" * 8)
    with pytest.raises(LayoutError, match=r"longer\.safetensors: [\d,]+ bytes, its header describes"):
        read_layout(longer)


def test_bad_headers_named(tmp_path):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(struct.pack("<Q", 5) + b"{oops")
    with pytest.raises(LayoutError, match=r"junk\.safetensors: the header is not JSON"):
        read_layout(junk)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(struct.pack("<Q", 500) + b"{}")
    with pytest.raises(LayoutError, match=r"cut\.safetensors: the header says 500 bytes, the file ends after 2"):
        read_layout(cut)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(LayoutError, match=r"huge\.safetensors: a header of"):
        read_layout(huge)
    for offsets in ([8, 4], [-4, 4], [True, 4], "0-4", None):
        bad = tmp_path / "offsets.safetensors"
        text = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": offsets}}).encode()
        bad.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
        with pytest.raises(LayoutError, match=r"offsets\.safetensors: t has data_offsets"):
            read_layout(bad)


def test_gap_is_over_the_values_that_differ():
    inf, nan = math.inf, math.nan
    assert tensor_gap(torch.tensor([inf, 1.0, 2.0]), torch.tensor([inf, 100.0, 2.0])) == 99.0  # not NaN from inf - inf
    assert tensor_gap(torch.tensor([inf, nan]), torch.tensor([inf, nan])) == 0.0
    assert tensor_gap(torch.tensor([inf, 1.0]), torch.tensor([-inf, 1.0])) == inf
    assert tensor_gap(torch.tensor([inf, 1.0]), torch.tensor([5.0, 1.0])) == inf
    assert tensor_gap(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0])) == inf

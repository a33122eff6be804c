"""rayft.train.writeback: the early-writeback hint is really asked of the kernel for a regular file
on Linux, refused where it cannot apply, and asked once per chunk written."""

from __future__ import annotations

import os
import sys

import pytest

from rayft.train.writeback import SYNC_FILE_RANGE, WritebackTracker, start_writeback

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


@linux_only
def test_the_kernel_takes_the_hint_for_a_file_and_refuses_it_for_a_pipe(tmp_path):
    assert SYNC_FILE_RANGE is not None
    with open(tmp_path / "f.bin", "wb") as f:
        f.write(b"x" * (1 << 20))
        f.flush()
        assert start_writeback(f.fileno(), 0, 1 << 20) is True
        assert start_writeback(f.fileno(), 0, 0) is False  # nothing to ask for
    r, w = os.pipe()
    try:
        assert start_writeback(w, 0, 4096) is False  # ESPIPE: a pipe has no pages to write out
    finally:
        os.close(r)
        os.close(w)


def test_the_tracker_asks_once_per_chunk_from_where_it_last_asked(tmp_path):
    with open(tmp_path / "f.bin", "wb") as f:
        t = WritebackTracker(f.fileno(), start=100, chunk=1000)
        for position, asked_to in ((600, 100), (1099, 100), (1100, 1100), (1500, 1100), (5000, 5000)):
            f.write(b"y" * (position - f.tell()))
            f.flush()
            t.wrote(position)
            assert t.asked_to == asked_to, position

"""Ingest by tasks (rayft.data.ingest), run in this process: JSON Lines files cut into byte ranges
give exactly the whole-file reader's records, messages (absolute file:line and byte offsets),
notes and skip counts, and the real sample files give the local path's tokens byte for byte."""

import json

import numpy as np
import pytest
from bad_records import BAD_BYTES, BAD_LINES, GOOD, jsonl_with
from conftest import shared_path

from rayft.data.formats import DataError, load_conversations
from rayft.data.ingest import Settings, ingest_part
from rayft.data.ingest_tasks import plan_tasks
from rayft.data.sources import expand_files


def ingest(tmp_path, files, tokenizer=None, chunk=4096, limit=0, **kw):
    st = Settings(str(tmp_path / "store"), 64, **kw)
    return ingest_part(expand_files([str(f) for f in files]), "train", st, tokenizer, limit=limit, chunk_bytes=chunk)


def whole_file_error(path, **kw) -> str:
    with pytest.raises(DataError) as e:
        load_conversations([str(path)], **kw)
    return str(e.value)


@pytest.mark.parametrize("bad", [b.encode() for b in BAD_LINES] + BAD_BYTES, ids=range(len(BAD_LINES) + len(BAD_BYTES)))
def test_every_bad_record_kind_in_a_later_range_gives_the_whole_file_message(tmp_path, bad):
    p = tmp_path / "data.jsonl"
    p.write_bytes(jsonl_with(bad))
    res = ingest(tmp_path, [p])
    assert len([t for t in plan_tasks(expand_files([str(p)]), "train", 4096) if t.kind == "range"]) > 5
    assert res.error is not None and res.error["message"] == whole_file_error(p)
    assert res.error["message"].startswith(f"{p}:301: ")
    assert len(res.summaries) > 1  # found by a later task, numbered from the file's start


def test_the_earliest_bad_record_wins_and_a_range_boundary_inside_a_line(tmp_path):
    p = tmp_path / "two.jsonl"
    p.write_bytes(jsonl_with(b'{"prompt": 1}', before=100, after=0) + jsonl_with(b"[1]", before=200, after=3))
    for chunk in (4096, 97, 1 << 20):  # ranges that cut lines anywhere, and one whole-file task
        res = ingest(tmp_path, [p], chunk=chunk)
        assert res.error["message"] == whole_file_error(p) and ":101: unknown record format" in res.error["message"]


def test_skip_counts_notes_and_every_location_match_the_whole_file_reader(tmp_path):
    lines = []
    for i in range(900):
        lines.append(BAD_LINES[i % 5].encode() if i % 7 == 3 else GOOD.encode())
        if i % 50 == 0:
            lines.append(b"  ")  # blank lines are counted in the note
    body = b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n\r\n\n"
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(body)
    ref = load_conversations([str(p)], on_bad_record="skip")
    res = ingest(tmp_path, [p], chunk=2000, on_bad_record="skip")
    assert len(res.summaries) > 10 and res.error is None
    assert res.records == ref.records and res.accepted == len(ref)
    assert {k: (s.count, s.where, s.reason) for k, s in res.skipped().items()} == {
        k: (s.count, s.where, s.reason) for k, s in ref.skipped.items()
    }
    assert res.notes() == ref.notes == [f"{p}: tolerated: a UTF-8 BOM at the start, 18 blank lines, CRLF line endings"]
    where = [row["where"] for row in res.skip_locations(str(tmp_path / "store"))]
    assert where == [f"{p}:{n}" for n, line in enumerate(lines, 1) if line not in (GOOD.encode(), b"  ")]


def test_many_skips_in_one_task_go_to_a_file_of_the_store(tmp_path):
    from rayft.data.ingest import SKIP_INLINE

    p = tmp_path / "bad.jsonl"
    p.write_text("2\n" * (SKIP_INLINE + 5) + GOOD + "\n")
    res = ingest(tmp_path, [p], chunk=1 << 20, on_bad_record="skip")
    assert res.summaries[0]["skip_file"] == "train/000000.skipped.jsonl" and res.summaries[0]["skip_where"] == []
    rows = list(res.skip_locations(str(tmp_path / "store")))
    assert len(rows) == SKIP_INLINE + 5 and rows[-1] == {
        "where": f"{p}:{SKIP_INLINE + 5}",
        "kind": "not_an_object",
        "reason": "a record must be a JSON object, got int",
    }


def test_json_suffix_files_cut_only_when_they_hold_json_lines(tmp_path):
    rec = {"instruction": "a", "output": "b"}
    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(rec) for _ in range(200)) + "\n")
    array = tmp_path / "array.json"
    array.write_text("[\n" + ",\n".join(json.dumps(rec) for _ in range(200)) + "\n]\n")
    one = tmp_path / "one.json"
    one.write_text(json.dumps({**rec, "output": "b" * 9000}, indent=2))
    kinds = [t.kind for t in plan_tasks(expand_files([str(lines), str(array), str(one)]), "train", 1024)]
    assert kinds.count("range") > 3 and kinds[-2:] == ["file", "file"]
    res = ingest(tmp_path, [lines, array, one], chunk=1024)
    assert res.error is None and res.accepted == 401


def test_parquet_row_groups_number_rows_over_the_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"instruction": f"i{i}", "output": "o"} for i in range(50)] + [{"instruction": "x"}] + [{"instruction": "j", "output": "o"}]
    p = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=7)
    tasks = plan_tasks(expand_files([str(p)]), "train", 1)
    assert [t.kind for t in tasks] == ["parquet"] * 8 and tasks[7].first_row == 49
    res = ingest(tmp_path, [p], chunk=1)
    assert res.error["message"] == whole_file_error(p) == f"{p}:row 50: missing field 'output'"


def test_real_files_in_many_ranges_equal_the_local_path(tmp_path, qwen_tokenizer):
    from rayft.data.token_store import PartIndex
    from rayft.data.token_view import StoreView
    from rayft.data.tokenize import tokenize_dataset

    files = [shared_path("data", f) for f in ("alpaca_zh_demo.json", "c4_demo.jsonl")]
    ref = tokenize_dataset(qwen_tokenizer, list(load_conversations([str(f) for f in files])), 256)
    st = Settings(str(tmp_path / "store"), 256)
    res = ingest_part(expand_files([str(f) for f in files]), "train", st, qwen_tokenizer, chunk_bytes=50_000)
    assert len(res.summaries) == 1 + 15 and res.error is None
    index = PartIndex.read(st.location, res.shards)
    view = StoreView(st.location, "train", res.shards, np.arange(len(index.lengths)), index.lengths, "")
    got = view.to_dataset()
    for k in ("tokens", "trainable", "offsets"):
        assert getattr(got, k).dtype == getattr(ref, k).dtype and getattr(got, k).tobytes() == getattr(ref, k).tobytes(), k
    assert int(np.count_nonzero(index.flags & 2)) == ref.split_documents and int(np.count_nonzero(index.flags & 1)) == ref.truncated

"""Ingest with Ray Data (embedded local Ray, 2 CPUs) gives the local path's arrays, byte for byte, on
the real sample files (English and Chinese alpaca, raw web text split into chunks) cut into many
byte-range tasks; every bad-record kind keeps its exact message, the earliest bad record wins."""

import json

import numpy as np
import pytest
from bad_records import BAD_BYTES, BAD_LINES, GOOD
from conftest import shared_path
from rich.console import Console

from rayft.config_load import load_config
from rayft.data.formats import DataError, load_conversations
from rayft.data.ingest import RAY_MIN_INPUT_BYTES, Settings, ingest_part, use_ray
from rayft.data.sources import expand_files
from rayft.data.token_store import PartIndex
from rayft.data.token_view import StoreView
from rayft.data.tokenize import tokenize_dataset

pytestmark = pytest.mark.integration


def assert_identical(a, b):
    for k in ("tokens", "trainable", "offsets"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k


def ray_ingest(tmp_path, files, tokenizer, seq_len=256, chunk=50_000, **kw):
    st = Settings(str(tmp_path / "store"), seq_len, **kw)
    res = ingest_part(expand_files([str(f) for f in files]), "train", st, tokenizer, use_ray_data=True, chunk_bytes=chunk)
    return st, res


def test_ray_data_path_equals_local_path_on_real_files(ray_local, qwen_tokenizer, tmp_path):
    files = [shared_path("data", f) for f in ("alpaca_zh_demo.json", "c4_demo.jsonl", "alpaca_en_demo.json")]
    examples = list(load_conversations([str(f) for f in files]))
    assert len(examples) == 2299
    local = tokenize_dataset(qwen_tokenizer, examples, 256)
    st, res = ray_ingest(tmp_path, files, qwen_tokenizer)  # c4_demo.jsonl in 15 byte ranges: 17 tasks on 2 actors
    assert res.mode == "ray" and len(res.summaries) == 17 and res.error is None
    index = PartIndex.read(st.location, res.shards)
    remote = StoreView(st.location, "train", res.shards, np.arange(len(index.lengths)), index.lengths, "").to_dataset()
    assert_identical(local, remote)
    assert local.truncated > 100 and local.split_documents > 100 and len(local) > len(examples)  # both rules in play


def test_every_bad_record_kind_keeps_its_message_through_ray(ray_local, qwen_tokenizer, tmp_path):
    lines = [GOOD.encode()] * 30
    for k, bad in enumerate([b.encode() for b in BAD_LINES] + BAD_BYTES):
        lines += [bad] + [GOOD.encode()] * (20 + k)
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    st, res = ray_ingest(tmp_path, [p], qwen_tokenizer, chunk=3000, on_bad_record="skip")
    assert len(res.summaries) > 10 and res.error is None
    rows = list(res.skip_locations(st.location))
    assert len(rows) == load_conversations([str(p)], on_bad_record="skip").num_skipped == len(BAD_LINES) + len(BAD_BYTES)
    # each skipped record's message (where: reason) is the whole-file reader's error for that record
    assert [f"{row['where']}: {row['reason']}" for row in rows] == whole_file_errors(p)


def whole_file_errors(path) -> list[str]:
    """The message of every bad record of ``path`` as the whole-file reader gives it."""
    from pathlib import Path

    from rayft.data.readers import file_records
    from rayft.data.records import to_example

    out = []
    for _n, where, value in file_records(Path(path)):
        try:
            if isinstance(value, DataError):
                raise value
            to_example(value, where)
        except DataError as e:
            out.append(str(e))
    return out


def test_the_earliest_bad_record_wins_across_ray_tasks(ray_local, qwen_tokenizer, tmp_path):
    p = tmp_path / "two.jsonl"
    good = (GOOD + "\n").encode()
    p.write_bytes(good * 600 + b'{"prompt": 1}\n' + good * 10 + b"[1]\n" + good * 5)
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    _, res = ray_ingest(tmp_path, [p], qwen_tokenizer, chunk=4000)  # the later bad record's task is shorter: it may finish first
    assert res.error["message"] == str(e.value) and str(e.value).startswith(f"{p}:601: unknown record format")


def test_ray_path_reports_a_tokenization_error_like_the_local_path(ray_local, qwen_tokenizer, tmp_path):
    from rayft.data.formats import TextDocument

    eos = qwen_tokenizer.eos_token_id
    qwen_tokenizer.eos_token = None  # a raw-text document then cannot be ended
    try:
        p = tmp_path / "docs.jsonl"
        p.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(50)))
        with pytest.raises(DataError) as local:
            tokenize_dataset(qwen_tokenizer, [TextDocument(f"doc {i}", f"{p}:{i + 1}") for i in range(50)], 64)
        _, res = ray_ingest(tmp_path, [p], qwen_tokenizer, chunk=100)
        assert (
            res.tokenize_error["message"] == str(local.value) == f"{p}:1: the tokenizer has no EOS token, needed to end raw-text documents"
        )
    finally:
        qwen_tokenizer.eos_token = qwen_tokenizer.convert_ids_to_tokens(eos)


def test_prepare_data_with_preprocess_ray(ray_local, tmp_path):
    from rayft.train.driver import load_run_data

    src = shared_path("data", "alpaca_en_demo.json")
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        f"data: {{train_files: [{src}], seq_len: 128, preprocess: ray, cache_dir: null, validation_fraction: 0.1}}\n"
        "train: {num_workers: 1, use_gpu: false}\n"
    )
    console = Console(record=True, width=400)
    d = load_run_data(load_config(cfg_file), console)
    out = console.export_text()
    assert out.count("with Ray Data on 2 CPUs") == 1  # one ingest; the validation records are a selection of it
    local = load_run_data(load_config(cfg_file, ["data.preprocess=local"]), Console(quiet=True))
    assert_identical(d.train.to_dataset(), local.train.to_dataset())
    assert_identical(d.validation.to_dataset(), local.validation.to_dataset())
    assert d.train.fingerprint == local.train.fingerprint
    assert len(d.validation) == 100 and len(d.train) == 895  # 999 = 899 + 100 records, 4 examples dropped


def test_auto_uses_ray_only_when_it_pays():
    assert use_ray("auto", RAY_MIN_INPUT_BYTES, None) and use_ray("auto", RAY_MIN_INPUT_BYTES, 8)
    assert not use_ray("auto", RAY_MIN_INPUT_BYTES - 1, 64) and not use_ray("auto", 10**12, 1)
    assert use_ray("ray", 1, 1) and not use_ray("local", 10**12, 64)

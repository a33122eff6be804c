"""The token store (a hit reads and tokenizes nothing, a miss on every input that matters, a
missing or truncated shard or a bad manifest rebuilt), the validation split, max_examples and the
config keys. Ingest runs locally here (data.preprocess: local)."""

import json
import os

import numpy as np
import pytest
from rich.console import Console

from rayft.config import ConfigError
from rayft.config_load import load_config
from rayft.data import cache as cache_lib
from rayft.data import token_store as ts
from rayft.data.formats import DataError
from rayft.data.prepare import prepare_data, split_validation

RECORDS = [
    {"messages": [{"role": "user", "content": f"Add {a} and {b}."}, {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}
    for a, b in [(1, 2), (30, 4), (7, 7), (12, 50), (9, 0), (3, 3), (8, 1), (40, 2)]
]


def job(tmp_path, *overrides, records=RECORDS):
    data = tmp_path / "chat.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        f"data: {{train_files: [chat.jsonl], seq_len: 64, preprocess: local, cache_dir: {tmp_path / 'cache'}}}\n"
        "train: {num_workers: 1, use_gpu: false}\n"
    )
    return load_config(cfg_file, list(overrides))


SESSION = {}  # the session's tokenizer (conftest's qwen_tokenizer), handed to every prepare_data call


@pytest.fixture(autouse=True)
def _shared_tokenizer(qwen_tokenizer):
    SESSION["tokenizer"] = qwen_tokenizer


def run(cfg, **kw):
    console = Console(record=True, width=400)
    d = prepare_data(cfg, console, SESSION["tokenizer"], "qwen2.5", **kw)
    return d, console.export_text().splitlines()


def arrays(view) -> dict:
    """The selected examples as flat arrays (tokens, trainable, offsets)."""
    ds = view.to_dataset()
    return {k: getattr(ds, k) for k in ("tokens", "trainable", "offsets")}


def same(a, b) -> bool:
    x, y = arrays(a), arrays(b)
    return all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x)


def test_second_run_uses_the_store_without_reading_the_files(tmp_path, monkeypatch):
    cfg = job(tmp_path)
    first, out1 = run(cfg)
    assert first.cache == "miss" and len(first.train) == 8
    entries = [p for p in (tmp_path / "cache").iterdir()]
    assert len(entries) == 1 and (entries[0] / "manifest.json").exists() and not entries[0].name.startswith(".")
    assert first.store == str(entries[0]) and out1[-1] == f"data: wrote the tokenized store {entries[0]}"
    assert sorted(p.name for p in (entries[0] / "train").iterdir()) == sorted(f"000000-000.{k}.npy" for k, _ in ts.SHARD_ARRAYS)
    mtimes = {p: p.stat().st_mtime_ns for p in entries[0].rglob("*")}

    import rayft.data.ingest

    def no_reading(*a, **k):
        raise AssertionError("the files were read despite a store hit")

    monkeypatch.setattr(rayft.data.ingest, "ingest_part", no_reading)
    monkeypatch.setattr(rayft.data.tokenize, "tokenize_example", no_reading)
    second, out2 = run(cfg)
    assert second.cache == "hit" and same(first.train, second.train) and second.fingerprint == first.fingerprint
    # the first run's report is printed again, then where it came from
    assert out2 == [*out1[:-1], f"data: used the tokenized store {entries[0]} (no file read or tokenized)"]
    assert {p: p.stat().st_mtime_ns for p in entries[0].rglob("*")} == mtimes  # nothing rewritten


def test_cache_dir_null_puts_the_store_in_the_run_directory(tmp_path):
    d, _ = run(job(tmp_path, "data.cache_dir=null"), run_dir=str(tmp_path / "runs" / "r"))
    assert d.cache == "miss" and not (tmp_path / "cache").exists()
    assert d.store.startswith(str(tmp_path / "runs" / "r" / "tokenized") + "/") and (tmp_path / "runs/r/tokenized").is_dir()
    again, out = run(job(tmp_path, "data.cache_dir=null"), run_dir=str(tmp_path / "runs" / "r"))  # a resumed run finds it
    assert again.cache == "hit" and out[-1].startswith("data: used the tokenized store")
    lib, _ = run(job(tmp_path, "data.cache_dir=null"))  # a library call without a run directory: a temporary store
    assert lib.cache == "miss" and "rayft-tokenized-" in lib.store and same(lib.train, d.train)


def test_every_input_that_changes_tokens_changes_the_key(tmp_path, qwen_tokenizer):
    from rayft.data.tokenizer import CHATML_TEMPLATE

    base = job(tmp_path)
    key0, hashed = cache_lib.cache_key(base.data, qwen_tokenizer, "qwen2.5")
    assert hashed["train_files"] == [
        {
            "path": str((tmp_path / "chat.jsonl").resolve()),
            "sha256": __import__("hashlib").sha256((tmp_path / "chat.jsonl").read_bytes()).hexdigest(),
        }
    ]
    # the same bytes under another path are another entry: the cached report lines name the file
    moved = tmp_path / "elsewhere.jsonl"
    moved.write_bytes((tmp_path / "chat.jsonl").read_bytes())
    assert cache_lib.cache_key(job(tmp_path, f"data.train_files=[{moved}]").data, qwen_tokenizer, "qwen2.5")[0] != key0
    keys = {"base": key0}
    for o in [
        "data.seq_len=65",
        "data.format=messages",
        "data.max_examples=7",
        "data.on_bad_record=skip",
        "data.columns={content: text}",
        "data.placeholders={name: Rayft}",
        "data.validation_fraction=0.25",
        "data.validation_files=[chat.jsonl]",
    ]:
        keys[o] = cache_lib.cache_key(job(tmp_path, o).data, qwen_tokenizer, "qwen2.5")[0]
    # settings that do not change tokens keep the key
    for o in ["data.preprocess=ray", "data.shuffle=false", "data.packing=false", "train.lr=0.1"]:
        assert cache_lib.cache_key(job(tmp_path, o).data, qwen_tokenizer, "qwen2.5")[0] == key0, o
    # the seed matters only with a fraction split
    assert cache_lib.cache_key(job(tmp_path, "data.seed=3").data, qwen_tokenizer, "qwen2.5")[0] == key0
    frac = job(tmp_path, "data.validation_fraction=0.25", "data.seed=3").data
    keys["fraction seed 3"] = cache_lib.cache_key(frac, qwen_tokenizer, "qwen2.5")[0]
    # the tokenizer: its name, its chat template
    keys["name"] = cache_lib.cache_key(base.data, qwen_tokenizer, "other")[0]
    qwen_tokenizer.chat_template = CHATML_TEMPLATE.replace("<|im_start|>system", "<|im_start|>system ")
    try:
        keys["template"] = cache_lib.cache_key(base.data, qwen_tokenizer, "qwen2.5")[0]
    finally:
        qwen_tokenizer.chat_template = CHATML_TEMPLATE
    assert cache_lib.cache_key(base.data, qwen_tokenizer, "qwen2.5")[0] == key0
    # one byte of the file (same size)
    f = tmp_path / "chat.jsonl"
    f.write_bytes(f.read_bytes().replace(b"30 + 4 = 34", b"30 + 4 = 35"))
    keys["file byte"] = cache_lib.cache_key(base.data, qwen_tokenizer, "qwen2.5")[0]
    assert len(set(keys.values())) == len(keys), keys


def test_changed_byte_seq_len_or_template_misses_end_to_end(tmp_path, monkeypatch):
    cfg = job(tmp_path)
    first, _ = run(cfg)
    assert run(cfg)[0].cache == "hit"
    assert run(job(tmp_path, "data.seq_len=63"))[0].cache == "miss"  # no example is that long: same tokens, still a new entry

    import rayft.data.tokenizer as tk

    tokenizer = SESSION["tokenizer"]
    tokenizer.chat_template = tk.CHATML_TEMPLATE.replace("<|im_end|>\\n", "<|im_end|>\\n\\n")
    try:
        changed, _ = run(cfg)
    finally:
        tokenizer.chat_template = tk.CHATML_TEMPLATE
    assert changed.cache == "miss" and not same(changed.train, first.train)

    f = tmp_path / "chat.jsonl"
    f.write_bytes(f.read_bytes().replace(b"30 + 4 = 34", b"30 + 4 = 35"))
    edited, _ = run(cfg)
    assert edited.cache == "miss" and not same(edited.train, first.train)
    assert len(list((tmp_path / "cache").iterdir())) == 4


def test_max_examples_gives_the_first_records_and_their_report_line(tmp_path):
    from rayft.data.formats import load_conversations
    from rayft.data.tokenize import tokenize_dataset

    d, out = run(job(tmp_path, "data.max_examples=5", "data.validation_fraction=0.25", "data.seed=1"))
    train_ex, val_ex = split_validation(list(load_conversations([str(tmp_path / "chat.jsonl")]))[:5], 0.25, seed=1)
    for view, ex in ((d.train, train_ex), (d.validation, val_ex)):
        ref = tokenize_dataset(d.tokenizer, ex, 64)
        assert all(np.array_equal(arrays(view)[k], getattr(ref, k)) for k in ("tokens", "trainable", "offsets"))
    assert out[0].startswith("data: 4 records → 4 examples, ") and out[1].startswith("validation (data.validation_fraction=0.25 of")
    assert out[1].split(": ", 1)[1].startswith("1 records → 1 examples")


@pytest.mark.parametrize("damage", ["missing shard", "truncated shard", "manifest json", "manifest key", "manifest size", "no manifest"])
def test_a_broken_store_is_detected_with_a_warning_and_rebuilt(tmp_path, damage):
    cfg = job(tmp_path)
    first, _ = run(cfg)
    entry = next((tmp_path / "cache").iterdir())
    shard = entry / "train" / "000000-000.tokens.npy"
    manifest = entry / "manifest.json"
    if damage == "missing shard":
        shard.unlink()
    elif damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "manifest json":
        manifest.write_text("{")
    elif damage == "manifest key":
        m = json.loads(manifest.read_text())
        m["key"] = "0" * 64
        manifest.write_text(json.dumps(m))
    elif damage == "manifest size":
        m = json.loads(manifest.read_text())
        m["parts"]["train"]["shards"][0]["files"]["trainable"]["size"] += 1
        manifest.write_text(json.dumps(m))
    else:
        manifest.unlink()  # a build that did not finish: rebuilt without a warning
    if damage != "no manifest":
        with pytest.raises(ts.StoreError):
            ts.open_store(str(entry), entry.name)
    again, out = run(cfg)
    assert again.cache == "miss" and same(again.train, first.train)
    if damage == "no manifest":
        assert not out[0].startswith("warning")
    else:
        assert out[0].startswith(f"warning: ignoring a broken tokenized store, rebuilding it: {entry}")
    assert run(cfg)[0].cache == "hit"  # the rebuilt store is good


def test_a_store_detects_damage_by_listing_only(tmp_path, monkeypatch):
    """Opening reads the manifest and the small index arrays, never a tokens or trainable file."""
    cfg = job(tmp_path)
    run(cfg)
    entry = next((tmp_path / "cache").iterdir())
    read = []
    real = ts.read_array
    monkeypatch.setattr(ts, "read_array", lambda loc, rel, *a, **k: read.append(rel) or real(loc, rel, *a, **k))
    store = ts.open_store(str(entry), entry.name)
    assert store.parts["train"].records == 8 and read and not any(r.endswith((".tokens.npy", ".trainable.npy")) for r in read)


def test_validation_fraction_split_is_deterministic_and_cached(tmp_path):
    train, val = split_validation(list(range(10)), 0.25, seed=0)
    assert len(val) == 2 and sorted(train + val) == list(range(10)) and train == sorted(train) and val == sorted(val)
    assert split_validation(list(range(10)), 0.25, seed=0) == (train, val)
    assert split_validation(list(range(10)), 0.25, seed=1) != (train, val)
    assert split_validation([1, 2], 0.01, seed=0)[1] != []  # at least one held out
    with pytest.raises(DataError, match=r"data.validation_fraction=0.4 of 1 record\(s\) leaves no training record"):
        split_validation([1], 0.4, seed=0)

    cfg = job(tmp_path, "data.validation_fraction=0.25", "data.seed=4")
    d, out = run(cfg)
    assert (len(d.train), len(d.validation)) == (6, 2)
    assert out[1].startswith("validation (data.validation_fraction=0.25 of the training records, seed 4): 2 records → 2 examples")
    hit, _ = run(cfg)
    assert hit.cache == "hit" and same(hit.validation, d.validation) and same(hit.train, d.train)
    # the held-out records are exactly the split's, tokenized alone
    from rayft.data.formats import load_conversations
    from rayft.data.tokenize import tokenize_dataset

    train_ex, val_ex = split_validation(list(load_conversations([str(tmp_path / "chat.jsonl")])), 0.25, seed=4)
    ref = tokenize_dataset(d.tokenizer, val_ex, 64)
    assert all(np.array_equal(arrays(d.validation)[k], getattr(ref, k)) for k in ("tokens", "trainable", "offsets"))
    ref = tokenize_dataset(d.tokenizer, train_ex, 64)
    assert all(np.array_equal(arrays(d.train)[k], getattr(ref, k)) for k in ("tokens", "trainable", "offsets"))
    assert d.train.fingerprint != d.validation.fingerprint


def test_validation_files_are_tokenized_separately(tmp_path):
    (tmp_path / "val.jsonl").write_text(json.dumps(RECORDS[0]) + "\n")
    d, out = run(job(tmp_path, "data.validation_files=val.jsonl"))
    assert len(d.train) == 8 and len(d.validation) == 1
    assert np.array_equal(d.validation.example(0)[0], d.train.example(0)[0])
    assert sorted(p.name for p in (tmp_path / "cache").iterdir().__next__().iterdir()) == ["manifest.json", "train", "validation"]
    assert out[1].startswith("validation (data.validation_files): 1 records → 1 examples")


def test_config_errors_name_the_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"give data.validation_files or data.validation_fraction, not both"):
        job(tmp_path, "data.validation_files=[chat.jsonl]", "data.validation_fraction=0.1")
    with pytest.raises(ConfigError, match=r"train.eval_every needs a validation set: data.validation_files or data.validation_fraction"):
        job(tmp_path, "train.eval_every=5")
    with pytest.raises(ConfigError, match=r"data.validation_fraction.*less than 0.5"):
        job(tmp_path, "data.validation_fraction=0.5")
    with pytest.raises(ConfigError, match=r"data.preprocess"):
        job(tmp_path, "data.preprocess=threads")


def test_a_file_changed_while_it_was_read_is_not_kept(tmp_path, monkeypatch):
    import rayft.data.ingest

    cfg = job(tmp_path)
    real_ingest = rayft.data.ingest.ingest_part

    def ingest_then_edit(*a, **k):
        out = real_ingest(*a, **k)
        data = tmp_path / "chat.jsonl"
        data.write_text(data.read_text() + json.dumps(RECORDS[0]) + "\n")  # another writer appends meanwhile
        return out

    monkeypatch.setattr(rayft.data.ingest, "ingest_part", ingest_then_edit)
    d, out = run(cfg)
    assert d.cache == "off" and len(d.train) == 8  # trained on what was read, no manifest: not reused
    assert out[-1] == "warning: an input file changed while it was read; the tokenized store is not kept for later runs"
    assert not any((tmp_path / "cache").glob("*/manifest.json"))


def test_input_stamps_see_a_rewrite_without_hashing(tmp_path):
    from rayft.data.cache import input_stamps

    cfg = job(tmp_path)
    before = input_stamps(cfg.data)
    assert before == input_stamps(cfg.data) and before[0][0].endswith("chat.jsonl") and before[0][1] > 0
    data = tmp_path / "chat.jsonl"
    data.write_text(data.read_text().replace("Add 1 and 2", "Add 9 and 2"))  # same size, new mtime
    assert input_stamps(cfg.data) != before


def test_hash_memo_skips_unchanged_files_and_rehashes_changed_ones(tmp_path):
    import hashlib

    from rayft.data.cache import HashMemo

    f = tmp_path / "big.jsonl"
    f.write_bytes(b'{"text": "a"}\n' * 1000)
    old = f.stat().st_mtime_ns - 10**10  # 10 s ago: not racy, so it is remembered
    os.utime(f, ns=(old, old))
    memo_file = tmp_path / "memo.json"
    real = hashlib.sha256(f.read_bytes()).hexdigest()
    memo = HashMemo(str(memo_file))
    assert memo.sha256(str(f)) == real
    memo.save()
    assert json.loads(memo_file.read_text())[str(f)][4] == real

    # Same stat: the memo answers without reading the file (an entry forged for this stat is believed)
    forged = json.loads(memo_file.read_text())
    forged[str(f)][4] = "0" * 64
    memo_file.write_text(json.dumps(forged))
    assert HashMemo(str(memo_file)).sha256(str(f)) == "0" * 64
    # A rewrite of the same size changes the mtime (and ctime): hashed again
    f.write_bytes(b'{"text": "b"}\n' * 1000)
    assert HashMemo(str(memo_file)).sha256(str(f)) == hashlib.sha256(f.read_bytes()).hexdigest() != real
    # A file written just now is hashed but not remembered (a second write in the same tick would go unseen)
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_text("{}\n")
    m = HashMemo(str(memo_file))
    m.sha256(str(fresh))
    assert str(fresh) not in m.entries
    # off: nothing kept
    off = HashMemo("off")
    assert off.sha256(str(f)) == hashlib.sha256(f.read_bytes()).hexdigest() and off.entries == {}

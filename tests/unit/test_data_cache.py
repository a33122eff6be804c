"""The tokenized-data cache (hit, a miss on every input that matters, corrupt entries), the
validation split and the new config keys. Tokenization runs locally here (data.preprocess: local)."""

import json

import numpy as np
import pytest
from rich.console import Console

from rayft.config import ConfigError, load_config
from rayft.data import cache as cache_lib
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


def run(cfg):
    console = Console(record=True, width=400)
    d = prepare_data(cfg, console, SESSION["tokenizer"], "qwen2.5")
    return d, console.export_text().splitlines()


def same(a, b) -> bool:
    return all(
        np.array_equal(getattr(a, k), getattr(b, k)) and getattr(a, k).dtype == getattr(b, k).dtype
        for k in ("tokens", "trainable", "offsets")
    ) and (a.dropped_no_trainable, a.truncated, a.split_documents) == (b.dropped_no_trainable, b.truncated, b.split_documents)


def test_second_run_uses_the_cache_without_reading_the_files(tmp_path, monkeypatch):
    cfg = job(tmp_path)
    first, out1 = run(cfg)
    assert first.cache == "miss" and len(first.train) == 8
    entries = [p for p in (tmp_path / "cache").iterdir()]
    assert len(entries) == 1 and (entries[0] / "manifest.json").exists() and not entries[0].name.startswith(".")
    assert out1[-1] == f"data: cached the tokenized data in {entries[0]}"

    import rayft.data.formats

    def no_reading(*a, **k):
        raise AssertionError("the files were read despite a cache hit")

    monkeypatch.setattr(rayft.data.formats, "load_conversations", no_reading)
    monkeypatch.setattr("rayft.data.tokenize.tokenize_dataset", no_reading)
    second, out2 = run(cfg)
    assert second.cache == "hit" and same(first.train, second.train)
    # the first run's report is printed again, then where it came from
    assert out2 == [*out1[:-1], f"data: used the tokenized cache {entries[0]} (no file read or tokenized)"]


def test_cache_dir_null_disables_the_cache(tmp_path):
    d, _ = run(job(tmp_path, "data.cache_dir=null"))
    assert d.cache == "off" and not (tmp_path / "cache").exists()


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


@pytest.mark.parametrize("damage", ["truncated array", "flipped token", "manifest key", "manifest json", "wrong dtype"])
def test_a_corrupt_entry_is_ignored_with_a_warning_and_rebuilt(tmp_path, damage):
    cfg = job(tmp_path)
    first, _ = run(cfg)
    entry = next((tmp_path / "cache").iterdir())
    if damage == "truncated array":
        p = entry / "train.tokens.npy"
        p.write_bytes(p.read_bytes()[:-10])
    elif damage == "flipped token":
        p = entry / "train.tokens.npy"
        raw = bytearray(p.read_bytes())
        raw[-3] ^= 0x01
        p.write_bytes(bytes(raw))
    elif damage == "manifest key":
        m = json.loads((entry / "manifest.json").read_text())
        m["key"] = "0" * 64
        (entry / "manifest.json").write_text(json.dumps(m))
    elif damage == "manifest json":
        (entry / "manifest.json").write_text("{")
    else:
        np.save(entry / "train.offsets.npy", np.load(entry / "train.offsets.npy").astype(np.int32))
    with pytest.raises(cache_lib.CacheError):
        cache_lib.load(tmp_path / "cache", entry.name)
    again, out = run(cfg)
    assert again.cache == "miss" and same(again.train, first.train)
    assert out[0].startswith(f"warning: ignoring a corrupt tokenized-data cache entry: {entry}")
    assert run(cfg)[0].cache == "hit"  # the rebuilt entry is good


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

    _, val_ex = split_validation(list(load_conversations([str(tmp_path / "chat.jsonl")])), 0.25, seed=4)
    assert same(d.validation, tokenize_dataset(d.tokenizer, val_ex, 64))


def test_validation_files_are_tokenized_separately(tmp_path):
    (tmp_path / "val.jsonl").write_text(json.dumps(RECORDS[0]) + "\n")
    d, out = run(job(tmp_path, "data.validation_files=val.jsonl"))
    assert len(d.train) == 8 and len(d.validation) == 1
    assert np.array_equal(d.validation.tokens, d.train.example(0)[0])
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


def test_a_file_changed_while_it_was_read_is_not_cached(tmp_path, monkeypatch):
    import rayft.data.formats

    cfg = job(tmp_path)
    real_load = rayft.data.formats.load_conversations

    def load_then_edit(*a, **k):
        out = real_load(*a, **k)
        data = tmp_path / "chat.jsonl"
        data.write_text(data.read_text() + json.dumps(RECORDS[0]) + "\n")  # another writer appends meanwhile
        return out

    monkeypatch.setattr(rayft.data.formats, "load_conversations", load_then_edit)
    d, out = run(cfg)
    assert d.cache == "off" and len(d.train) == 8  # trained on what was read, nothing cached
    assert out[-1] == "warning: an input file changed while it was read; the tokenized data were not cached"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_input_stamps_see_a_rewrite_without_hashing(tmp_path):
    from rayft.data.cache import input_stamps

    cfg = job(tmp_path)
    before = input_stamps(cfg.data)
    assert before == input_stamps(cfg.data) and before[0][0].endswith("chat.jsonl") and before[0][1] > 0
    data = tmp_path / "chat.jsonl"
    data.write_text(data.read_text().replace("Add 1 and 2", "Add 9 and 2"))  # same size, new mtime
    assert input_stamps(cfg.data) != before

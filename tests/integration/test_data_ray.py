"""Tokenization with Ray Data (embedded local Ray, 2 CPUs) gives the local path's arrays, byte for
byte, on the real sample files (English and Chinese alpaca, raw web text split into chunks)."""

import pytest
from conftest import shared_path
from rich.console import Console

from rayft.config import load_config
from rayft.data.formats import load_conversations
from rayft.data.parallel import RAY_MIN_EXAMPLES, tokenize_dataset_ray, use_ray
from rayft.data.tokenize import tokenize_dataset

pytestmark = pytest.mark.integration


def assert_identical(a, b):
    for k in ("tokens", "trainable", "offsets"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k
    assert (a.dropped_no_trainable, a.truncated, a.split_documents) == (b.dropped_no_trainable, b.truncated, b.split_documents)


def test_ray_data_path_equals_local_path_on_real_files(ray_local, qwen_tokenizer):
    files = [str(shared_path("data", f)) for f in ("alpaca_zh_demo.json", "c4_demo.jsonl", "alpaca_en_demo.json")]
    examples = list(load_conversations(files))
    assert len(examples) == 2299
    local = tokenize_dataset(qwen_tokenizer, examples, 256)
    # small batches: many batches per actor, so reassembly order is really exercised
    remote = tokenize_dataset_ray(qwen_tokenizer, examples, 256, batch_size=97)
    assert_identical(local, remote)
    assert local.truncated > 100 and local.split_documents > 100 and len(local) > len(examples)  # both rules in play


def test_ray_path_reports_the_first_bad_example_like_the_local_path(ray_local, qwen_tokenizer):
    from rayft.data.formats import DataError, TextDocument

    eos = qwen_tokenizer.eos_token_id
    qwen_tokenizer.eos_token = None  # a raw-text document then cannot be ended
    try:
        docs = [TextDocument(f"doc {i}", f"f.jsonl:{i + 1}") for i in range(50)]
        with pytest.raises(DataError) as local:
            tokenize_dataset(qwen_tokenizer, docs, 64)
        with pytest.raises(DataError) as remote:
            tokenize_dataset_ray(qwen_tokenizer, docs, 64, batch_size=7)
        assert str(remote.value) == str(local.value) == "f.jsonl:1: the tokenizer has no EOS token, needed to end raw-text documents"
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
    assert out.count("with Ray Data on 2 CPUs") == 2  # training and validation parts
    local = load_run_data(load_config(cfg_file, ["data.preprocess=local"]), Console(quiet=True))
    assert_identical(d.train, local.train)
    assert_identical(d.validation, local.validation)
    assert len(d.validation) == 100 and (len(d.train), d.train.dropped_no_trainable) == (895, 4)  # 999 = 899 + 100 records


def test_auto_uses_ray_only_when_it_pays():
    assert use_ray("auto", RAY_MIN_EXAMPLES, None) and use_ray("auto", RAY_MIN_EXAMPLES, 8)
    assert not use_ray("auto", RAY_MIN_EXAMPLES - 1, 64) and not use_ray("auto", 10**6, 1)
    assert use_ray("ray", 1, 1) and not use_ray("local", 10**6, 64)

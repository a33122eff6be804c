"""Hugging Face `datasets` inputs: a local `save_to_disk` directory (its Arrow stream files read with
pyarrow, rows reported as dir/data-00000-of-00001.arrow:row N) and Hub dataset ids (through the
`datasets` library; offline or without it, a clear error naming the id and what to do)."""

import json
import sys

import numpy as np
import pytest
from rich.console import Console

datasets = pytest.importorskip("datasets", reason="the Hugging Face datasets inputs need the datasets package")

from rayft.config import RayftConfig
from rayft.data.formats import DataError, expand_files, load_conversations
from rayft.data.prepare import prepare_data

ROWS = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}"} for i in range(12)]


@pytest.fixture
def hf_dir(tmp_path):
    d = tmp_path / "ds"
    datasets.Dataset.from_list(ROWS + [{"instruction": "no output", "input": "", "output": None}]).save_to_disk(str(d))
    return d


def test_save_to_disk_directory_reads_like_the_same_records_in_jsonl(tmp_path, hf_dir, qwen_tokenizer):
    (arrow,) = expand_files([str(hf_dir)])
    assert str(arrow) == f"{hf_dir}/data-00000-of-00001.arrow"
    with pytest.raises(DataError) as e:
        load_conversations([str(hf_dir)])
    assert str(e.value) == f"{hf_dir}/data-00000-of-00001.arrow:row 12: missing field 'output'"
    jsonl = tmp_path / "same.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))

    def tokens(files):
        cfg = RayftConfig.model_validate(
            {"data": {"train_files": files, "seq_len": 64, "preprocess": "local", "on_bad_record": "skip", "cache_dir": None}}
        )
        console = Console(record=True, width=400)
        view = prepare_data(cfg, console, qwen_tokenizer, "qwen2.5").train.to_dataset()
        return view, console.export_text().splitlines()

    (from_hf, out), (from_jsonl, _) = tokens([str(hf_dir)]), tokens([str(jsonl)])
    assert all(np.array_equal(getattr(from_hf, k), getattr(from_jsonl, k)) for k in ("tokens", "trainable", "offsets"))
    assert out[1] == f"  missing_field: 1 (first: {hf_dir}/data-00000-of-00001.arrow:row 12: missing field 'output')"


def test_a_dataset_dict_directory_asks_for_a_split(tmp_path):
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS)})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError) as e:
        expand_files([str(tmp_path / "dd")])
    assert (
        str(e.value)
        == f"{tmp_path / 'dd'}: a Hugging Face DatasetDict directory; name one split's directory, e.g. {tmp_path / 'dd' / 'test'}"
    )
    assert len(load_conversations([str(tmp_path / "dd" / "train")])) == 12


@pytest.mark.parametrize("name", ["hf://datasets/rayft-test/no-such-dataset", "rayft-test/no-such-dataset"])
def test_a_hub_id_offline_names_the_id_and_what_to_do(monkeypatch, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(DataError) as e:
        expand_files([name])
    msg = str(e.value)
    assert msg.startswith(f"{name}: cannot load the Hugging Face Hub dataset 'rayft-test/no-such-dataset' (")
    assert msg.endswith(
        "where the network reaches the Hub, run datasets.load_dataset('rayft-test/no-such-dataset', split='train').save_to_disk(DIR) "
        "and give DIR in data.train_files"
    )


def test_a_hub_id_without_the_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets → ImportError
    with pytest.raises(DataError) as e:
        expand_files(["rayft-test/no-such-dataset"])
    assert str(e.value).startswith(
        "rayft-test/no-such-dataset: no such data file or directory; as a Hugging Face Hub dataset id it needs the datasets package (pip install datasets)"
    )
    with pytest.raises(DataError, match=r"nope/x\.jsonl: no such data file \(data\.train_files\)"):
        expand_files(["nope/x.jsonl"])  # a path with a data suffix is never taken for a Hub id

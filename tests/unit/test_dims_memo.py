"""The planner's model sizes remembered by config (rayft.train.dims_memo): a second plan of the
same model reads them back instead of building the model; anything else is counted again."""

from __future__ import annotations

import json

import pytest

from rayft.config import ModelConfig
from rayft.train import dims_memo, memory_plan
from rayft.train.memory_plan import ModelDims, count_model_dims, model_dims
from rayft.train.model_config import load_model_config


@pytest.fixture
def memo_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path))
    return tmp_path / "model-dims"


@pytest.fixture(scope="module")
def qwen15_conf():
    return load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b"))


def no_build(conf):
    raise AssertionError("the model was built: the memo was not read")


def test_a_second_plan_reads_the_sizes_back_without_building_the_model(memo_home, qwen15_conf, monkeypatch):
    counted = count_model_dims(qwen15_conf)
    first = model_dims(qwen15_conf)
    files = list(memo_home.glob("*.json"))
    assert first == counted and len(files) == 1
    assert json.loads(files[0].read_text())["params"] == 1_543_714_304
    monkeypatch.setattr(memory_plan, "count_model_dims", no_build)
    again = model_dims(qwen15_conf)
    assert again == counted
    assert again.param_shapes == counted.param_shapes and isinstance(again.param_shapes[0], tuple)


def test_another_config_is_counted_again(memo_home, qwen15_conf):
    model_dims(qwen15_conf)
    shallower = type(qwen15_conf).from_dict({**qwen15_conf.to_dict(), "num_hidden_layers": 2, "layer_types": None})
    dims = model_dims(shallower)
    assert dims.layers == 2 and dims.params == 2 * dims.params_layer + dims.params_root
    assert len(list(memo_home.glob("*.json"))) == 2


def test_a_memo_for_another_transformers_release_is_not_read(memo_home, qwen15_conf, monkeypatch):
    import transformers

    key = dims_memo.memo_key(qwen15_conf, ModelDims)
    monkeypatch.setattr(transformers, "__version__", "0.0.1")
    assert dims_memo.memo_key(qwen15_conf, ModelDims) != key


def test_a_damaged_memo_is_a_miss_and_is_written_again(memo_home, qwen15_conf, monkeypatch):
    model_dims(qwen15_conf)
    (path,) = memo_home.glob("*.json")
    for damage in ("{not json", json.dumps({"params": 1}), ""):
        path.write_text(damage)
        assert model_dims(qwen15_conf) == count_model_dims(qwen15_conf)
        assert dims_memo.recall(path.stem, ModelDims) == count_model_dims(qwen15_conf)  # rewritten whole


def test_models_with_their_own_code_are_not_remembered(memo_home, qwen15_conf):
    remote = type(qwen15_conf).from_dict({**qwen15_conf.to_dict(), "auto_map": {"AutoConfig": "configuration_x.XConfig"}})
    assert dims_memo.memo_key(remote, ModelDims) is None
    assert dims_memo.recall("0" * 64, ModelDims) is None
    assert not memo_home.exists()


def test_a_memo_that_cannot_be_written_is_not_an_error(tmp_path, monkeypatch, qwen15_conf):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RAYFT_CACHE", str(blocker))  # model-dims/ cannot be made under a file
    assert model_dims(qwen15_conf) == count_model_dims(qwen15_conf)
    assert list(tmp_path.iterdir()) == [blocker]

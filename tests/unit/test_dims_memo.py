"""The planner's model sizes remembered by config (rayft.train.dims_memo): a second plan of the
same model reads them back instead of building the model; anything else is counted again."""

from __future__ import annotations

import json

import pytest

from rayft.config import ModelConfig
from rayft.train import dims_memo
from rayft.train.memory_plan import ModelDims, count_model_dims, model_dims
from rayft.train.model_config import decoder_layers, load_model_config

COUNTERS = (count_model_dims, decoder_layers)


@pytest.fixture
def memo_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYFT_DIMS_MEMO", str(tmp_path / "memo"))
    return tmp_path / "memo"


@pytest.fixture
def qwen15_conf():
    return load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b"))


def no_build(*args, **kwargs):
    raise AssertionError("the model was built: the memo was not read")


def test_a_second_plan_reads_the_sizes_back_without_building_the_model(memo_home, qwen15_conf, monkeypatch):
    before = qwen15_conf.to_json_string(use_diff=False)
    counted = count_model_dims(qwen15_conf)
    assert qwen15_conf.to_json_string(use_diff=False) == before  # counting leaves the config as it was
    first = model_dims(qwen15_conf)
    files = list(memo_home.glob("*"))
    assert first == counted and len(files) == 1 and files[0].suffix == ".json"  # no temporary file left
    assert json.loads(files[0].read_text())["params"] == 1_543_714_304
    import transformers

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", no_build)
    again = model_dims(load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b")))
    assert again == counted
    assert again.param_shapes == counted.param_shapes and isinstance(again.param_shapes[0], tuple)


def test_the_default_place_is_under_rayft_cache(tmp_path, monkeypatch, qwen15_conf):
    monkeypatch.delenv("RAYFT_DIMS_MEMO")
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path))
    model_dims(qwen15_conf)
    assert len(list((tmp_path / "model-dims").glob("*.json"))) == 1


def test_off_remembers_nothing(tmp_path, monkeypatch, qwen15_conf):
    monkeypatch.setenv("RAYFT_DIMS_MEMO", "off")
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path))
    assert model_dims(qwen15_conf) == count_model_dims(qwen15_conf)
    assert list(tmp_path.iterdir()) == []


def test_another_config_is_counted_again(memo_home, qwen15_conf):
    model_dims(qwen15_conf)
    shallower = type(qwen15_conf).from_dict({**qwen15_conf.to_dict(), "num_hidden_layers": 2, "layer_types": None})
    dims = model_dims(shallower)
    assert dims.layers == 2 and dims.params == 2 * dims.params_layer + dims.params_root
    assert len(list(memo_home.glob("*.json"))) == 2


def test_the_key_follows_transformers_the_fields_and_the_counting_code(qwen15_conf, monkeypatch):
    import dataclasses

    import transformers

    key = dims_memo.memo_key(qwen15_conf, ModelDims, COUNTERS)
    assert key == dims_memo.memo_key(qwen15_conf, ModelDims, COUNTERS)
    assert dims_memo.memo_key(qwen15_conf, ModelDims, (count_model_dims, load_model_config)) != key  # other counting code
    fewer = dataclasses.make_dataclass("Fewer", [f.name for f in dataclasses.fields(ModelDims)][:-1])
    assert dims_memo.memo_key(qwen15_conf, fewer, COUNTERS) != key
    monkeypatch.setattr(transformers, "__version__", "0.0.1")
    assert dims_memo.memo_key(qwen15_conf, ModelDims, COUNTERS) != key


def test_a_damaged_memo_is_a_miss_and_is_written_again(memo_home, qwen15_conf):
    counted = count_model_dims(load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b")))
    model_dims(qwen15_conf)
    (path,) = memo_home.glob("*.json")
    whole = json.loads(path.read_text())
    for damage in ("{not json", json.dumps({"params": 1}), "", json.dumps({**whole, "params_layer": whole["params_layer"] // 2})):
        path.write_text(damage)
        assert model_dims(qwen15_conf) == counted
        assert dims_memo.recall(path.stem, ModelDims) == counted  # written again, whole


def test_configs_that_name_their_own_code_are_not_remembered(memo_home, qwen15_conf):
    remote = type(qwen15_conf).from_dict({**qwen15_conf.to_dict(), "auto_map": {"AutoConfig": "configuration_x.XConfig"}})
    assert dims_memo.memo_key(remote, ModelDims, COUNTERS) is None
    assert model_dims(remote) == count_model_dims(qwen15_conf)
    assert not memo_home.exists()


def test_a_memo_that_cannot_be_written_or_found_is_not_an_error(tmp_path, monkeypatch, qwen15_conf):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("RAYFT_DIMS_MEMO", str(blocker / "memo"))  # cannot be made under a file
    assert model_dims(qwen15_conf) == count_model_dims(qwen15_conf)
    assert list(tmp_path.iterdir()) == [blocker]
    monkeypatch.delenv("RAYFT_DIMS_MEMO")
    monkeypatch.delenv("RAYFT_CACHE", raising=False)
    monkeypatch.delenv("HOME")
    monkeypatch.setattr(dims_memo.os.path, "expanduser", lambda p: (_ for _ in ()).throw(RuntimeError("no home")))
    assert model_dims(qwen15_conf) == count_model_dims(qwen15_conf)

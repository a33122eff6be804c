"""The HF export stops generating at the chat template's end of turn (issue 21, item 1)."""

import copy
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import REPLY, bigram_export

from rayft.train.generation import end_of_turn_ids, export_generation_config


def test_end_of_turn_read_from_the_template(qwen_tokenizer):
    # ChatML's <|im_end|>, found by rendering a reply, not from a table
    assert end_of_turn_ids(qwen_tokenizer) == [qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")] == [151645]
    other = copy.deepcopy(qwen_tokenizer)  # another template: the turn ends with <|endoftext|> itself
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|endoftext|>\n{% endfor %}"
    assert end_of_turn_ids(other) == [151643]
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert end_of_turn_ids(other) == []  # no special token after the reply


def test_base_sampling_defaults_kept_and_none_added(qwen_tokenizer):
    from transformers import GenerationConfig, PretrainedConfig

    conf = PretrainedConfig(eos_token_id=151643, bos_token_id=151643)
    plain = export_generation_config(qwen_tokenizer, conf)
    assert plain.eos_token_id == [151645, 151643] and not plain.do_sample and plain.temperature is None
    base = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, eos_token_id=151643)
    got = export_generation_config(qwen_tokenizer, conf, base)
    assert (got.do_sample, got.temperature, got.top_p, got.eos_token_id) == (True, 0.7, 0.8, [151645, 151643])


@pytest.fixture(scope="module")
def bigram_dir(tmp_path_factory, qwen_tokenizer):
    return bigram_export(qwen_tokenizer, tmp_path_factory.mktemp("export") / "hf")


def test_export_stops_at_end_of_turn(bigram_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gen = json.loads((bigram_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    assert json.loads((bigram_dir / "config.json").read_text())["use_cache"] is True
    model = AutoModelForCausalLM.from_pretrained(bigram_dir)
    tok = AutoTokenizer.from_pretrained(bigram_dir)
    batch = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    n = batch["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12)[0, n:].tolist()
        on = model.generate(**batch, max_new_tokens=12, eos_token_id=151643)[0, n:].tolist()  # the base EOS alone
    reply = tok.encode(REPLY, add_special_tokens=False)
    assert out == [*reply, 151645]  # the reply, its end of turn, nothing after
    assert len(on) == 12 and on[: len(reply) + 1] == [*reply, 151645]  # what the export did before: on past the turn

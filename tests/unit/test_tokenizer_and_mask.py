"""The offline Qwen2.5 tokenizer, the chat template and the assistant-only loss mask."""

import json

import numpy as np
import pytest
from conftest import shared_path

from rayft.data.examples import Conversation
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_conversation, tokenize_dataset

IM_START, IM_END, ENDOFTEXT = 151644, 151645, 151643
# Published Qwen2 vocabulary ids of a few pieces.
SYSTEM, USER, ASSISTANT, NEWLINE = 8948, 872, 77091, 198


def test_published_ids(qwen_tokenizer):
    tok = qwen_tokenizer
    assert tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|file_sep|>"]) == [151643, 151644, 151645, 151664]
    assert len(tok) == 151665
    assert tok.pad_token_id == tok.eos_token_id == ENDOFTEXT
    assert tok("system\nuser\nassistant", add_special_tokens=False)["input_ids"] == [SYSTEM, NEWLINE, USER, NEWLINE, ASSISTANT]
    # digits are split one by one in Qwen2's pre-tokenizer
    assert tok("2024", add_special_tokens=False)["input_ids"] == [17, 15, 17, 19]


def test_chatml_rendering(qwen_tokenizer):
    text = qwen_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    )


def _expected(tok, messages):
    """Expected ids and mask, built piece by piece, independently of the offset-based masker."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids, mask = [], []
    if messages[0]["role"] != "system":
        messages = [{"role": "system", "content": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."}] + messages
    for m in messages:
        head = [IM_START] + enc(m["role"] + "\n")
        body = enc(m["content"]) + [IM_END]
        ids += head + body + [NEWLINE]
        train = m["role"] == "assistant"
        mask += [False] * len(head) + [train] * len(body) + [False]
    return ids, mask


@pytest.mark.parametrize(
    "fname,index", [("alpaca_en_demo.json", 0), ("alpaca_en_demo.json", 7), ("alpaca_zh_demo.json", 0), ("alpaca_zh_demo.json", 3)]
)
def test_real_alpaca_records_exact_ids_and_mask(qwen_tokenizer, fname, index):
    rec = json.loads(shared_path("data", fname).read_text())[index]
    conv = to_conversation(rec, f"{fname}:{index}", "alpaca")
    ex = tokenize_conversation(qwen_tokenizer, conv)
    want_ids, want_mask = _expected(qwen_tokenizer, list(conv.messages))
    assert ex.input_ids.tolist() == want_ids
    assert ex.trainable.tolist() == want_mask
    # the trained tokens decode to exactly the answer plus the end-of-turn token
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == rec["output"] + "<|im_end|>"
    assert ex.input_ids[:3].tolist() == [IM_START, SYSTEM, NEWLINE]


def test_multi_turn_trains_every_assistant_turn_only(qwen_tokenizer):
    msgs = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6, of course."},
    )
    ex = tokenize_conversation(qwen_tokenizer, Conversation(msgs, "t:1"))
    want_ids, want_mask = _expected(qwen_tokenizer, list(msgs))
    assert ex.input_ids.tolist() == want_ids and ex.trainable.tolist() == want_mask
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == "4<|im_end|>6, of course.<|im_end|>"
    # eos/pad id 151643 never appears; the mask does not depend on token ids
    assert ENDOFTEXT not in ex.input_ids.tolist()


def test_mask_is_by_position_not_token_id(qwen_tokenizer):
    # the user says exactly what the assistant says: same ids, only the assistant's are trained
    msgs = ({"role": "user", "content": "<|im_end|> echo"}, {"role": "assistant", "content": "<|im_end|> echo"})
    ex = tokenize_conversation(qwen_tokenizer, Conversation(msgs, "t:1"))
    assert int(ex.trainable.sum()) == len(qwen_tokenizer("<|im_end|> echo", add_special_tokens=False)["input_ids"]) + 1


def test_truncation_drops_examples_without_trainable_tokens_and_counts(qwen_tokenizer):
    long_user = {"role": "user", "content": "word " * 300}
    convs = [
        Conversation((long_user, {"role": "assistant", "content": "late answer"}), "a:1"),
        Conversation(({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello " * 100}), "a:2"),
        Conversation(({"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}), "a:3"),
    ]
    ds = tokenize_dataset(qwen_tokenizer, convs, seq_len=64)
    assert len(ds) == 2 and ds.dropped_no_trainable == 1 and ds.truncated == 2
    assert ds.lengths().tolist()[0] == 64
    assert np.diff(ds.offsets).sum() == len(ds.tokens) == len(ds.trainable)


def test_conversation_starting_with_an_assistant_turn_trains_only_that_reply(qwen_tokenizer):
    ex = tokenize_conversation(qwen_tokenizer, Conversation(({"role": "assistant", "content": "x"},), "t:1"))
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == "x<|im_end|>"


def test_leading_newlines_of_a_reply_are_trained(qwen_tokenizer):
    msgs = ({"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nHello"})
    ex = tokenize_conversation(qwen_tokenizer, Conversation(msgs, "t:1"))
    trained = qwen_tokenizer.decode(ex.input_ids[ex.trainable])
    assert trained.endswith("\n\nHello<|im_end|>") and "user" not in trained

"""Per-turn training weights (OpenAI's ``weight``, LLaMA-Factory's ``loss_weight``): 0 = rendered,
not trained; 1 = trained. Token ids never depend on them; the mask loses exactly the weight-0 turns."""

import json

import pytest

from rayft.data.examples import Conversation, DataError
from rayft.data.formats import SkippedRecords, load_conversations
from rayft.data.records import to_example
from rayft.data.tokenize import tokenize_conversation, tokenize_dataset

IM_START, IM_END, NEWLINE = 151644, 151645, 198
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _expected(tok, messages, trained):
    """Ids and mask built piece by piece from ChatML (independently of the offset-based masker):
    ``trained[i]`` says whether message *i*'s content and end-of-turn are trainable."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids, mask = [], []
    if messages[0]["role"] != "system":
        messages, trained = [{"role": "system", "content": QWEN_SYSTEM}, *messages], [False, *trained]
    for m, t in zip(messages, trained):
        head, body = [IM_START] + enc(m["role"] + "\n"), enc(m["content"]) + [IM_END]
        ids += head + body + [NEWLINE]
        mask += [False] * len(head) + [t] * len(body) + [False]
    return ids, mask


MSGS = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "5, I think."},
    {"role": "user", "content": "Check again."},
    {"role": "assistant", "content": "Sorry: 2+2 = 4."},
]


@pytest.mark.parametrize("key,zero,one", [("weight", 0, 1), ("loss_weight", 0.0, 1.0)])
def test_weight_zero_turn_is_rendered_but_not_trained(qwen_tokenizer, key, zero, one):
    tok = qwen_tokenizer
    weighted = [MSGS[0], {**MSGS[1], key: zero}, MSGS[2], {**MSGS[3], key: one}]
    conv = to_example({"messages": weighted}, "w.jsonl:1")
    plain = to_example({"messages": MSGS}, "p.jsonl:1")
    assert conv.untrained == (1,) and plain.untrained == ()
    assert conv.messages == plain.messages  # the weight never reaches the chat template
    ex, base = tokenize_conversation(tok, conv), tokenize_conversation(tok, plain)
    assert ex.input_ids.tolist() == base.input_ids.tolist()
    # today's mask minus exactly the weight-0 turn's tokens, checked against a hand-built render
    assert (base.input_ids.tolist(), base.trainable.tolist()) == _expected(tok, MSGS, [False, True, False, True])
    want_ids, want_mask = _expected(tok, MSGS, [False, False, False, True])
    assert ex.input_ids.tolist() == want_ids and ex.trainable.tolist() == want_mask
    turn1 = tok("5, I think.", add_special_tokens=False)["input_ids"] + [IM_END]
    removed = [i for i, (a, b) in enumerate(zip(base.trainable, ex.trainable)) if a and not b]
    assert [int(ex.input_ids[i]) for i in removed] == turn1  # exactly turn 1's content and end-of-turn
    assert not (ex.trainable & ~base.trainable).any()
    assert tok.decode(ex.input_ids[ex.trainable]) == "Sorry: 2+2 = 4.<|im_end|>"
    assert tok.decode(base.input_ids[base.trainable]) == "5, I think.<|im_end|>Sorry: 2+2 = 4.<|im_end|>"


def test_sharegpt_loss_weight_llamafactory_style(qwen_tokenizer, tmp_path):
    # LLaMA-Factory writes loss_weight on every turn: 0.0 on system/user, 1.0 (or 0.0) on assistant
    rec = {
        "system": "Be brief.",
        "conversations": [
            {"from": "human", "value": "hi", "loss_weight": 0.0},
            {"from": "gpt", "value": "hello", "loss_weight": 0.0},
            {"from": "human", "value": "bye", "loss_weight": 0.0},
            {"from": "function_call", "value": '{"name": "f", "arguments": {}}', "loss_weight": 0.0},
            {"from": "observation", "value": "ok", "loss_weight": 0},
            {"from": "gpt", "value": "see you", "loss_weight": 1.0},
        ],
    }
    p = write(tmp_path, "lf.jsonl", json.dumps(rec) + "\n")
    (conv,) = load_conversations([str(p)])
    # indices into conv.messages: the record's system field is message 0
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    assert conv.untrained == (2, 4)
    ex = tokenize_conversation(qwen_tokenizer, conv)
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == "see you<|im_end|>"


def test_an_untrained_assistant_turn_may_be_empty_and_null_means_absent(tmp_path):
    line = json.dumps(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "weight": 0},
                {"role": "user", "content": "q2", "weight": None},
                {"role": "assistant", "content": "a", "weight": None},
            ]
        }
    )
    (conv,) = load_conversations([str(write(tmp_path, "e.jsonl", line + "\n"))])
    assert conv.untrained == (1,)


def _msgs(*messages):
    return json.dumps({"messages": list(messages)})


U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    "line,kind,message",
    [
        (
            _msgs(U, {**A, "weight": 0.5}),
            "bad_weight",
            "messages[1].weight is 0.5: a turn's weight must be 0 (not trained) or 1 (trained) (fractional weights are not supported)",
        ),
        (_msgs(U, {**A, "weight": "1"}), "bad_weight", "messages[1].weight is '1': a turn's weight must be 0 (not trained) or 1 (trained)"),
        (
            _msgs(U, {**A, "loss_weight": True}),
            "bad_weight",
            "messages[1].loss_weight is True: a turn's weight must be 0 (not trained) or 1 (trained)",
        ),
        (_msgs(U, {**A, "weight": 2}), "bad_weight", "messages[1].weight is 2: a turn's weight must be 0 (not trained) or 1 (trained)"),
        (
            _msgs({**U, "weight": 1}, A),
            "bad_weight",
            "messages[0].weight is 1 on a user turn: only assistant turns are trained (a weight on another turn may only be 0)",
        ),
        (
            _msgs(U, {**A, "weight": 1, "loss_weight": 0}),
            "bad_weight",
            "messages[1] has 'weight' 1 and 'loss_weight' 0: give one",
        ),
        (
            _msgs(U, {**A, "weight": 0}, U, {**A, "loss_weight": 0.0}),
            "no_trained_turn",
            "every assistant turn has weight 0 (nothing to train on)",
        ),
        (
            json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "weight": 0.25}]}),
            "bad_weight",
            "conversations[1].weight is 0.25: a turn's weight must be 0 (not trained) or 1 (trained) (fractional weights are not supported)",
        ),
        (
            json.dumps({"conversations": [{"from": "system", "value": "s", "loss_weight": 1.0}, {"from": "gpt", "value": "a"}]}),
            "bad_weight",
            "conversations[0].loss_weight is 1.0 on a system turn: only assistant turns are trained (a weight on another turn may only be 0)",
        ),
        (
            json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "loss_weight": 0}]}),
            "no_trained_turn",
            "every assistant turn has weight 0 (nothing to train on)",
        ),
    ],
)
def test_bad_weights_name_the_record_and_turn(tmp_path, line, kind, message):
    p = write(tmp_path, "bad.jsonl", _msgs(U, A) + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {message}" and e.value.kind == kind
    report = load_conversations([str(p)], on_bad_record="skip")
    assert len(report) == 1 and report.skipped == {kind: SkippedRecords(1, f"{p}:2", message)}


def test_parquet_weight_column(tmp_path, qwen_tokenizer):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {"messages": [U, {**A, "weight": 0}, U, {"role": "assistant", "content": "b"}]},  # weight null on the last turn
        {"messages": [U, A]},
    ]
    p = tmp_path / "w.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    convs = load_conversations([str(p)])
    assert [c.untrained for c in convs] == [(1,), ()]
    ds = tokenize_dataset(qwen_tokenizer, convs, seq_len=256)
    toks, train = ds.example(0)
    assert qwen_tokenizer.decode(toks[train]) == "b<|im_end|>"


def test_conversation_untrained_defaults_to_every_turn_trained():
    c = Conversation(({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}), "x:1")
    assert c.untrained == () and c == Conversation(c.messages, "x:1", (), ())

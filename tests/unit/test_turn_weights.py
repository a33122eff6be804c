"""Per-turn training weights (OpenAI's ``weight``, LLaMA-Factory's ``loss_weight``): 0 = rendered,
not trained; 1 = trained; axolotl's ``training`` / ``train`` flags alike (false = 0, true = 1). Token
ids never depend on them; the mask loses exactly the weight-0 turns. Loss-mask keys rayft cannot
honour are refused, never ignored."""

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
            "messages[1] has 'weight' 1 and 'loss_weight' 0: they disagree, give one",
        ),
        (
            _msgs(U, {**A, "weight": 0}, U, {**A, "loss_weight": 0.0}),
            "no_trained_turn",
            "every assistant turn has weight 0 or training false (nothing to train on)",
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
            "every assistant turn has weight 0 or training false (nothing to train on)",
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


# ---------------------------------------------------------------- axolotl's training flags


def test_training_flags_false_are_not_trained_like_weight_zero(qwen_tokenizer):
    # the reviewer's record: both assistant turns marked untrained used to be trained (flags ignored as extra keys)
    flagged = [MSGS[0], {**MSGS[1], "training": False}, MSGS[2], {**MSGS[3], "train": False}]
    with pytest.raises(DataError, match=r"every assistant turn has weight 0 or training false"):
        to_example({"messages": flagged}, "f.jsonl:1")
    conv = to_example({"messages": [MSGS[0], {**MSGS[1], "training": False}, MSGS[2], {**MSGS[3], "training": True}]}, "f.jsonl:1")
    weighted = to_example({"messages": [MSGS[0], {**MSGS[1], "weight": 0}, MSGS[2], MSGS[3]]}, "w.jsonl:1")
    assert conv.untrained == weighted.untrained == (1,) and conv.messages == weighted.messages
    ex, ref = tokenize_conversation(qwen_tokenizer, conv), tokenize_conversation(qwen_tokenizer, weighted)
    assert ex.input_ids.tolist() == ref.input_ids.tolist() and ex.trainable.tolist() == ref.trainable.tolist()
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == "Sorry: 2+2 = 4.<|im_end|>"
    # axolotl's docs write training: false on the system and user turns too; the flags agree with weights
    sys_user = [{"role": "system", "content": "s", "training": False}, {**MSGS[0], "train": False}]
    agree = to_example({"messages": [*sys_user, {**MSGS[1], "training": False, "weight": 0, "loss_weight": 0.0}, MSGS[2], MSGS[3]]}, "a:1")
    assert agree.untrained == (2,)
    assert to_example({"messages": [MSGS[0], {**MSGS[1], "training": True, "weight": 1, "train": True}]}, "t:1").untrained == ()
    assert to_example({"messages": [MSGS[0], {**MSGS[1], "training": None}]}, "n:1").untrained == ()  # null: absent


def test_sharegpt_training_flags(tmp_path):
    rec = {
        "conversations": [
            {"from": "human", "value": "hi", "training": False},
            {"from": "gpt", "value": "bad", "training": False},
            {"from": "human", "value": "again"},
            {"from": "function_call", "value": '{"name": "f", "arguments": {}}', "train": False},
            {"from": "observation", "value": "ok"},
            {"from": "gpt", "value": "good", "train": True},
        ]
    }
    (conv,) = load_conversations([str(write(tmp_path, "s.jsonl", json.dumps(rec) + "\n"))])
    assert conv.untrained == (1, 3) and conv.messages[1] == {"role": "assistant", "content": "bad"}
    assert load_conversations([str(tmp_path / "s.jsonl")]).notes == []  # read, not ignored


@pytest.mark.parametrize(
    "turn,message",
    [
        (
            {**A, "training": "false"},
            "messages[1].training is 'false': a turn's training flag must be true (trained) or false (not trained)",
        ),
        ({**A, "train": 0}, "messages[1].train is 0: a turn's training flag must be true (trained) or false (not trained)"),
        ({**A, "training": False, "weight": 1}, "messages[1] has 'weight' 1 and 'training' False: they disagree, give one"),
        (
            {**A, "loss_weight": 1.0, "training": True, "train": False},
            "messages[1] has 'loss_weight' 1.0, 'training' True and 'train' False: they disagree, give one",
        ),
    ],
)
def test_bad_training_flags_name_the_record_and_turn(tmp_path, turn, message):
    p = write(tmp_path, "bad.jsonl", _msgs(U, A) + "\n" + _msgs(U, turn, U, A) + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {message}" and e.value.kind == "bad_weight"


def test_a_true_training_flag_on_a_prompt_turn_is_refused(tmp_path):
    p = write(tmp_path, "u.jsonl", _msgs({**U, "training": True}, A) + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == (
        f"{p}:1: messages[0].training is True on a user turn: only assistant turns are trained "
        "(a training flag on another turn may only be false)"
    )
    sharegpt = json.dumps({"conversations": [{"from": "system", "value": "s", "train": True}, {"from": "gpt", "value": "a"}]})
    with pytest.raises(DataError, match=r":1: conversations\[0\]\.train is True on a system turn: only assistant turns are trained"):
        load_conversations([str(write(tmp_path, "s.jsonl", sharegpt + "\n"))])


WHOLE_TURN = "rayft trains or skips whole turns: mark the turn with 'weight' (0: not trained, 1: trained) or 'training' (false/true)"
MASK = f"a loss mask whose sense (true: trained, or true: masked out?) differs between tools; {WHOLE_TURN}"


@pytest.mark.parametrize(
    "key,value,reason",
    [
        (
            "train_detail",
            [{"begin_offset": 0, "end_offset": 3, "train": False}],
            f"per-span training (axolotl's message_field_training_detail) is not supported; {WHOLE_TURN}",
        ),
        ("training_detail", [], f"per-span training (axolotl's message_field_training_detail) is not supported; {WHOLE_TURN}"),
        ("mask", True, MASK),
        ("masked", False, MASK),
        ("loss_mask", [0, 1], MASK),
        ("trainable", False, f"a training flag rayft does not read under this name; {WHOLE_TURN}"),
        ("loss", False, f"a per-turn loss flag (XTuner's) is not read, and true on a prompt turn would train it; {WHOLE_TURN}"),
    ],
)
@pytest.mark.parametrize("fmt", ["messages", "sharegpt"])
def test_loss_mask_keys_rayft_cannot_honour_are_refused_naming_file_line_and_turn(tmp_path, key, value, reason, fmt):
    if fmt == "messages":
        line, turn = _msgs(U, {**A, key: value}, U, A), "messages[1]"
    else:
        turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", key: value}]
        line, turn = json.dumps({"conversations": turns}), "conversations[1]"
    p = write(tmp_path, "m.jsonl", _msgs(U, A) + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {turn} has {key!r}: {reason}" and e.value.kind == "unsupported_key"
    # null counts as absent, as for the other refused keys
    ok = _msgs(U, {**A, key: None}) if fmt == "messages" else json.dumps({"conversations": [{"from": "human", "value": "q"},
                                                                                           {"from": "gpt", "value": "a", key: None}]})  # fmt: skip
    assert len(load_conversations([str(write(tmp_path, "ok.jsonl", ok + "\n"))])) == 1


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

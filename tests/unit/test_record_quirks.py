"""Real-world record quirks: extra message keys ignored with a once-per-file note (keys that change
a turn's meaning still refused), ``{"type": "text", "value": ...}`` parts, template placeholders."""

import json

import pytest

from rayft.data.examples import DataError
from rayft.data.formats import IgnoredKeys, load_conversations

GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _msgs(*messages, **extra):
    return json.dumps({**extra, "messages": list(messages)})


# ---------------------------------------------------------------- extra keys


def test_extra_message_keys_are_ignored_with_one_note_per_file(tmp_path):
    a = write(
        tmp_path,
        "a.jsonl",
        "\n".join(
            [
                GOOD,
                _msgs(
                    {"role": "system", "content": "S", "id": "m0"},
                    {"role": "user", "content": "q", "name": "alice", "timestamp": "2024-01-01T00:00:00Z"},
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}],
                        "name": "bot",
                    },
                ),
                _msgs({"role": "user", "content": "q2", "metadata": {"lang": "en"}}, {"role": "assistant", "content": "a2"}),
            ]
        )
        + "\n",
    )
    b = write(
        tmp_path,
        "b.jsonl",
        "\ufeff"
        + json.dumps({"conversations": [{"from": "human", "value": "q", "markdown": None}, {"from": "gpt", "value": "a", "id": 3}]})
        + "\n",
    )
    report = load_conversations([str(a), str(b)])
    assert len(report) == 4 and report.records == 4
    assert report[1].messages == (
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    )  # nothing ignored reaches the chat template
    assert report.ignored == {
        str(a): IgnoredKeys({"id", "name", "timestamp", "content[].cache_control", "metadata"}, f"{a}:2"),
        str(b): IgnoredKeys({"markdown", "id"}, f"{b}:1"),
    }
    assert report.notes == [
        f"{a}: ignored message key(s) ['content[].cache_control', 'id', 'metadata', 'name', 'timestamp'] (first at {a}:2)",
        f"{b}: tolerated: a UTF-8 BOM at the start",
        f"{b}: ignored message key(s) ['id', 'markdown'] (first at {b}:1)",
    ]
    assert report.notes_of(str(b)) == report.notes[1:]
    assert load_conversations([str(write(tmp_path, "c.jsonl", GOOD + "\n"))]).notes == []


def test_a_tool_messages_name_is_still_kept(tmp_path):
    line = _msgs(
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done"},
    )
    report = load_conversations([str(write(tmp_path, "t.jsonl", line + "\n"))])
    assert report[0].messages[2] == {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c1"}
    assert report.notes == []


U, A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
REASONING = "reasoning traces are not rendered: move the reasoning into the content, or remove the key"


@pytest.mark.parametrize(
    "line,message",
    [
        (
            _msgs({**U, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}, A),
            "messages[0] has 'tool_calls': only assistant messages call tools, not a user message (the calls would be lost)",
        ),
        (
            _msgs(U, {**A, "function_call": {"name": "f", "arguments": "{}"}}),
            "messages[1] has 'function_call': the legacy OpenAI function call is not read: write it as 'tool_calls'",
        ),
        (_msgs(U, {**A, "reasoning_content": "Let me think."}), f"messages[1] has 'reasoning_content': {REASONING}"),
        (
            json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "thinking": "hm"}]}),
            f"conversations[1] has 'thinking': {REASONING}",
        ),
        (
            json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "tool_calls": [{}]}]}),
            "conversations[1] has 'tool_calls': ShareGPT records call tools in function_call turns",
        ),
        (
            _msgs(U, {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
            "messages[1].content[0] is a 'image_url' part: only text parts are supported",
        ),
    ],
)
def test_keys_that_change_a_turns_meaning_are_still_refused(tmp_path, line, message):
    p = write(tmp_path, "bad.jsonl", GOOD + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {message}"


def test_null_meaningful_keys_count_as_absent(tmp_path):
    # OpenAI API dumps carry "function_call": null, "tool_calls": null, "refusal": null
    line = _msgs({**U, "tool_calls": None}, {**A, "function_call": None, "tool_calls": None, "refusal": None, "reasoning_content": None})
    report = load_conversations([str(write(tmp_path, "n.jsonl", line + "\n"))])
    assert report[0].messages == (U, A)
    assert report.ignored[str(tmp_path / "n.jsonl")].keys == {"tool_calls", "function_call", "refusal", "reasoning_content"}


# ---------------------------------------------------------------- {"type": "text", "value": ...}


def test_text_parts_written_with_value_read_like_text(tmp_path, qwen_tokenizer):
    from rayft.data.tokenize import tokenize_conversation

    # LLaMA-Factory's messages: content parts with "value", loss_weight on every turn
    lf = _msgs(
        {"role": "user", "content": [{"type": "text", "value": "2+2?"}], "loss_weight": 0.0},
        {"role": "assistant", "content": [{"type": "text", "value": "4"}, {"type": "text", "text": ", exactly."}], "loss_weight": 1.0},
    )
    oa = _msgs({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4, exactly."})
    a, b = load_conversations([str(write(tmp_path, "lf.jsonl", lf + "\n")), str(write(tmp_path, "oa.jsonl", oa + "\n"))])
    assert a.messages == b.messages == ({"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4, exactly."})
    ta, tb = tokenize_conversation(qwen_tokenizer, a), tokenize_conversation(qwen_tokenizer, b)
    assert ta.input_ids.tolist() == tb.input_ids.tolist() and ta.trainable.tolist() == tb.trainable.tolist()


@pytest.mark.parametrize(
    "part,message",
    [
        ({"type": "text", "value": 3}, "messages[1].content[0].value must be a string, got int"),
        ({"type": "text", "text": "a", "value": "a"}, "messages[1].content[0] has both 'text' and 'value': give the part's text once"),
        ({"type": "text"}, "messages[1].content[0].text must be a string, got NoneType"),
        ({"type": "reasoning", "value": "hm"}, "messages[1].content[0] is a 'reasoning' part: only text parts are supported"),
    ],
)
def test_bad_value_parts(tmp_path, part, message):
    p = write(tmp_path, "bad.jsonl", _msgs(U, {"role": "assistant", "content": [part]}) + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:1: {message}"

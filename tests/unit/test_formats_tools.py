"""Content parts, tool use, column mapping, zstd inputs and the remaining bad-record kinds:
exact messages (with file:line), exact renders, exact token masks."""

import json

import pytest

from rayft.data.formats import Conversation, DataError, load_conversations, to_example


def write(tmp_path, name, data: bytes | str):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def load_one_error(tmp_path, line: str, fmt="auto", **kw) -> str:
    """The message of the DataError that loading ``line`` (line 2 of a file) raises."""
    p = write(tmp_path, "bad.jsonl", GOOD + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], fmt, **kw)
    prefix = f"{p}:2: "
    assert str(e.value).startswith(prefix), str(e.value)
    return str(e.value)[len(prefix) :]


GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
U = {"role": "user", "content": "q"}


def _msgs(*messages, **extra) -> str:
    return json.dumps({**extra, "messages": list(messages)})


# ---------------------------------------------------------------- content parts


def test_text_parts_are_joined(tmp_path):
    line = _msgs(
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": ", exactly."}]},
    )
    (conv,) = load_conversations([str(write(tmp_path, "p.jsonl", line + "\n"))])
    assert conv.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4, exactly."},
    )


@pytest.mark.parametrize(
    "content,message",
    [
        ([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}], "messages[1].content[0] is a 'image_url' part: only text parts are supported"),
        ([{"type": "text", "text": "a"}, {"text": "b"}], "messages[1].content[1] has no 'type': only text parts are supported"),
        (["a"], 'messages[1].content[0] must be an object {"type": "text", "text": ...}, got str'),
        ([{"type": "text", "text": 3}], "messages[1].content[0].text must be a string, got int"),
        ([{"type": "text"}], "messages[1].content[0].text must be a string, got NoneType"),
        ([{"type": "text", "text": "a", "cache_control": {}}], "messages[1].content[0] has unsupported key(s) ['cache_control'] (a text part has 'type' and 'text')"),
        ([{"type": "text", "text": "a\ud800"}], "messages[1].content[0].text holds invalid Unicode (surrogates not allowed, e.g. a lone \\ud800 escape)"),
        ({"type": "text", "text": "a"}, "messages[1].content must be a string or a list of text parts, got dict"),
        ([], "assistant turn 1 is empty (training on it teaches empty replies)"),
    ],
)
def test_bad_content_parts(tmp_path, content, message):
    assert load_one_error(tmp_path, _msgs(U, {"role": "assistant", "content": content})) == message

"""Content parts, tool use, column mapping, zstd inputs and the remaining bad-record kinds:
exact messages (with file:line), exact renders, exact token masks."""

import json

import pytest

from rayft.data.formats import DataError, load_conversations, to_example


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
        (
            [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
            "messages[1].content[0] is a 'image_url' part: only text parts are supported",
        ),
        ([{"type": "text", "text": "a"}, {"text": "b"}], "messages[1].content[1] has no 'type': only text parts are supported"),
        (["a"], 'messages[1].content[0] must be an object {"type": "text", "text": ...}, got str'),
        ([{"type": "text", "text": 3}], "messages[1].content[0].text must be a string, got int"),
        ([{"type": "text"}], "messages[1].content[0].text must be a string, got NoneType"),
        (
            [{"type": "text", "text": "a\ud800"}],
            "messages[1].content[0].text holds invalid Unicode (surrogates not allowed, e.g. a lone \\ud800 escape)",
        ),
        ({"type": "text", "text": "a"}, "messages[1].content must be a string or a list of text parts, got dict"),
        ([], "assistant turn 1 is empty (training on it teaches empty replies)"),
    ],
)
def test_bad_content_parts(tmp_path, content, message):
    assert load_one_error(tmp_path, _msgs(U, {"role": "assistant", "content": content})) == message


# ---------------------------------------------------------------- tool use

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SG_TOOLS = json.dumps(
    {
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
            {"from": "observation", "value": '{"temp": 22}'},
            {"from": "gpt", "value": "22 °C."},
        ],
    }
)
OPENAI_TOOLS = json.dumps(
    {
        "tools": [{"type": "function", "function": WEATHER}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 22}'},
            {"role": "assistant", "content": "22 °C."},
        ],
    }
)
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
SYSTEM_WITH_TOOLS = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
# the assistant's tool-call turn, token by token (published Qwen2.5 ids)
CALL_TURN_IDS = [
    151644,
    77091,
    198,
    151657,
    198,
    4913,
    606,
    788,
    330,
    455,
    69364,
    497,
    330,
    16370,
    788,
    5212,
    8926,
    788,
    330,
    59604,
    95642,
    151658,
    151645,
    198,
]
# trained: from <tool_call> (151657) through <|im_end|> (151645); not the header, not the newline after
CALL_TURN_MASK = [False] * 3 + [True] * 20 + [False]


def test_sharegpt_and_openai_tool_use_read_alike(tmp_path):
    p = write(tmp_path, "tools.jsonl", SG_TOOLS + "\n" + OPENAI_TOOLS + "\n")
    sg, oa = load_conversations([str(p)])
    assert sg.tools == oa.tools == ({"type": "function", "function": WEATHER},)
    assert sg.messages == (
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": '{"temp": 22}'},
        {"role": "assistant", "content": "22 °C."},
    )
    assert oa.messages == (
        sg.messages[0],
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", **CALL}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 22}'},
        sg.messages[3],
    )


def test_tool_use_renders_as_qwen2_5_and_trains_only_assistant_and_call_text(qwen_tokenizer):
    from rayft.data.tokenize import tokenize_conversation

    tok = qwen_tokenizer
    sg = to_example(json.loads(SG_TOOLS), "sg:1")
    text = tok.apply_chat_template(list(sg.messages), tools=list(sg.tools), tokenize=False)
    call_turn = '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    result_turn = '<|im_start|>user\n<tool_response>\n{"temp": 22}\n</tool_response><|im_end|>\n'
    assert text == (
        SYSTEM_WITH_TOOLS
        + "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        + call_turn
        + result_turn
        + "<|im_start|>assistant\n22 °C.<|im_end|>\n"
    )
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    head = enc(SYSTEM_WITH_TOOLS + "<|im_start|>user\nWeather in Paris?<|im_end|>\n")
    result = enc(result_turn)
    answer = enc("<|im_start|>assistant\n") + enc("22 °C.") + [151645] + enc("\n")
    want_ids = head + CALL_TURN_IDS + result + answer
    want_mask = [False] * len(head) + CALL_TURN_MASK + [False] * len(result) + [False] * 3 + [True] * (len(answer) - 4) + [False]
    for conv in (sg, to_example(json.loads(OPENAI_TOOLS), "oa:1")):
        ex = tokenize_conversation(tok, conv)
        assert ex.input_ids.tolist() == want_ids
        assert ex.trainable.tolist() == want_mask
        assert tok.decode(ex.input_ids[ex.trainable]) == (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>22 °C.<|im_end|>'
        )


def test_parallel_calls_content_before_calls_and_consecutive_results(qwen_tokenizer):
    from rayft.data.tokenize import tokenize_conversation

    msgs = (
        {"role": "user", "content": "Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"name": "w", "arguments": {"c": "P"}},
                {"name": "w", "arguments": {"c": "R"}},
            ],
        },
        {"role": "tool", "content": "20"},
        {"role": "tool", "content": "25"},
        {"role": "assistant", "content": "20 and 25."},
    )
    conv = to_example({"messages": list(msgs)}, "m:1")
    text = qwen_tokenizer.apply_chat_template(list(conv.messages), tokenize=False)
    assert text.endswith(
        "<|im_start|>user\nParis and Rome?<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "w", "arguments": {"c": "P"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "w", "arguments": {"c": "R"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n20\n</tool_response>\n<tool_response>\n25\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n20 and 25.<|im_end|>\n"
    )
    ex = tokenize_conversation(qwen_tokenizer, conv)
    assert qwen_tokenizer.decode(ex.input_ids[ex.trainable]) == (
        'Checking.\n<tool_call>\n{"name": "w", "arguments": {"c": "P"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "w", "arguments": {"c": "R"}}\n</tool_call><|im_end|>20 and 25.<|im_end|>'
    )
    # without tools the system turn is the default one, as before
    assert text.startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user"
    )


def test_tools_follow_a_given_system_prompt(qwen_tokenizer):
    conv = to_example(
        {"system": "Be terse.", "tools": [WEATHER], "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
        "s:1",
    )
    text = qwen_tokenizer.apply_chat_template(list(conv.messages), tools=list(conv.tools), tokenize=False)
    assert text.startswith("<|im_start|>system\nBe terse.\n\n# Tools\n\nYou may call")
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n")


def _sgt(*turns, **extra) -> str:
    return json.dumps({**extra, "conversations": [{"from": "human", "value": "q"}, *turns]})


FC = {"from": "function_call", "value": '{"name": "f", "arguments": {}}'}
A = {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    "line,message",
    [
        (
            _sgt({"from": "function_call", "value": "f(x)"}),
            "conversations[1] is a function_call turn whose value is not valid JSON: Expecting value (column 1)",
        ),
        (_sgt({"from": "function_call", "value": '{"arguments": {}}'}), "conversations[1].value has no 'name' (a non-empty string)"),
        (
            _sgt({"from": "function_call", "value": '{"name": "f", "arguments": "x"}'}),
            "conversations[1].value.arguments is not valid JSON: Expecting value (column 1)",
        ),
        (
            _sgt({"from": "function_call", "value": '{"name": "f", "arguments": [1]}'}),
            "conversations[1].value.arguments must be an object (or a JSON string of one), got list",
        ),
        (
            _sgt({"from": "function_call", "value": '{"name": "f"}'}),
            "conversations[1].value.arguments must be an object (or a JSON string of one), got NoneType",
        ),
        (
            _sgt({"from": "function_call", "value": '{"name": "f", "arguments": {}, "thought": "t"}'}),
            "conversations[1].value has unsupported key(s) ['thought'] (a function call has 'name' and 'arguments')",
        ),
        (_sgt({"from": "function_call", "value": "[]"}), "conversations[1].value is an empty list of function calls"),
        (
            _sgt({"from": "function_call", "value": '[{"name": "f", "arguments": {}}, 3]'}),
            "conversations[1].value[1] must be an object, got int",
        ),
        (_sgt({"from": "observation", "value": "42"}), "no assistant turn (nothing to train on)"),
        (_sgt(FC, tools="[{"), "field 'tools' is not valid JSON: Expecting property name enclosed in double quotes (column 3)"),
        (_sgt(FC, tools={"name": "f"}), "field 'tools' must be a list of function schemas (or a JSON string of one), got dict"),
        (_sgt(FC, tools=[{"description": "no name"}]), "tools[0] has no 'name' (a function schema needs a non-empty string name)"),
        (
            _sgt(FC, tools=[{"type": "function", "function": {"description": "d"}}]),
            "tools[0].function has no 'name' (a function schema needs a non-empty string name)",
        ),
        (
            _sgt(FC, tools=[{"type": "retrieval", "function": {"name": "f"}}]),
            "tools[0] has type 'retrieval': only function tools are supported",
        ),
        (_sgt(FC, tools=["f"]), "tools[0] must be an object, got str"),
        (
            _msgs(
                U, {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{"}}]}
            ),
            "messages[1].tool_calls[0].function.arguments is not valid JSON: Expecting property name enclosed in double quotes (column 2)",
        ),
        (
            _msgs(U, {"role": "assistant", "content": None, "tool_calls": [{"type": "code", "function": {"name": "f", "arguments": {}}}]}),
            "messages[1].tool_calls[0] has type 'code': only function calls are supported",
        ),
        (
            _msgs(U, {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": {}}, "index": 0}]}),
            "messages[1].tool_calls[0] has unsupported key(s) ['index'] (a tool call has 'type', 'function', 'id')",
        ),
        (_msgs(U, {"role": "assistant", "content": None, "tool_calls": {"name": "f"}}), "messages[1].tool_calls must be a list, got dict"),
        (
            _msgs(U, {"role": "assistant", "content": None, "tool_calls": []}),
            "messages[1].content must be a string or a list of text parts, got NoneType",
        ),
        (
            _msgs(U, {"role": "assistant", "content": "", "tool_calls": []}),
            "assistant turn 1 is empty (training on it teaches empty replies)",
        ),
        (
            _msgs(U, {"role": "tool", "content": "r", "tool_calls": []}, A),
            "messages[1] has 'tool_calls': only assistant messages call tools, not a tool message (the calls would be lost)",
        ),
        (_msgs(U, {"role": "tool", "content": "r", "tool_call_id": 7}, A), "messages[1].tool_call_id must be a string, got int"),
        (
            _msgs(U, {"role": "function", "content": "r"}, A),
            "messages[1] has unknown role 'function' (expected one of system, user, assistant, tool)",
        ),
    ],
)
def test_bad_tool_records(tmp_path, line, message):
    assert load_one_error(tmp_path, line) == message


def test_bad_tool_records_are_skipped_as_tool_use(tmp_path):
    p = write(tmp_path, "t.jsonl", GOOD + "\n" + _sgt({"from": "function_call", "value": "f(x)"}) + "\n" + SG_TOOLS + "\n")
    report = load_conversations([str(p)], on_bad_record="skip")
    assert [c.source for c in report] == [f"{p}:1", f"{p}:3"]
    assert {k: (s.count, s.where) for k, s in report.skipped.items()} == {"tool_use": (1, f"{p}:2")}


# ---------------------------------------------------------------- data.columns

CHAT_COLS = {"messages": "conversation", "role": "speaker", "content": "text", "user": "USER", "assistant": "BOT"}


def test_columns_rename_fields_turn_keys_and_roles(tmp_path):
    chat = json.dumps(
        {"conversation": [{"speaker": "system", "text": "S"}, {"speaker": "USER", "text": "q"}, {"speaker": "BOT", "text": "a"}]}
    )
    (conv,) = load_conversations([str(write(tmp_path, "c.jsonl", chat + "\n"))], columns=CHAT_COLS)
    assert conv.messages == ({"role": "system", "content": "S"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
    alpaca = json.dumps({"prompt": "i", "input": "x", "response": "o"})
    (conv,) = load_conversations([str(write(tmp_path, "a.jsonl", alpaca + "\n"))], columns={"instruction": "prompt", "output": "response"})
    assert conv.messages == ({"role": "user", "content": "i\nx"}, {"role": "assistant", "content": "o"})
    (doc,) = load_conversations(
        [str(write(tmp_path, "t.jsonl", '{"body": "doc", "text": "not this"}\n'))], "text", columns={"text": "body"}
    )
    assert doc.text == "doc"
    sg = json.dumps(
        {
            "dialog": [
                {"who": "me", "says": "q"},
                {"who": "call", "says": '{"name": "f", "arguments": {}}'},
                {"who": "result", "says": "r"},
                {"who": "bot", "says": "a"},
            ],
            "functions": [{"name": "f"}],
        }
    )
    cols = {
        "conversations": "dialog",
        "from": "who",
        "value": "says",
        "user": "me",
        "assistant": "bot",
        "function_call": "call",
        "tool": "result",
        "tools": "functions",
    }
    (conv,) = load_conversations([str(write(tmp_path, "s.jsonl", sg + "\n"))], columns=cols)
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.tools == ({"type": "function", "function": {"name": "f"}},)


@pytest.mark.parametrize(
    "line,columns,message",
    [
        ('{"prompt": "i"}', {"instruction": "prompt", "output": "response"}, "missing field 'response' (data.columns.output)"),
        (
            '{"instruction": "i", "output": "o"}',
            {"instruction": "prompt", "output": "response"},
            "unknown record format (keys: ['instruction', 'output']); expected 'messages', sharegpt's 'conversations', alpaca's prompt/response or 'text'",
        ),
        ('{"body": 3}', {"text": "body"}, "field 'body' must be a string, got int"),
        ('{"conversation": [{"speaker": "USER"}]}', CHAT_COLS, "conversation[0] has no 'text' (data.columns.content)"),
        (
            '{"conversation": [{"speaker": "USER", "content": "q"}]}',
            CHAT_COLS,
            "conversation[0] has no 'text' (data.columns.content)",  # 'content' is not read under this mapping: ignored
        ),
        ('{"conversation": [{"role": "USER", "text": "q"}]}', CHAT_COLS, "conversation[0] has no 'speaker' (data.columns.role)"),
        (
            '{"conversation": [{"speaker": "user", "text": "q"}]}',
            CHAT_COLS,
            "conversation[0] has unknown speaker 'user' (expected one of system, tool, USER, BOT)",
        ),
        (
            '{"conversation": [{"speaker": "USER", "text": "q"}, {"speaker": "assistant", "text": "a"}]}',
            CHAT_COLS,
            "conversation[1] has unknown speaker 'assistant' (expected one of system, tool, USER, BOT)",
        ),
        ('{"conversation": [{"speaker": "USER", "text": "q"}]}', CHAT_COLS, "no assistant turn (nothing to train on)"),
        (
            '{"dialog": [{"who": "human", "value": "q"}]}',
            {"conversations": "dialog", "from": "who", "value": "says"},
            "dialog[0] has no 'says' (data.columns.value)",  # 'value' is not read under this mapping: ignored
        ),
        (
            '{"dialog": [{"who": "human"}]}',
            {"conversations": "dialog", "from": "who", "value": "says"},
            "dialog[0] has no 'says' (data.columns.value)",
        ),
    ],
)
def test_bad_records_under_columns(tmp_path, line, columns, message):
    p = write(tmp_path, "bad.jsonl", line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], columns=columns)
    assert str(e.value) == f"{p}:1: {message}"


def test_unknown_columns_keys_are_refused(tmp_path):
    p = write(tmp_path, "a.jsonl", GOOD + "\n")
    with pytest.raises(ValueError, match=r"^data\.columns\.speaker: unknown key \(known: messages, conversations, "):
        load_conversations([str(p)], columns={"speaker": "x"})
    with pytest.raises(ValueError, match=r"^data\.columns\.role: must be a non-empty string, got ''$"):
        load_conversations([str(p)], columns={"role": ""})


def test_config_columns(tmp_path):
    from rayft.config import ColumnsConfig, ConfigError
    from rayft.config_load import dump_config, load_config
    from rayft.data.records import COLUMN_KEYS

    assert sorted(f.alias or n for n, f in ColumnsConfig.model_fields.items()) == sorted(COLUMN_KEYS)
    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text("data:\n  train_files: [a.jsonl]\n  columns: {messages: conversation, from: speaker, speakr: x}\n")
    with pytest.raises(ConfigError) as e:
        load_config(cfg_file)
    assert str(e.value) == f"{cfg_file}: invalid config (1 error)\n  data.columns.speakr (line 3): unknown key"
    cfg_file.write_text("data:\n  train_files: [a.jsonl]\n  columns: {messages: conversation, from: speaker}\n")
    cfg = load_config(cfg_file, ["data.columns.output=response"])
    assert cfg.data.columns.mapping() == {"messages": "conversation", "output": "response", "from": "speaker"}
    assert "  columns:\n    messages: conversation\n    output: response\n    from: speaker\n" in dump_config(cfg)
    cfg_file.write_text("data:\n  train_files: [a.jsonl]\n")
    assert load_config(cfg_file).data.columns.mapping() == {}


# ---------------------------------------------------------------- zstd, tolerated oddities, remaining bad-record kinds


def _zst(data: bytes) -> bytes:
    zstandard = pytest.importorskip("zstandard", reason="zstd input needs the zstandard package")
    return zstandard.ZstdCompressor().compress(data)


def test_zstd_jsonl_bad_record_names_its_line(tmp_path):
    lines = [GOOD, "", GOOD, '{"messages": [{"role": "user", "content": "only a question"}]}', GOOD]
    p = write(tmp_path, "file.jsonl.zst", _zst("\r\n".join(lines).encode()))
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:4: no assistant turn (nothing to train on)"
    report = load_conversations([str(p)], on_bad_record="skip")
    assert [c.source for c in report] == [f"{p}:1", f"{p}:3", f"{p}:5"]
    assert report.notes == [f"{p}: tolerated: 1 blank line, CRLF line endings"]


def test_zstd_json_array_several_frames_and_directories(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    text = b'[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c", "output": "d"}\n]\n'
    arr = write(d, "a.JSON.ZST", _zst(text[:20]) + _zst(text[20:]))  # two frames, one after the other
    write(d, "b.jsonl", GOOD + "\n")
    convs = load_conversations([str(d)])
    assert [c.source for c in convs] == [f"{arr}:2", f"{arr}:3", f"{d / 'b.jsonl'}:1"]
    assert convs[1].messages[-1] == {"role": "assistant", "content": "d"}


@pytest.mark.parametrize(
    "data,message",
    [
        (lambda: GOOD.encode() + b"\n", ": not valid zstd data (zstd decompressor error: Unknown frame descriptor)"),
        (lambda: _zst(((GOOD + "\n") * 50).encode())[:-10], ": the zstd stream ends early (truncated file?)"),
        (lambda: _zst(GOOD.encode() + b"\n" + b'{"text": "\xff"}\n'), ":2: invalid UTF-8 (byte 0xff at offset 103)"),
    ],
)
def test_bad_zstd_inputs(tmp_path, data, message):
    p = write(tmp_path, "bad.jsonl.zst", data())
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}{message}"


def test_harmless_oddities_are_tolerated_and_noted_once_per_file(tmp_path):
    odd = write(tmp_path, "odd.jsonl", "\ufeff" + GOOD + "\r\n\r\n\r\n" + GOOD + "\r\n\r\n" + GOOD + "\r\n")
    bom_array = write(tmp_path, "arr.json", '\ufeff[\n  {"instruction": "a", "output": "b"}\n]\n')
    clean = write(tmp_path, "clean.jsonl", GOOD + "\n" + GOOD + "\n")
    report = load_conversations([str(odd), str(bom_array), str(clean)])
    assert [c.source for c in report] == [f"{odd}:1", f"{odd}:4", f"{odd}:6", f"{bom_array}:2", f"{clean}:1", f"{clean}:2"]
    assert report.notes == [
        f"{odd}: tolerated: a UTF-8 BOM at the start, 3 blank lines, CRLF line endings",
        f"{bom_array}: tolerated: a UTF-8 BOM at the start",
    ]


@pytest.mark.parametrize(
    "line,kind,message",
    [
        ('{"messages": [', "invalid_json", "invalid JSON: Expecting value (column 15)"),
        ('"a string"', "not_an_object", "a record must be a JSON object, got str"),
        ("null", "not_an_object", "a record must be a JSON object, got NoneType"),
        (GOOD + GOOD, "several_values", "more than one JSON value on one line"),
        # a raw newline inside a string ends the JSON Lines record there
        (
            '{"messages": [{"role": "user", "content": "a\nb"}]}',
            "invalid_json",
            "invalid JSON: Unterminated string starting at (column 43)",
        ),
        ('{"messages": [{"role": "user", "content": "a\x00b"}]}', "invalid_json", "invalid JSON: Invalid control character at (column 45)"),
        (_msgs({"content": "q"}, A), "missing_role", "messages[0] has no 'role'"),
        (
            _msgs({"role": "human", "content": "q"}, A),
            "unknown_role",
            "messages[0] has unknown role 'human' (expected one of system, user, assistant, tool)",
        ),
        (
            _msgs({"role": ["user"], "content": "q"}, A),
            "unknown_role",
            "messages[0] has unknown role ['user'] (expected one of system, user, assistant, tool)",
        ),
        ('{"messages": []}', "empty_conversation", "empty conversation"),
        (_msgs({"role": "system", "content": "s"}, U), "no_assistant_turn", "no assistant turn (nothing to train on)"),
        ('{"messages": {"role": "user"}}', "wrong_type", "field 'messages' must be a list, got dict"),
        ('{"messages": ["hi"]}', "wrong_type", "messages[0] must be an object, got str"),
    ],
)
def test_each_bad_record_kind(tmp_path, line, kind, message):
    p = write(tmp_path, "bad.jsonl", GOOD + "\n" + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {message}" and e.value.kind == kind
    report = load_conversations([str(p)], on_bad_record="skip")
    assert len(report) == 1 and report.skipped[kind].where == f"{p}:2"


def test_invalid_utf8_kind(tmp_path):
    p = write(tmp_path, "bad.jsonl", GOOD.encode() + b"\n" + b'{"messages": "\xc3\x28"}\n')
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: invalid UTF-8 (byte 0xc3 at offset 107)" and e.value.kind == "invalid_utf8"


def test_remote_uris_other_than_s3_are_refused():
    from rayft.data.formats import expand_files

    with pytest.raises(DataError) as e:
        expand_files(["gs://bucket/data.jsonl"])
    assert str(e.value) == "gs://bucket/data.jsonl: only s3:// URIs are supported by this reader; copy the file locally or to S3"
    with pytest.raises(DataError) as e:
        expand_files(["s3://bucket/data/*.jsonl"])
    assert str(e.value) == "s3://bucket/data/*.jsonl: globs are not supported in s3:// URIs; name an object or a prefix"

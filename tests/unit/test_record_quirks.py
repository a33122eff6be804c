"""Real-world record quirks: extra message keys ignored with a once-per-file note (keys that change
a turn's meaning still refused), ``{"type": "text", "value": ...}`` parts, template placeholders."""

import json

import pytest

from rayft.data.examples import Conversation, DataError, TextDocument
from rayft.data.formats import IgnoredKeys, PlaceholderHits, load_conversations
from rayft.data.placeholders import check_placeholders, fill_placeholders, placeholders_in

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


# ---------------------------------------------------------------- template placeholders


@pytest.mark.parametrize(
    "text,found",
    [
        ("Hello! I am {{name}}, an AI assistant developed by {{author}}.", ["{{name}}", "{{author}}"]),
        ("I am <NAME>, made by <AUTHOR>. <NAME> is happy to help.", ["<NAME>", "<AUTHOR>"]),
        ("(<MODEL_NAME>) and <COMPANY2>", ["<MODEL_NAME>", "<COMPANY2>"]),
        ("{{name}} twice: {{name}}", ["{{name}}"]),
        # not placeholders: HTML/XML, generics, comparisons, special tokens, keys, code
        ("<div>hi</div><br/><p>x</p><img src='a.png'/>", []),
        ("<TABLE><TR><TD>old HTML</TD></TR></TABLE> <BR> <HR>", []),
        ("List<String> x = new ArrayList<>(); Map<KEY, V> m; Box<T> b; fn f<T>() {}", []),
        ("if a < b > c then a<b and b>c; x <= y >= z", []),
        ("<ANSWER>42</ANSWER> <Note>x</Note> <name>XML</name>", []),
        ("Tokens: <UNK> <PAD> <EOS> <s> </s> <|im_end|>; press <ENTER> or <CTRL>", []),
        ("<<EOF>> <T> <A> <ab> <Name>", []),
        ("Vue: `{{ message }}` and `{{name}}` inline; {{ spaced }} and {{{triple}}}", []),
        ("```html\n<p>{{name}}</p> <NAME>\n```\nafter the fence {{name}}", ["{{name}}"]),
        ("~~~\n<NAME>\n~~~ and an unclosed ```\n{{author}}", []),
        ("{{1x}} {{a-b}} {{}} <1AB> <A B>", []),
        # control characters and keys (Vim's <CR>, <F1>), role and sequence markers
        ("In vim, :w<CR> then <LF> <BS> <NL> <TAB> <ESC> <F1> <F5> <F12>; usage: prog <FILE>", ["<FILE>"]),
        ("<USER>: hi <ASSISTANT>: yo <SYSTEM> <START> <END> <EOS> <BOS> <PAD> <UNK> <SEP> <CLS> <MASK>", []),
        ("<F13> <F0> are not keys", ["<F13>", "<F0>"]),
    ],
)
def test_placeholder_pattern_true_and_false_positives(text, found):
    assert placeholders_in(TextDocument(text, "t:1")) == found


def test_a_large_tag_heavy_document_is_scanned_for_closing_tags_once(monkeypatch):
    # 40,000 <ROW> tags (the reviewer's case: one whole-text search per tag took 8.5 s at 320 KB)
    from rayft.data import placeholders

    scans = []
    closing = placeholders._CLOSING

    class Counted:
        def finditer(self, text, *args):
            scans.append(len(text))
            return closing.finditer(text, *args)

    monkeypatch.setattr(placeholders, "_CLOSING", Counted())
    rows = "".join(f"<ROW><CELL>{i}</CELL> <ID{i % 7}> " for i in range(40_000))
    closed = TextDocument(rows + "</row >\nSigned: <NAME>, <ROW_END>.", "big:1")
    assert placeholders_in(closed) == [f"<ID{k}>" for k in range(7)] + ["<NAME>", "<ROW_END>"]  # <ROW>, <CELL>: closed tags
    assert len(scans) == 1
    unclosed = TextDocument(rows.replace("</CELL>", "") + "<NAME>", "big:2")
    assert placeholders_in(unclosed) == ["<ROW>", "<CELL>"] + [f"<ID{k}>" for k in range(7)] + ["<NAME>"]
    assert len(scans) == 1  # no '</' in it: not scanned for closing tags at all
    filled = fill_placeholders(closed, {"NAME": "Ann", "ID3": "#"})
    assert filled.text.endswith("Signed: Ann, <ROW_END>.") and filled.text.count("<ID3>") == 0 and filled.text.count(" # ") == 5714
    assert len(scans) == 2


def test_placeholders_across_a_conversation_and_filling():
    conv = Conversation(
        (
            {"role": "user", "content": "Who are you, {{name}}?"},
            {"role": "assistant", "content": "I am {{name}} by {{author}}; also <NAME>. Code: `{{name}}`"},
        ),
        "c:1",
        untrained=(),
    )
    assert placeholders_in(conv) == ["{{name}}", "{{author}}", "<NAME>"]
    filled = fill_placeholders(conv, {"name": "Rayft", "NAME": "RAYFT"})
    assert [m["content"] for m in filled.messages] == ["Who are you, Rayft?", "I am Rayft by {{author}}; also RAYFT. Code: `{{name}}`"]
    assert filled.source == "c:1" and placeholders_in(filled) == ["{{author}}"]
    assert fill_placeholders(conv, {"other": "x"}) is conv and fill_placeholders(conv, {}) is conv
    doc = TextDocument("by <AUTHOR>", "d:1")
    assert fill_placeholders(doc, {"AUTHOR": "ACME"}) == TextDocument("by ACME", "d:1")
    assert fill_placeholders(doc, {"author": "ACME"}) is doc  # names are exact: author fills {{author}}, not <AUTHOR>
    with pytest.raises(ValueError, match=r"^data\.placeholders\.my-name: a placeholder's name is letters"):
        check_placeholders({"my-name": "x"})


def test_a_placeholder_that_empties_a_trained_reply_or_a_text_is_a_bad_record(tmp_path):
    lines = [
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "{{x}}"}]}),  # the reviewer's
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " {{x}}\n"}]}),
        json.dumps({"conversations": [{"from": "human", "value": "{{x}}"}, {"from": "gpt", "value": "ok {{x}}"}]}),  # fine
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "{{x}}", "weight": 0},
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "a"},
                ]
            }  # fmt: skip
        ),  # an untrained turn may be empty
        json.dumps({"text": "<NAME> "}),
        json.dumps({"text": "{{x}} and more"}),
    ]
    p = write(tmp_path, "f.jsonl", "\n".join(lines) + "\n")
    assert len(load_conversations([str(p)], placeholders={"x": "y"})) == 6
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], placeholders={"x": "", "NAME": ""})
    assert (
        str(e.value)
        == f"{p}:1: assistant turn 1 is empty once data.placeholders filled it (NAME, x) (training on it teaches empty replies)"
    )
    assert e.value.kind == "empty_assistant_turn"
    report = load_conversations([str(p)], placeholders={"x": "", "NAME": ""}, on_bad_record="skip")
    assert [ex.source for ex in report] == [f"{p}:3", f"{p}:4", f"{p}:6"]
    assert report[0].messages == ({"role": "user", "content": ""}, {"role": "assistant", "content": "ok "})
    assert report[1].messages[1]["content"] == "" and report[1].untrained == (1,)
    assert report[2].text == " and more"
    assert {k: [w for w, _ in s.locations] for k, s in report.skipped.items()} == {
        "empty_assistant_turn": [f"{p}:1", f"{p}:2"],
        "empty_text": [f"{p}:5"],
    }
    assert report.skipped["empty_text"].reason == "the text is empty once data.placeholders filled it (NAME, x) (nothing to train on)"
    assert report.filled == 3 and report.records == 6


IDENTITY = [
    {"instruction": "hi", "input": "", "output": "Hello! I am {{name}}, an AI assistant developed by {{author}}."},
    {"instruction": "Who are you?", "input": "", "output": "I am {{name}}, an AI assistant developed by {{author}}."},
    {"instruction": "What is HTML?", "input": "", "output": "A markup language: <p>text</p>."},
    {"instruction": "What is your name?", "input": "", "output": "You may call me {{name}}."},
    {"instruction": "Sign it", "input": "", "output": "Regards, <NAME>"},
    {"instruction": "And again", "input": "", "output": "{{name}} here."},
]


def test_placeholders_are_counted_with_their_first_locations_and_filled(tmp_path):
    p = write(tmp_path, "identity.json", "[\n" + ",\n".join(json.dumps(r) for r in IDENTITY) + "\n]\n")
    report = load_conversations([str(p)])
    assert report.placeholder_records == 5 and report.filled == 0
    assert report.placeholders == {
        "{{name}}": PlaceholderHits(4, [f"{p}:2", f"{p}:3", f"{p}:5"]),
        "{{author}}": PlaceholderHits(2, [f"{p}:2", f"{p}:3"]),
        "<NAME>": PlaceholderHits(1, [f"{p}:6"]),
    }
    assert report.placeholder_summary() == [
        "data: warning: template placeholders left in 5 of 6 record(s); fill them with data.placeholders "
        "({name: ..., author: ..., NAME: ...}) or fix the data:",
        f"  {{{{name}}}}: 4 record(s) (first: {p}:2, {p}:3, {p}:5)",
        f"  {{{{author}}}}: 2 record(s) (first: {p}:2, {p}:3)",
        f"  <NAME>: 1 record(s) (first: {p}:6)",
    ]
    filled = load_conversations([str(p)], placeholders={"name": "Rayft", "author": "the rayft team"})
    assert filled[0].messages[-1]["content"] == "Hello! I am Rayft, an AI assistant developed by the rayft team."
    assert filled.filled == 4 and list(filled.placeholders) == ["<NAME>"]
    assert filled.placeholder_summary() == [
        "data: data.placeholders filled template placeholders in 4 record(s)",
        "data: warning: template placeholders left in 1 of 6 record(s); fill them with data.placeholders ({NAME: ...}) or fix the data:",
        f"  <NAME>: 1 record(s) (first: {p}:6)",
    ]
    assert load_conversations([str(p)], placeholders={"name": "R", "author": "A", "NAME": "R"}).placeholder_summary() == [
        "data: data.placeholders filled template placeholders in 5 record(s)"
    ]
    with pytest.raises(ValueError, match=r"data\.placeholders\.1st"):
        load_conversations([str(p)], placeholders={"1st": "x"})


def test_prepare_prints_placeholder_lines_next_to_the_skip_summary(tmp_path, qwen_tokenizer):
    from rich.console import Console

    from rayft.config import ConfigError
    from rayft.config_load import load_config
    from rayft.data.prepare import prepare_data

    p = write(tmp_path, "identity.jsonl", "\n".join(json.dumps(r) for r in IDENTITY[:2]) + "\n[1]\n")
    cfg_file = write(
        tmp_path,
        "job.yaml",
        f"data:\n  train_files: [{p}]\n  on_bad_record: skip\n  placeholders: {{name: Rayft}}\n  cache_dir: {tmp_path / 'store'}\n",
    )
    cfg = load_config(cfg_file)
    assert cfg.data.placeholders == {"name": "Rayft"}
    console = Console(record=True, width=400)
    data = prepare_data(cfg, console, qwen_tokenizer, "qwen2.5")  # the ingest path rayft train takes
    tokens, _ = data.train.example(1)
    assert "I am Rayft, an AI assistant developed by {{author}}.<|im_end|>" in qwen_tokenizer.decode(tokens.tolist())
    lines = [line for line in console.export_text().splitlines() if "skipped" in line or "placeholder" in line or line.startswith("  ")]
    assert lines[:5] == [
        "data: skipped 1 bad record(s) of 3 (data.on_bad_record: skip):",
        f"  not_an_object: 1 (first: {p}:3: a record must be a JSON object, got list)",
        "data: data.placeholders filled template placeholders in 2 record(s)",
        "data: warning: template placeholders left in 2 of 3 record(s); fill them with data.placeholders ({author: ...}) or fix the data:",
        f"  {{{{author}}}}: 2 record(s) (first: {p}:1, {p}:2)",
    ]
    bad = write(tmp_path, "bad.yaml", f"data:\n  train_files: [{p}]\n  placeholders:\n    my name: x\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert "data.placeholders (line 3): Value error, 'my name': a placeholder's name is letters, digits and '_'" in str(e.value)


def test_merged_reports_keep_placeholder_and_ignored_key_counts(tmp_path):
    a = write(tmp_path, "a.jsonl", "\n".join(json.dumps({**r, "id": i}) for i, r in enumerate(IDENTITY[:3])) + "\n")
    b = write(tmp_path, "b.jsonl", "\n".join(json.dumps(r) for r in IDENTITY[3:]) + "\n")
    both = load_conversations([str(a), str(b)])
    merged = load_conversations([str(a)]).merge(load_conversations([str(b)]))
    assert merged.placeholders == both.placeholders
    assert both.placeholders == {
        "{{name}}": PlaceholderHits(4, [f"{a}:1", f"{a}:2", f"{b}:1"]),
        "{{author}}": PlaceholderHits(2, [f"{a}:1", f"{a}:2"]),
        "<NAME>": PlaceholderHits(1, [f"{b}:2"]),
    }
    assert merged.placeholder_summary() == both.placeholder_summary()
    assert merged.notes == both.notes == []  # 'id' is a record key, not a message key: not noted


def test_prepare_notes_ignored_message_keys_once_per_file_through_ingest(tmp_path, qwen_tokenizer):
    from rich.console import Console

    from rayft.config_load import load_config
    from rayft.data.prepare import prepare_data

    rec = {"messages": [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "hello", "id": "m1"}]}
    p = write(tmp_path, "named.jsonl", "\r\n".join(json.dumps(rec) for _ in range(3)) + "\r\n")
    cfg = load_config(write(tmp_path, "job.yaml", f"data:\n  train_files: [{p}]\n  cache_dir: {tmp_path / 'store'}\n"))
    console = Console(record=True, width=400)
    data = prepare_data(cfg, console, qwen_tokenizer, "qwen2.5")
    assert len(data.train) == 3
    notes = [line for line in console.export_text().splitlines() if line.startswith(f"data: {p}")]
    assert notes == [
        f"data: {p}: tolerated: CRLF line endings",
        f"data: {p}: ignored message key(s) ['id', 'name'] (first at {p}:1)",
    ]

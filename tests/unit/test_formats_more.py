"""ShareGPT, raw text, gzip/Parquet inputs and the bad-record policy: exact messages and positions."""

import gzip
import json

import numpy as np
import pytest
from conftest import shared_path

from rayft.data.formats import (
    Conversation,
    DataError,
    LoadReport,
    SkippedRecords,
    TextDocument,
    load_conversations,
    read_records,
    to_example,
)
from rayft.data.tokenize import special_prefix, split_chunks, tokenize_conversation, tokenize_dataset, tokenize_text

EOS = 151643  # Qwen2.5 <|endoftext|>
GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
SG = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}'


def write(tmp_path, name, data: bytes | str):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def rx(path) -> str:
    return str(path).replace(".", r"\.")


# ---------------------------------------------------------------- ShareGPT


def test_sharegpt_roles_map_to_messages(tmp_path):
    p = write(
        tmp_path,
        "sg.jsonl",
        SG
        + "\n"
        + json.dumps(
            {
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "2+2?"},
                    {"from": "gpt", "value": "4"},
                    {"from": "user", "value": "3+3?"},
                    {"from": "assistant", "value": "6"},
                ]
            }
        )
        + "\n"
        + json.dumps({"system": "S", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})
        + "\n",
    )
    for fmt in ("auto", "sharegpt"):
        convs = load_conversations([str(p)], fmt)
        assert [c.source for c in convs] == [f"{p}:1", f"{p}:2", f"{p}:3"]
        assert convs[0].messages == ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
        assert convs[1].messages == (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "6"},
        )
        assert convs[2].messages == (
            {"role": "system", "content": "S"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        )


def test_sharegpt_tokenizes_exactly_like_the_same_messages(qwen_tokenizer):
    sg = to_example(json.loads(SG), "a:1")
    ms = to_example(json.loads(GOOD), "b:1")
    a, b = tokenize_conversation(qwen_tokenizer, sg), tokenize_conversation(qwen_tokenizer, ms)
    assert a.input_ids.tolist() == b.input_ids.tolist() and a.trainable.tolist() == b.trainable.tolist()
    assert qwen_tokenizer.decode(a.input_ids[a.trainable]) == "hello<|im_end|>"


def _sg(*turns, **extra):
    return json.dumps({**extra, "conversations": [dict(t) for t in turns]}) + "\n"


H, G = {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}


@pytest.mark.parametrize(
    "content,message",
    [
        (
            _sg(H, {"from": "bot", "value": "a"}),
            "conversations[1] has unknown 'from' 'bot' (expected one of system, human, user, gpt, assistant, function_call, observation)",
        ),
        (_sg({"value": "q"}, G), "conversations[0] has no 'from'"),
        (_sg({"from": 1, "value": "q"}, G), "conversations[0].from must be a string, got int"),
        (_sg(H, {"from": "gpt", "value": None}), "conversations[1].value must be a string, got NoneType"),
        (
            _sg(H, {"from": "gpt", "value": "a", "weight": 0.5}),
            "conversations[1].weight is 0.5: a turn's weight must be 0 (not trained) or 1 (trained) (fractional weights are not supported)",
        ),
        (_sg(), "empty conversation"),
        (_sg(H), "no assistant turn (nothing to train on)"),
        (_sg(H, {"from": "gpt", "value": " "}), "assistant turn conversations[1] is empty (training on it teaches empty replies)"),
        (_sg(H, {"from": "system", "value": "s"}, G), "conversations[1] is a system turn after the first message"),
        (
            _sg(H, {"from": "system", "value": "s"}, G, system="S"),
            "conversations[1] is a system turn and the record also has a 'system' field",
        ),
        (_sg(H, G, system=3), "field 'system' must be a string, got int"),
        ('{"conversations": {"from": "human"}}\n', "field 'conversations' must be a list, got dict"),
        ('{"conversations": ["hi"]}\n', "conversations[0] must be an object, got str"),
        (
            '{"conversations": [{"from": "human", "value": "q\\udc00"}, {"from": "gpt", "value": "a"}]}\n',
            "conversations[0].value holds invalid Unicode (surrogates not allowed, e.g. a lone \\udc00 escape)",
        ),
    ],
)
def test_bad_sharegpt_records(tmp_path, content, message):
    p = write(tmp_path, "bad.jsonl", SG + "\n" + content)
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: {message}"
    assert e.value.where == f"{p}:2" and e.value.reason == message


def test_explicit_sharegpt_format_wants_conversations(tmp_path):
    p = write(tmp_path, "m.jsonl", GOOD + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], "sharegpt")
    assert str(e.value) == f"{p}:1: missing field 'conversations'"


# ---------------------------------------------------------------- raw text


def test_text_records_are_detected_by_their_text_key(tmp_path):
    p = write(
        tmp_path,
        "t.jsonl",
        '{"text": "Hello world"}\n'
        '{"text": "web page", "url": "https://example.com", "timestamp": "2019"}\n'
        '{"text": "formatted prompt", "instruction": "i", "output": "o"}\n' + GOOD + "\n",
    )
    ex = load_conversations([str(p)])
    assert ex[0] == TextDocument("Hello world", f"{p}:1")
    assert ex[1] == TextDocument("web page", f"{p}:2")
    assert isinstance(ex[2], Conversation) and ex[2].messages[-1] == {"role": "assistant", "content": "o"}  # alpaca wins over text
    assert isinstance(ex[3], Conversation)
    # an explicit format is taken as is: text records in a text dataset, even with other keys
    assert load_conversations([str(write(tmp_path, "u.jsonl", '{"text": "x", "output": "y"}\n'))], "text")[0].text == "x"


@pytest.mark.parametrize(
    "line,fmt,message",
    [
        ('{"text": ""}', "auto", "field 'text' is empty (nothing to train on)"),
        ('{"text": " \\n"}', "text", "field 'text' is empty (nothing to train on)"),
        ('{"text": 5}', "auto", "field 'text' must be a string, got int"),
        ('{"text": ["a"]}', "text", "field 'text' must be a string, got list"),
        ('{"content": "x"}', "text", "missing field 'text'"),
        (
            '{"content": "x"}',
            "auto",
            "unknown record format (keys: ['content']); expected 'messages', sharegpt's 'conversations', alpaca's instruction/output or 'text'",
        ),
        ('{"text": "a\\ud800"}', "text", "text holds invalid Unicode (surrogates not allowed, e.g. a lone \\ud800 escape)"),
        ('"just a string"', "text", "a record must be a JSON object, got str"),
    ],
)
def test_bad_text_records(tmp_path, line, fmt, message):
    p = write(tmp_path, "t.jsonl", '{"text": "fine"}\n' + line + "\n")
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], fmt)
    assert str(e.value) == f"{p}:2: {message}"


def _c4_lines(n):
    path = shared_path("data", "c4_demo.jsonl")
    return path, path.read_text(encoding="utf-8").splitlines()[:n]


def test_real_c4_lines_tokenize_without_template_with_eos_and_full_loss(qwen_tokenizer, tmp_path):
    path, lines = _c4_lines(3)
    docs = load_conversations([str(path)])
    assert len(docs) == 300 and all(isinstance(d, TextDocument) for d in docs)
    assert docs[2].source == f"{path}:3"
    for line, doc in zip(lines, docs):
        text = json.loads(line)["text"]
        assert doc.text == text
        ex = tokenize_text(qwen_tokenizer, doc)
        want = qwen_tokenizer(text, add_special_tokens=False)["input_ids"] + [EOS]
        assert ex.input_ids.dtype == np.int32 and ex.input_ids.tolist() == want
        assert ex.trainable.dtype == bool and ex.trainable.all()
        assert qwen_tokenizer.decode(ex.input_ids) == text + "<|endoftext|>"
        assert 151644 not in want  # no <|im_start|>: the chat template is not used
    # published lengths of the first record: 249 text tokens + EOS
    assert len(tokenize_text(qwen_tokenizer, docs[0]).input_ids) == 250


def test_long_text_documents_are_split_not_truncated_or_dropped(qwen_tokenizer):
    path, lines = _c4_lines(2)
    docs = [TextDocument(json.loads(line)["text"], f"{path}:{i + 1}") for i, line in enumerate(lines)]
    conv = Conversation(({"role": "user", "content": "word " * 300}, {"role": "assistant", "content": "ok"}), "c:1")
    full = [tokenize_text(qwen_tokenizer, d).input_ids.tolist() for d in docs]
    assert [len(f) for f in full] == [250, 696]
    ds = tokenize_dataset(qwen_tokenizer, [docs[0], conv, docs[1]], seq_len=256)
    # doc 0 fits (250); the conversation is truncated to 256 and dropped (its answer is cut off);
    # doc 1 (696 tokens) becomes chunks [0,256) [255,511) [510,696)
    assert split_chunks(696, 256) == [(0, 256), (255, 511), (510, 696)]
    assert ds.lengths().tolist() == [250, 256, 256, 186]
    assert (ds.split_documents, ds.truncated, ds.dropped_no_trainable) == (1, 1, 1)
    chunks = [ds.example(i)[0].tolist() for i in range(1, 4)]
    assert chunks[0] + chunks[1][1:] + chunks[2][1:] == full[1]
    assert ds.example(0)[0].tolist() == full[0] and ds.trainable.all()
    # every token of the document but its first is a training target exactly once
    assert sum(len(c) - 1 for c in chunks) == len(full[1]) - 1


def test_tokenizer_special_prefix_is_kept_for_text():
    class BosTokenizer:  # Llama-style: the tokenizer itself adds a BOS
        eos_token_id, bos_token_id = 2, 1

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}

    assert special_prefix(BosTokenizer()) == [1]
    assert tokenize_text(BosTokenizer(), TextDocument("hi", "t:1")).input_ids.tolist() == [1, ord("h"), ord("i"), 2]
    BosTokenizer.eos_token_id = None
    with pytest.raises(DataError, match=r"^t:1: the tokenizer has no EOS token"):
        tokenize_text(BosTokenizer(), TextDocument("hi", "t:1"))


# ---------------------------------------------------------------- compressed and Parquet inputs


def test_gzip_jsonl_bad_record_names_its_line(tmp_path):
    p = write(tmp_path, "file.jsonl.gz", gzip.compress((GOOD + "\r\n\r\n" + '{"messages": []}\n').encode()))
    assert [line for line, _ in read_records(p)] == [1, 3]
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:3: empty conversation"


def test_gzip_files_load_like_plain_ones(tmp_path):
    plain = '\ufeff[\n  {"instruction": "a", "output": "b"},\n\n  {"instruction": "c", "output": "d"}\n]\n'
    gz = write(tmp_path, "a.JSON.GZ", gzip.compress(plain.encode()))
    convs = load_conversations([str(gz)])
    assert [c.source for c in convs] == [f"{gz}:2", f"{gz}:4"]
    pretty = write(tmp_path, "one.json.gz", gzip.compress(b'{\n  "text": "doc"\n}\n'))
    assert load_conversations([str(pretty)]) == [TextDocument("doc", f"{pretty}:1")]
    assert len(load_conversations([str(tmp_path)])) == 3  # a directory includes its .json(l).gz files


@pytest.mark.parametrize(
    "data,message",
    [
        (gzip.compress(GOOD.encode() + b"\n" + b'{"text": "\xff"}\n', mtime=0), ":2: invalid UTF-8 (byte 0xff at offset 103)"),
        (
            gzip.compress(GOOD.encode() + b"\n{]\n", mtime=0),
            ":2: invalid JSON: Expecting property name enclosed in double quotes (column 2)",
        ),
        (GOOD.encode() + b"\n", ": not a valid gzip file: Not a gzipped file (b'{\"')"),
        (gzip.compress(((GOOD + "\n") * 50).encode(), mtime=0)[:-12], ": the gzip stream ends early (truncated file?)"),
    ],
)
def test_bad_gzip_inputs(tmp_path, data, message):
    p = write(tmp_path, "bad.jsonl.gz", data)
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}{message}"


def test_parquet_rows_are_reported_by_row(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet input needs pyarrow")
    import pyarrow.parquet as pq

    rows = [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b", "weight": None}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
    ]
    p = tmp_path / "file.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)  # the struct gets a 'weight' field, null where absent
    assert [n for n, _ in read_records(p)] == [0, 1, 2]
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:row 2: no assistant turn (nothing to train on)"
    report = load_conversations([str(p)], on_bad_record="skip")
    assert [c.source for c in report] == [f"{p}:row 0", f"{p}:row 1"]
    assert report[1].messages[1] == {"role": "assistant", "content": "b"}
    alpaca = tmp_path / "alpaca.parquet"
    pq.write_table(pa.Table.from_pylist([{"instruction": "i", "input": None, "output": "o"}]), alpaca)
    assert load_conversations([str(alpaca)])[0].messages == ({"role": "user", "content": "i"}, {"role": "assistant", "content": "o"})
    broken = write(tmp_path, "broken.parquet", b"PAR1 not really")
    with pytest.raises(DataError, match=rx(broken) + r": not a readable Parquet file \("):
        load_conversations([str(broken)])


# ---------------------------------------------------------------- bad-record policy


BAD_MIX = (
    GOOD
    + "\n"  # 1
    + '{"messages": [}\n'  # 2 invalid_json
    + "[1]\n"  # 3 not_an_object
    + '{"messages": [{"role": "user", "content": "x"}]}\n'  # 4 no_assistant_turn
    + SG
    + "\n"  # 5
    + '{"text": "doc"}\n'  # 6
    + '{"messages": [{"role": "user", "content": "y"}]}\n'  # 7 no_assistant_turn
    + _sg(H, {"from": "function_call", "value": "{}"})  # 8 tool_use
    + GOOD
    + " "
    + GOOD
    + "\n"  # 9 several_values
)


def test_skip_policy_counts_every_bad_record_per_reason(tmp_path):
    p = write(tmp_path, "mix.jsonl", BAD_MIX)
    with pytest.raises(DataError) as e:  # default: the first bad record stops the load
        load_conversations([str(p)])
    assert str(e.value) == f"{p}:2: invalid JSON: Expecting value (column 15)"
    report = load_conversations([str(p)], "auto", on_bad_record="skip")
    assert isinstance(report, LoadReport) and isinstance(report, list)
    assert [x.source for x in report] == [f"{p}:1", f"{p}:5", f"{p}:6"]
    assert report.records == 9 and report.num_skipped == 6
    assert report.skipped == {
        "invalid_json": SkippedRecords(1, f"{p}:2", "invalid JSON: Expecting value (column 15)"),
        "not_an_object": SkippedRecords(1, f"{p}:3", "a record must be a JSON object, got list"),
        "no_assistant_turn": SkippedRecords(2, f"{p}:4", "no assistant turn (nothing to train on)"),
        "tool_use": SkippedRecords(1, f"{p}:8", "conversations[1].value has no 'name' (a non-empty string)"),
        "several_values": SkippedRecords(1, f"{p}:9", "more than one JSON value on one line"),
    }
    assert report.skip_summary() == [
        "data: skipped 6 bad record(s) of 9 (data.on_bad_record: skip):",
        f"  no_assistant_turn: 2 (first: {p}:4: no assistant turn (nothing to train on))",
        f"  invalid_json: 1 (first: {p}:2: invalid JSON: Expecting value (column 15))",
        f"  not_an_object: 1 (first: {p}:3: a record must be a JSON object, got list)",
        f"  several_values: 1 (first: {p}:9: more than one JSON value on one line)",
        f"  tool_use: 1 (first: {p}:8: conversations[1].value has no 'name' (a non-empty string))",
    ]
    # invalid UTF-8 on one JSONL line is one bad record too
    u = write(tmp_path, "u.jsonl.gz", gzip.compress(GOOD.encode() + b"\n" + b'{"text": "\xff"}\n' + GOOD.encode() + b"\n"))
    r = load_conversations([str(u)], on_bad_record="skip")
    assert len(r) == 2 and r.skipped == {"invalid_utf8": SkippedRecords(1, f"{u}:2", "invalid UTF-8 (byte 0xff at offset 103)")}
    assert load_conversations([str(write(tmp_path, "ok.jsonl", GOOD + "\n"))], on_bad_record="skip").skip_summary() == []


def test_skip_policy_still_stops_on_whole_file_problems(tmp_path):
    p = write(tmp_path, "bad.json", '[\n {"instruction": "a", "output": "b"}\n {"instruction": "c", "output": "d"}\n]')
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], on_bad_record="skip")
    assert str(e.value) == (
        f"{p}:3: invalid JSON: expected ',' or ']' between records "
        "(data.on_bad_record: skip skips single records; this problem stops the whole file)"
    )
    # inside a valid JSON array, bad *records* are skipped one by one
    q = write(tmp_path, "arr.json", '[\n {"instruction": "a", "output": "b"},\n 7,\n {"instruction": "c"}\n]')
    r = load_conversations([str(q)], on_bad_record="skip")
    assert [c.source for c in r] == [f"{q}:2"]
    assert r.skipped == {
        "not_an_object": SkippedRecords(1, f"{q}:3", "a record must be a JSON object, got int"),
        "missing_field": SkippedRecords(1, f"{q}:4", "missing field 'output'"),
    }
    with pytest.raises(ValueError, match="on_bad_record must be 'error' or 'skip', got 'warn'"):
        load_conversations([str(q)], on_bad_record="warn")


def _job(tmp_path, data_files, *overrides):
    from rayft.config_load import load_config

    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "model: {name_or_path: qwen2-tiny}\n"
        f"data: {{train_files: {json.dumps([str(f) for f in data_files])}, seq_len: 64}}\n"
        "train: {num_workers: 1, use_gpu: false}\n"
        f"checkpoint: {{storage_path: {tmp_path / 'runs'}, name: t}}\n"
    )
    return load_config(cfg_file, list(overrides))


def test_prepare_data_prints_skips_and_refuses_an_emptied_dataset(tmp_path, qwen_tokenizer):
    from rich.console import Console

    from rayft.config import ConfigError
    from rayft.data.prepare import prepare_data

    def prepare_dataset(cfg, console):
        d = prepare_data(cfg, console, qwen_tokenizer, "qwen2.5")
        return d.tokenizer, d.tokenizer_name, d.train

    p = write(tmp_path, "mix.jsonl", BAD_MIX)
    with pytest.raises(DataError) as e:
        prepare_dataset(_job(tmp_path, [p]), Console(quiet=True))
    assert str(e.value) == f"{p}:2: invalid JSON: Expecting value (column 15)"
    console = Console(record=True, width=400)
    _, _, ds = prepare_dataset(_job(tmp_path, [p], "data.on_bad_record=skip"), console)
    out = console.export_text().splitlines()
    assert out[:2] == [
        "data: skipped 6 bad record(s) of 9 (data.on_bad_record: skip):",
        f"  no_assistant_turn: 2 (first: {p}:4: no assistant turn (nothing to train on))",
    ]
    assert out[6].startswith("data: 3 records (2 conversations, 1 text documents) → 3 examples")
    assert len(ds) == 3

    bad = write(tmp_path, "allbad.jsonl", '{"messages": []}\n[2]\n')
    console = Console(record=True, width=400)
    with pytest.raises(DataError) as e:
        prepare_dataset(_job(tmp_path, [bad], "data.on_bad_record=skip"), console)
    assert str(e.value) == f"empty dataset: all 2 records were bad and skipped in ['{bad}']"
    assert console.export_text().splitlines()[0] == "data: skipped 2 bad record(s) of 2 (data.on_bad_record: skip):"
    with pytest.raises(ConfigError, match="on_bad_record"):
        _job(tmp_path, [bad], "data.on_bad_record=warn")


def test_invalid_utf8_in_a_pretty_printed_object_names_its_line(tmp_path):
    p = write(tmp_path, "one.json", b'{\n  "instruction": "a",\n  "output": "b\xff"\n}\n')
    with pytest.raises(DataError) as e:
        load_conversations([str(p)], on_bad_record="skip")
    assert str(e.value) == (
        f"{p}:3: invalid UTF-8 (byte 0xff at offset 38) (data.on_bad_record: skip skips single records; this problem stops the whole file)"
    )


def test_skip_policy_keeps_every_skipped_location_and_reports_merge(tmp_path):
    p = write(tmp_path, "mix.jsonl", BAD_MIX)
    report = load_conversations([str(p)], on_bad_record="skip")
    assert report.skipped["no_assistant_turn"].locations == [
        (f"{p}:4", "no assistant turn (nothing to train on)"),
        (f"{p}:7", "no assistant turn (nothing to train on)"),
    ]
    assert sum(len(s.locations) for s in report.skipped.values()) == report.num_skipped == 6
    # reports of files read apart, merged in input order, equal one read of both
    q = write(tmp_path, "more.jsonl", "\ufeff" + '{"messages": [{"role": "user", "content": "z"}]}\n' + GOOD + "\n")
    both = load_conversations([str(p), str(q)], on_bad_record="skip")
    merged = load_conversations([str(p)], on_bad_record="skip").merge(load_conversations([str(q)], on_bad_record="skip"))
    assert list(merged) == list(both) and merged.records == both.records == 11
    assert merged.skipped == both.skipped
    assert {k: s.locations for k, s in merged.skipped.items()} == {k: s.locations for k, s in both.skipped.items()}
    assert merged.skipped["no_assistant_turn"].locations[-1] == (f"{q}:1", "no assistant turn (nothing to train on)")
    assert merged.notes == both.notes == [f"{q}: tolerated: a UTF-8 BOM at the start"]
    assert merged.skip_summary() == both.skip_summary()

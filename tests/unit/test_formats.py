"""Reading records: every bad record is reported as file:line with its reason."""

import gzip

import pytest
from conftest import shared_path

from rayft.data.formats import DataError, expand_files, load_conversations, read_records


def write(tmp_path, name, data: bytes | str):
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'


def test_jsonl_lines_are_kept_through_blank_lines_bom_and_crlf(tmp_path):
    p = write(tmp_path, "a.jsonl", "\ufeff" + GOOD + "\r\n\r\n" + GOOD + "\r\n")
    recs = list(read_records(p))
    assert [line for line, _ in recs] == [1, 3]
    convs = load_conversations([str(p)])
    assert [c.source for c in convs] == [f"{p}:1", f"{p}:3"]
    assert convs[0].messages[1] == {"role": "assistant", "content": "hello"}


def test_json_array_records_carry_their_line(tmp_path):
    p = write(tmp_path, "a.json", '[\n  {"instruction": "a", "output": "b"},\n\n  {"instruction": "c", "input": "d", "output": "e"}\n]\n')
    convs = load_conversations([str(p)])
    assert [c.source for c in convs] == [f"{p}:2", f"{p}:4"]
    assert convs[1].messages == ({"role": "user", "content": "c\nd"}, {"role": "assistant", "content": "e"})


def test_real_shared_files_load_every_record():
    en, zh = shared_path("data", "alpaca_en_demo.json"), shared_path("data", "alpaca_zh_demo.json")
    convs = load_conversations([str(en), str(zh)], "alpaca")
    assert len(convs) == 999 + 1000
    assert convs[0].source == f"{en}:2"
    assert all(c.messages[-1]["role"] == "assistant" for c in convs)


@pytest.mark.parametrize(
    "content,reason",
    [
        (GOOD + "\n" + '{"messages": [}' + "\n", r":2: invalid JSON: Expecting value \(column 15\)"),
        (GOOD + "\n[1, 2]\n", r":2: a record must be a JSON object, got list"),
        (GOOD + " " + GOOD + "\n", r":1: more than one JSON value on one line"),
        ('{"messages": [{"role": "user", "content": "a\tb"}]}\n', r":1: invalid JSON: Invalid control character"),
        ('{"messages": [{"role": "bot", "content": "x"}]}\n', r":1: messages\[0\] has unknown role 'bot'"),
        ('{"messages": [{"content": "x"}]}\n', r":1: messages\[0\] has no 'role'"),
        ('{"messages": []}\n', r":1: empty conversation"),
        ('{"messages": [{"role": "user", "content": "x"}]}\n', r":1: no assistant turn"),
        (
            '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}\n',
            r":1: messages\[0\]\.content must be a string or a list of text parts, got int",
        ),
        ('{"instruction": "x"}\n', r":1: missing field 'output'"),
        ('{"instruction": 1, "output": "y"}\n', r":1: field 'instruction' must be a string, got int"),
        ('{"prompt": "x"}\n', r":1: unknown record format"),
        ('{"instruction": "a", "output": "b", "n": ' + "9" * 5000 + "}\n", r":1: invalid JSON value: Exceeds the limit"),
        ('{"instruction": "a", "output": "b", "x": ' + "[" * 100000 + "]" * 100000 + "}\n", r":1: invalid JSON value: nested too deeply"),
        (
            '{"instruction": "a\\ud800", "output": "b"}\n',
            r":1: instruction holds invalid Unicode \(surrogates not allowed, e\.g\. a lone \\ud800",
        ),
        ('{"instruction": "a", "output": "  \\n"}\n', r":1: assistant turn 1 is empty"),
        (
            '{"messages": [{"role": "user", "content": "q", "tool_calls": []}, {"role": "assistant", "content": "a"}]}\n',
            r":1: messages\[0\] has 'tool_calls': only assistant messages call tools, not a user message \(the calls would be lost\)",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0.5}]}\n',
            r":1: messages\[1\]\.weight is 0\.5: a turn's weight must be 0 \(not trained\) or 1 \(trained\) \(fractional weights",
        ),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}\n',
            r":1: messages\[1\] is a system turn after the first message",
        ),
        (
            '{"tools": [], "instruction": "a", "output": "b"}\n',
            r":1: 'tools' is read only in messages and sharegpt records \(alpaca has no tool turns\)",
        ),
        ('{"instruction": "a", "output": "b", "history": [["q"]]}\n', r":1: history\[0\] must be a \[user, assistant\] pair"),
    ],
)
def test_bad_records(tmp_path, content, reason):
    p = write(tmp_path, "bad.jsonl", content)
    with pytest.raises(DataError, match=str(p).replace(".", r"\.") + reason):
        load_conversations([str(p)])


def test_invalid_utf8_names_line(tmp_path):
    p = write(tmp_path, "bad.jsonl", GOOD.encode() + b"\n" + b'{"text": "\xff\xfe"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid UTF-8 \(byte 0xff"):
        list(read_records(p))


def test_broken_json_array(tmp_path):
    p = write(tmp_path, "bad.json", '[\n {"instruction": "a", "output": "b"}\n {"instruction": "c", "output": "d"}\n]')
    with pytest.raises(DataError, match=r"bad\.json:3: invalid JSON: expected ',' or '\]'"):
        load_conversations([str(p)])


def test_missing_files_and_globs(tmp_path):
    with pytest.raises(DataError, match=r"nope\.json: no such data file"):
        expand_files([str(tmp_path / "nope.json")])
    with pytest.raises(DataError, match=r"\*\.jsonl: no such data file"):
        expand_files([str(tmp_path / "*.jsonl")])
    write(tmp_path, "b.jsonl", GOOD + "\n")
    write(tmp_path, "a.json", "[" + GOOD + "]")
    assert [p.name for p in expand_files([str(tmp_path)])] == ["a.json", "b.jsonl"]
    assert len(load_conversations([str(tmp_path / "*.json*")])) == 2


def test_alpaca_history_becomes_earlier_turns(tmp_path):
    p = write(
        tmp_path, "h.jsonl", '{"instruction": "i", "input": "x", "output": "o", "system": "s", "history": [["q1", "a1"], ["q2", "a2"]]}\n'
    )
    (conv,) = load_conversations([str(p)])
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in conv.messages] == ["s", "q1", "a1", "q2", "a2", "i\nx", "o"]


def test_pretty_printed_single_object_json_file(tmp_path):
    p = write(tmp_path, "one.json", '{\n  "instruction": "a",\n  "output": "b"\n}\n')
    (conv,) = load_conversations([str(p)])
    assert conv.source == f"{p}:1" and conv.messages[-1]["content"] == "b"


def test_directories_compressed_and_duplicate_files(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    write(d, "A.JSONL", GOOD + "\n")
    write(d, "notes.txt", "ignored: not data")
    assert [p.name for p in expand_files([str(d)])] == ["A.JSONL"]
    gz = d / "z.jsonl.gz"
    gz.write_bytes(gzip.compress((GOOD + "\n").encode()))
    assert [p.name for p in expand_files([str(d)])] == ["A.JSONL", "z.jsonl.gz"]
    bz2 = write(d, "y.jsonl.bz2", b"BZh9")
    with pytest.raises(
        DataError,
        match=r"holds \['y\.jsonl\.bz2'\]: these files are not supported yet \(supported: \.json, \.jsonl, \.json\.gz, \.jsonl\.gz, \.json\.zst, \.jsonl\.zst, \.parquet; decompress or convert to JSONL\)$",
    ):
        expand_files([str(d)])
    with pytest.raises(DataError, match=r"y\.jsonl\.bz2: this kind of file is not supported yet"):
        expand_files([str(bz2)])
    bz2.unlink()
    with pytest.raises(DataError, match=r"A\.JSONL: listed more than once"):
        expand_files([str(d), str(d / "A.JSONL")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        DataError,
        match=r"empty: directory has no data file \(\.json, \.jsonl, \.json\.gz, \.jsonl\.gz, \.json\.zst, \.jsonl\.zst, \.parquet\)",
    ):
        expand_files([str(tmp_path / "empty")])
    literal = write(tmp_path, "we[ir]d.jsonl", GOOD + "\n")
    assert expand_files([str(literal)]) == [literal]

"""Bad JSON Lines records of every kind (from tests/unit/test_formats.py), for the ingest tests: each
is placed inside a later byte range of a file, and the message must be the whole-file reader's."""

GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'

BAD_LINES = [
    '{"messages": [}',
    "[1, 2]",
    GOOD + " " + GOOD,
    '{"messages": [{"role": "user", "content": "a\tb"}]}',
    '{"messages": [{"role": "bot", "content": "x"}]}',
    '{"messages": [{"content": "x"}]}',
    '{"messages": []}',
    '{"messages": [{"role": "user", "content": "x"}]}',
    '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}',
    '{"instruction": "x"}',
    '{"instruction": 1, "output": "y"}',
    '{"prompt": "x"}',
    '{"instruction": "a", "output": "b", "n": ' + "9" * 5000 + "}",
    '{"instruction": "a", "output": "b", "x": ' + "[" * 100000 + "]" * 100000 + "}",
    '{"instruction": "a\\ud800", "output": "b"}',
    '{"instruction": "a", "output": "  \\n"}',
    '{"messages": [{"role": "user", "content": "q", "tool_calls": []}, {"role": "assistant", "content": "a"}]}',
    '{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}',
    '{"tools": [], "instruction": "a", "output": "b"}',
    '{"instruction": "a", "output": "b", "history": [["q"]]}',
    '{"messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}, {"role": "assistant", "content": "a"}]}',
    '{"text": "   "}',
]
#: bytes lines: invalid UTF-8 (its message carries the byte offset in the file)
BAD_BYTES = [b'{"text": "\xff\xfe"}']


def jsonl_with(bad: bytes, before: int = 300, after: int = 40) -> bytes:
    """``before`` good lines, the bad one, ``after`` good lines (the bad record is line before+1)."""
    good = GOOD.encode() + b"\n"
    return good * before + bad + b"\n" + good * after

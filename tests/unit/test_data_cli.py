"""The data commands of the CLI: `rayft train` naming a missing data file before Ray or torch
start, and `rayft data check` (every bad record listed, JSON, exit codes)."""

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rayft.cli import app
from rayft.data.examples import REASON_KINDS, DataError
from rayft.data.formats import load_conversations


def _imported(stderr: str) -> set[str]:
    """Top-level packages in `python -X importtime` output."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \| +(\S+)$", stderr, re.M)}


HERE = "looked for it in {d}, the config file's directory and the current directory"


@pytest.mark.parametrize(
    "data,message",
    [
        ("train_files: [nope.jsonl]", f"data.train_files[0] (line 2): nope.jsonl: no such data file (a relative path: {HERE})"),
        ("train_files: [data/*.jsonl]", f"data.train_files[0] (line 2): data/*.jsonl: no such data file (a relative path: {HERE})"),
        (
            "{train_files: [ok.jsonl], validation_files: [ok.jsonl, val*.jsonl]}",
            f"data.validation_files[1] (line 1): val*.jsonl: no such data file (a relative path: {HERE})",
        ),
    ],
)
def test_train_names_a_missing_data_file_before_importing_torch_or_ray(tmp_path, data, message):
    (tmp_path / "ok.jsonl").write_text('{"text": "x"}\n')
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"data: {data}\n" if data.startswith("{") else f"data:\n  {data}\n")
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rayft.cli", "train", "job.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1] == "error: job.yaml: " + message.format(d=tmp_path)
    mods = _imported(r.stderr)
    assert "rayft" in mods and "yaml" in mods  # the import trace is read right
    assert not mods & {"torch", "ray", "transformers"}, mods & {"torch", "ray", "transformers"}


def _train_error(cfg, *args) -> str:
    """The last stderr line of `rayft train CFG ARGS...` (it stops before Ray starts)."""
    r = CliRunner().invoke(app, ["train", str(cfg), *args], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    return r.stderr.strip().splitlines()[-1]


def test_train_names_the_config_line_and_where_a_relative_path_was_looked_for(tmp_path, monkeypatch):
    jobs, run_dir = tmp_path / "jobs", tmp_path / "elsewhere"
    jobs.mkdir(), run_dir.mkdir()
    (jobs / "a.jsonl").write_text('{"text": "x"}\n')
    cfg = jobs / "job.yaml"
    cfg.write_text("model:\n  name_or_path: qwen2-tiny\ndata:\n  train_files:\n    - a.jsonl\n    - missing.jsonl\n")
    monkeypatch.chdir(run_dir)
    assert _train_error(cfg) == (
        f"error: {cfg}: data.train_files[1] (line 6): missing.jsonl: no such data file (a relative path: looked for it in "
        f"{jobs}, the config file's directory, then in {run_dir}, the current directory)"
    )
    assert _train_error(cfg, "--set", f"data.train_files=[{tmp_path}/nope.jsonl]") == (
        f"error: {cfg}: data.train_files[0] (from --set): {tmp_path}/nope.jsonl: no such data file"  # absolute: nothing searched
    )
    # a file listed twice names its key and line, validation files included
    cfg.write_text(f"data:\n  train_files: [a.jsonl]\n  validation_files:\n    - {jobs}/a.jsonl\n    - ./a.jsonl\n")
    monkeypatch.chdir(jobs)
    assert _train_error(cfg) == (
        f"error: {cfg}: data.validation_files (line 3): {jobs}/a.jsonl: listed more than once in data.validation_files "
        "(its records would be trained twice)"
    )
    cfg.write_text("data:\n  train_files: [a.jsonl, ., a.jsonl]\n")
    assert _train_error(cfg) == (
        f"error: {cfg}: data.train_files (line 2): {jobs}/a.jsonl: listed more than once in data.train_files "
        "(its records would be trained twice)"
    )


# ---------------------------------------------------------------- rayft data check

GOOD = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
# one record of every per-record reason kind (the bad records of tests/unit/test_formats*.py and test_turn_weights.py)
BAD = [
    ("invalid_json", '{"messages": [}', "invalid JSON: Expecting value (column 15)"),
    ("not_an_object", "[1, 2]", "a record must be a JSON object, got list"),
    ("several_values", GOOD + " " + GOOD, "more than one JSON value on one line"),
    ("unknown_role", '{"messages": [{"role": "bot", "content": "x"}]}', "messages[0] has unknown role 'bot'"),
    ("missing_role", '{"messages": [{"content": "x"}]}', "messages[0] has no 'role'"),
    ("empty_conversation", '{"messages": []}', "empty conversation"),
    ("no_assistant_turn", '{"messages": [{"role": "user", "content": "x"}]}', "no assistant turn (nothing to train on)"),
    (
        "wrong_type",
        '{"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}',
        "messages[0].content must be a string or a list of text parts, got int",
    ),
    ("missing_field", '{"instruction": "x"}', "missing field 'output'"),
    ("unknown_format", '{"prompt": "x"}', "unknown record format (keys: ['prompt'])"),
    ("invalid_unicode", '{"instruction": "a\\ud800", "output": "b"}', "instruction holds invalid Unicode"),
    ("empty_assistant_turn", '{"instruction": "a", "output": "  \\n"}', "assistant turn 1 is empty"),
    (
        "unsupported_key",
        '{"messages": [{"role": "user", "content": "q", "tool_calls": []}, {"role": "assistant", "content": "a"}]}',
        "messages[0] has 'tool_calls': only assistant messages call tools",
    ),
    (
        "misplaced_system",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}',
        "messages[1] is a system turn after the first message",
    ),
    ("tool_use", '{"tools": [], "instruction": "a", "output": "b"}', "'tools' is read only in messages and sharegpt records"),
    (
        "unsupported_content",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]}]}',
        "messages[1].content[0] is a 'image_url' part: only text parts are supported",
    ),
    (
        "bad_weight",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0.5}]}',
        "messages[1].weight is 0.5: a turn's weight must be 0 (not trained) or 1 (trained) (fractional weights are not supported)",
    ),
    (
        "no_trained_turn",
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "loss_weight": 0}]}',
        "every assistant turn has weight 0 or training false (nothing to train on)",
    ),
    ("empty_text", '{"text": ""}', "field 'text' is empty (nothing to train on)"),
    ("invalid_utf8", b'{"text": "\xff"}', "invalid UTF-8 (byte 0xff"),
]


def every_bad_kind(tmp_path):
    """A JSONL file: a good record, one bad record of every kind, a good record. Returns the path
    and ``[(line, kind, reason start)]``."""
    lines = [GOOD.encode()] + [b if isinstance(b, bytes) else b.encode() for _, b, _ in BAD] + [GOOD.encode()]
    p = tmp_path / "every_bad.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    return p, [(i + 2, kind, reason) for i, (kind, _, reason) in enumerate(BAD)]


def run(*args):
    return CliRunner().invoke(app, ["data", "check", *map(str, args)])


def test_the_file_holds_every_per_record_reason_kind(tmp_path):
    _, expected = every_bad_kind(tmp_path)
    assert {k for _, k, _ in expected} == set(REASON_KINDS) - {"file"}


def test_data_check_lists_every_bad_line_with_its_reason(tmp_path):
    p, expected = every_bad_kind(tmp_path)
    r = run(p)
    assert r.exit_code == 1, r.output
    out = r.stdout.splitlines()
    assert out[0] == f"{p}: 22 records: 2 accepted, 20 bad"
    for line, kind, reason in expected:
        hits = [o for o in out if o.startswith(f"    {p}:{line}: ")]
        assert len(hits) == 1 and hits[0].startswith(f"    {p}:{line}: {reason}"), (line, kind, hits)
        assert f"  {kind}: 1" in out
    assert out[-1] == "checked 1 file(s): 22 records, 2 accepted, 20 bad"


def test_data_check_json_has_every_location_and_matches_the_loader(tmp_path):
    p, expected = every_bad_kind(tmp_path)
    r = run(p, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert (doc["ok"], doc["records"], doc["accepted"], doc["bad"], doc["stopped"]) == (False, 22, 2, 20, 0)
    (f,) = doc["files"]
    got = sorted((int(loc["where"].rsplit(":", 1)[1]), kind, loc["reason"]) for kind, s in f["skipped"].items() for loc in s["locations"])
    assert [(line, kind) for line, kind, _ in got] == [(line, kind) for line, kind, _ in expected]
    assert all(reason.startswith(want) for (_, _, reason), (_, _, want) in zip(got, expected))
    # exactly what rayft train's loader skips, location for location
    report = load_conversations([str(p)], on_bad_record="skip")
    assert {k: [(x["where"], x["reason"]) for x in s["locations"]] for k, s in f["skipped"].items()} == {
        k: s.locations for k, s in report.skipped.items()
    }


def test_data_check_error_policy_reports_the_first_bad_record_as_training_does(tmp_path):
    p, _ = every_bad_kind(tmp_path)
    with pytest.raises(DataError) as e:
        load_conversations([str(p)])
    r = run(p, "--on-bad-record", "error")
    assert r.exit_code == 1
    assert r.stdout.splitlines() == [
        f"{p}: stopped (--on-bad-record skip lists every bad record):",
        f"  {e.value}",
        "checked 1 file(s): 1 stopped",
    ]
    assert str(e.value) == f"{p}:2: invalid JSON: Expecting value (column 15)"
    doc = json.loads(run(p, "--on-bad-record", "error", "--json").stdout)
    assert doc["files"][0]["error"] == {"where": f"{p}:2", "kind": "invalid_json", "message": str(e.value)}


def test_data_check_exit_codes_notes_and_many_bad_records(tmp_path):
    good = tmp_path / "d" / "good.jsonl"
    good.parent.mkdir()
    good.write_text(
        "\ufeff"
        + GOOD
        + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "q", "name": "ann"}, {"role": "assistant", "content": "I am {{name}}."}]})
        + "\n"
    )
    r = run(tmp_path / "d")  # a directory, read as rayft train reads it
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        f"{good}: 2 records: 2 accepted, 0 bad",
        f"  note: {good}: tolerated: a UTF-8 BOM at the start",
        f"  note: {good}: ignored message key(s) ['name'] (first at {good}:2)",
        f"  placeholder {{{{name}}}} left in 1 record(s) (first: {good}:2; data.placeholders fills it)",
        "checked 1 file(s): 2 records, 2 accepted, 0 bad",
    ]
    many = tmp_path / "many.jsonl"
    many.write_text(GOOD + "\n" + '{"messages": []}\n' * 25)
    r = run(many, good)
    assert r.exit_code == 1
    out = r.stdout.splitlines()
    assert out[:2] == [f"{many}: 26 records: 1 accepted, 25 bad", "  empty_conversation: 25"]
    assert out[2:22] == [f"    {many}:{n}: empty conversation" for n in range(2, 22)]
    assert out[22] == "    ... and 5 more (--json lists every one)"
    assert out[-1] == "checked 2 file(s): 28 records, 3 accepted, 25 bad"
    doc = json.loads(run(many, "--json").stdout)
    assert len(doc["files"][0]["skipped"]["empty_conversation"]["locations"]) == 25
    # a problem of the whole file stops it under either policy
    broken = tmp_path / "broken.json"
    broken.write_text('[\n {"instruction": "a", "output": "b"}\n {"instruction": "c", "output": "d"}\n]')
    r = run(broken, good)
    assert r.exit_code == 1 and r.stdout.splitlines()[:2] == [
        f"{broken}: stopped:",
        f"  {broken}:3: invalid JSON: expected ',' or ']' between records "
        "(data.on_bad_record: skip skips single records; this problem stops the whole file)",
    ]
    assert r.stdout.splitlines()[-1] == "checked 2 file(s): 2 records, 2 accepted, 0 bad; 1 stopped"
    # usage errors: exit 2, the missing file named
    r = run(good, tmp_path / "nope.jsonl")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == f"error: {tmp_path / 'nope.jsonl'}: no such data file"
    r = run(good, "--columns", "speaker=who")
    assert r.exit_code == 2 and r.stderr.startswith("error: data.columns.speaker: unknown key")
    r = run(good, "--columns", "role")
    assert r.exit_code == 2 and "expected KEY=NAME" in r.stderr
    assert run(good, "--format", "csv").exit_code == 2


def test_data_check_columns_and_format(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"conversation": [{"speaker": "USER", "text": "q"}, {"speaker": "BOT", "text": "a"}]}) + "\n")
    assert run(p).exit_code == 1
    r = run(p, "--columns", "messages=conversation", "--columns", "role=speaker", "--columns", "content=text", "--columns", "user=USER",
            "--columns", "assistant=BOT", "--format", "messages")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == f"{p}: 1 records: 1 accepted, 0 bad"


def test_data_check_fills_placeholders_as_the_config_would(tmp_path):
    p = tmp_path / "id.json"
    records = [
        {"instruction": "Who are you?", "output": "I am {{name}} by <AUTHOR>. Press <CR> to go on."},
        {"instruction": "Name?", "output": "{{name}}, in `{{name}}` code"},
        {"instruction": "Hi", "output": "Hello."},
    ]
    p.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")  # records on lines 2, 3 and 4
    r = run(p)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1:3] == [
        f"  placeholder {{{{name}}}} left in 2 record(s) (first: {p}:2, {p}:3; data.placeholders fills it)",
        f"  placeholder <AUTHOR> left in 1 record(s) (first: {p}:2; data.placeholders fills it)",
    ]  # <CR> is a key, not a placeholder
    r = run(p, "--placeholders", "name=Rayft", "--placeholders", "AUTHOR=the rayft team")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        f"{p}: 3 records: 3 accepted, 0 bad",
        "  filled template placeholders in 2 record(s) (--placeholders)",
        "checked 1 file(s): 3 records, 3 accepted, 0 bad",
    ]
    doc = json.loads(run(p, "--placeholders", "name=Rayft", "--json").stdout)
    assert doc["placeholders"] == {"name": "Rayft"} and doc["files"][0]["filled"] == 2
    assert doc["files"][0]["placeholders"] == {"<AUTHOR>": {"records": 1, "first": [f"{p}:2"]}}
    # exactly what rayft train's loader fills
    assert load_conversations([str(p)], placeholders={"name": "Rayft"}).filled == 2
    # checked again once filled, as training checks it: an emptied reply is a bad record
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"instruction": "q", "output": "{{name}}"}) + "\n")
    assert run(q, "--placeholders", "name=R").exit_code == 0
    r = run(q, "--placeholders", "name=")
    assert r.exit_code == 1
    assert r.stdout.splitlines()[:3] == [
        f"{q}: 1 records: 0 accepted, 1 bad",
        "  empty_assistant_turn: 1",
        f"    {q}:1: assistant turn 1 is empty once data.placeholders filled it (name) (training on it teaches empty replies)",
    ]
    r = run(p, "--placeholders", "my-name=x")
    assert r.exit_code == 2 and r.stderr.startswith("error: data.placeholders.my-name: a placeholder's name is letters")
    r = run(p, "--placeholders", "name")
    assert r.exit_code == 2 and "expected KEY=VALUE, e.g. --placeholders name=Rayft" in r.stderr


def test_data_check_fails_when_there_is_no_record_at_all(tmp_path):
    # rayft train stops on such input ("empty dataset: no record"): data check must not pass it
    empty, blank = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"
    empty.write_bytes(b"")
    blank.write_text("\n  \n")
    for files in ([empty], [empty, blank]):
        r = run(*files)
        assert r.exit_code == 1, r.output
        assert r.stdout.splitlines() == [
            *(f"{f}: 0 records: 0 accepted, 0 bad" for f in files),  # a 0-byte file has no "tolerated: 1 blank line" note
            f"checked {len(files)} file(s): 0 records, 0 accepted, 0 bad",
            "no record in any file: nothing to train on (rayft train stops with 'empty dataset: no record')",
        ]
    doc = json.loads(run(empty, "--json").stdout)
    assert (doc["ok"], doc["empty"], doc["records"], doc["files"][0]["notes"]) == (False, True, 0, [])
    assert load_conversations([str(empty)]).notes == [] and load_conversations([str(blank)]).notes == []
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD + "\n\n" + GOOD + "\n")
    r = run(empty, good)
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "checked 2 file(s): 2 records, 2 accepted, 0 bad"
    assert f"  note: {good}: tolerated: 1 blank line" in r.stdout.splitlines()  # blank lines between records are still noted
    assert json.loads(run(good, "--json").stdout)["empty"] is False

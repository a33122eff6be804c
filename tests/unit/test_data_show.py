"""`rayft data show`: the loss mask made visible (rayft.data.show), in the terminal and as HTML."""

import json
import re
from html import unescape

import numpy as np
from typer.testing import CliRunner

from rayft.cli import app
from rayft.data import show as view

RECORD = {
    "messages": [
        {"role": "user", "content": "What is 2 times 3?"},
        {"role": "assistant", "content": "2 times 3 is 6."},
        {"role": "user", "content": "And <b>4 & 5</b>?"},
        {"role": "assistant", "content": "4 plus 5 is 9 <ok>."},
    ]
}
REPLIES = ["2 times 3 is 6.", "4 plus 5 is 9 <ok>."]
OTHER = {"messages": [{"role": "user", "content": "Hi there, how long is this?"}, {"role": "assistant", "content": "Short."}]}


def write_config(tmp_path, records=(RECORD, OTHER, OTHER, RECORD, OTHER)):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "model:\n  name_or_path: qwen2-tiny\n"
        f"data:\n  train_files: [{data}]\n  format: messages\n  seq_len: 256\n  packing: true\n  shuffle: false\n"
        f"  cache_dir: {tmp_path / 'cache'}\n"
        "train:\n  num_workers: 1\n  use_gpu: false\n  micro_batch_size: 1\n  grad_accum_steps: 1\n  max_steps: 4\n"
    )
    return cfg


def test_spans_are_the_assistant_replies_and_the_context_in_order(qwen_tokenizer, tmp_path):
    from rayft.commands.common import console
    from rayft.config_load import load_config
    from rayft.data.prepare import prepare_data

    cfg = load_config(write_config(tmp_path), [])
    data = prepare_data(cfg, console, qwen_tokenizer, "qwen2.5")
    tokens, trainable = data.train.example(0)
    parts = view.spans(data.tokenizer, tokens, trainable)
    trained = [s for s, t in parts if t]
    assert trained == [r + "<|im_end|>" for r in REPLIES]
    # the spans alternate, and together are the whole example's text, special tokens as written
    assert all(a[1] != b[1] for a, b in zip(parts, parts[1:]))
    whole = "".join(s for s, _ in parts)
    assert whole == qwen_tokenizer.decode([int(t) for t in tokens], skip_special_tokens=False)
    context = [s for s, t in parts if not t]
    assert context[0].startswith("<|im_start|>") and context[0].endswith("<|im_start|>assistant\n")
    assert "What is 2 times 3?" in context[0] and "And <b>4 & 5</b>?" in context[1]
    assert context[1] == "\n<|im_start|>user\nAnd <b>4 & 5</b>?<|im_end|>\n<|im_start|>assistant\n"
    assert all(r not in "".join(context) for r in REPLIES)
    # rich text: trained in the trained style, context dim, same characters
    text = view.example_text(parts)
    assert text.plain == whole
    styled = {str(s.style) for s in text.spans}
    assert styled == {view.TRAINED_STYLE, view.CONTEXT_STYLE}
    # the html page: <mark> holds exactly the trained spans, every special token escaped
    page = view.html_page("t", [(0, parts)], view.length_histogram(data.train.lengths()), 0.5)
    assert [unescape(m) for m in re.findall(r"<mark>(.*?)</mark>", page, re.S)][1:] == trained  # [0]: the legend
    assert "<|im_start|>" not in page and "&lt;|im_start|&gt;" in page
    assert "<b>" not in page and "&lt;b&gt;4 &amp; 5&lt;/b&gt;" in page
    assert "<script" not in page and "http" not in page


def test_histogram_counts_sum_to_the_examples():
    lengths = np.array([3, 3, 4, 10, 17, 17, 100, 250, 251])
    hist = view.length_histogram(lengths, bins=5)
    assert sum(b.count for b in hist) == len(lengths)
    assert hist[0].lo == 3 and hist[-1].hi == 251 and len(hist) <= 5
    assert all(a.hi + 1 == b.lo for a, b in zip(hist, hist[1:]))
    for b in hist:
        assert b.count == int(((lengths >= b.lo) & (lengths <= b.hi)).sum())
    assert [(b.lo, b.hi, b.count) for b in view.length_histogram(np.array([7, 7]))] == [(7, 7, 2)]
    assert view.length_histogram(np.array([], dtype=np.int64)) == []


def test_cli_end_to_end_with_html(qwen_tokenizer, tmp_path):
    cfg = write_config(tmp_path)
    page = tmp_path / "show.html"
    r = CliRunner().invoke(app, ["data", "show", str(cfg), "--n", "2", "--html", str(page)])
    assert r.exit_code == 0, r.output
    assert "example 0:" in r.output and "example 1:" in r.output and "example 2:" not in r.output
    assert "2 times 3 is 6." in r.output and "<|im_start|>" in r.output
    assert "5 training examples" in r.output
    m = re.search(r"packing efficiency, first epoch: ([\d.]+)%", r.output)
    assert m and 0 < float(m.group(1)) <= 100
    counts = re.findall(r"<tr><td>\d+–\d+</td><td>(\d+)</td></tr>", page.read_text())
    assert sum(map(int, counts)) == 5
    marks = [unescape(x) for x in re.findall(r"<mark>(.*?)</mark>", page.read_text(), re.S)][1:]
    assert marks == [r + "<|im_end|>" for r in REPLIES] + ["Short.<|im_end|>"]


def test_cli_missing_config_exits_2(tmp_path):
    r = CliRunner().invoke(app, ["data", "show", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2
    assert "nope.yaml: config file not found" in r.output

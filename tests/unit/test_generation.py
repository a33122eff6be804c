"""Generation from an export (issue 21): the export stops at the chat template's end of turn
(item 1); `rayft generate` and `rayft chat` (item 2)."""

import copy
import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import REPLY, bigram_export, random_export

from rayft.infer.generate import encode_prompts, generate_all, read_prompts
from rayft.infer.model_dir import TOKENIZER_FILES, InferError, exit_on_signals, load_model, model_dir
from rayft.train.generation import end_of_turn_ids, export_generation_config


def test_end_of_turn_read_from_the_template(qwen_tokenizer):
    # ChatML's <|im_end|>, found by rendering a reply, not from a table
    assert end_of_turn_ids(qwen_tokenizer) == [qwen_tokenizer.convert_tokens_to_ids("<|im_end|>")] == [151645]
    other = copy.deepcopy(qwen_tokenizer)  # another template: the turn ends with <|endoftext|> itself
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|endoftext|>\n{% endfor %}"
    assert end_of_turn_ids(other) == [151643]
    other.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    assert end_of_turn_ids(other) == []  # no special token after the reply


def test_base_sampling_defaults_kept_and_none_added(qwen_tokenizer):
    from transformers import GenerationConfig, PretrainedConfig

    conf = PretrainedConfig(eos_token_id=151643, bos_token_id=151643)
    plain = export_generation_config(qwen_tokenizer, conf)
    assert plain.eos_token_id == [151645, 151643] and not plain.do_sample and plain.temperature is None
    base = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.8, eos_token_id=151643)
    got = export_generation_config(qwen_tokenizer, conf, base)
    assert (got.do_sample, got.temperature, got.top_p, got.eos_token_id) == (True, 0.7, 0.8, [151645, 151643])


def test_base_with_sampling_values_but_do_sample_false_still_saves(qwen_tokenizer, tmp_path):
    from transformers import GenerationConfig, PretrainedConfig

    conf = PretrainedConfig(eos_token_id=151643)
    (tmp_path / "base").mkdir()  # the base model's file as shipped: save_pretrained would refuse it
    (tmp_path / "base" / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.7, "top_p": 0.8}')
    base = GenerationConfig.from_pretrained(tmp_path / "base")
    said = []
    got = export_generation_config(qwen_tokenizer, conf, base, say=said.append)
    assert (got.do_sample, got.temperature, got.top_p, got.eos_token_id) == (False, None, None, [151645, 151643])
    assert len(said) == 1 and "temperature, top_p dropped" in said[0]
    got.save_pretrained(tmp_path / "out")  # raised ValueError before
    saved = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert saved["eos_token_id"] == [151645, 151643] and "temperature" not in saved and "top_p" not in saved
    bad = GenerationConfig(num_beams=1, length_penalty=2.0)  # invalid for another reason: a plain config instead
    said.clear()
    plain = export_generation_config(qwen_tokenizer, conf, bad, say=said.append)
    plain.validate(strict=True)
    assert plain.eos_token_id == [151645, 151643] and plain.pad_token_id == qwen_tokenizer.pad_token_id
    assert len(said) == 1 and "length_penalty" in said[0] and "a plain one" in said[0]


def test_template_that_raises_keeps_the_base_eos_only(qwen_tokenizer, monkeypatch):
    from transformers import PretrainedConfig

    # the shared tokenizer, its template swapped for this test only (a deep copy costs seconds)
    monkeypatch.setattr(qwen_tokenizer, "chat_template", "{{ raise_exception('Conversation roles must alternate system/user/assistant') }}")
    said = []
    got = export_generation_config(qwen_tokenizer, PretrainedConfig(eos_token_id=151643), say=said.append)
    assert got.eos_token_id == 151643  # the base EOS only, no end-of-turn token
    assert len(said) == 1 and said[0].startswith("warning: the chat template cannot render") and "must alternate" in said[0]


@pytest.fixture(scope="module")
def bigram_dir(tmp_path_factory, qwen_tokenizer):
    return bigram_export(qwen_tokenizer, tmp_path_factory.mktemp("export") / "hf")


def test_export_stops_at_end_of_turn(bigram_dir, qwen_tokenizer):
    from transformers import AutoModelForCausalLM

    gen = json.loads((bigram_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    assert json.loads((bigram_dir / "config.json").read_text())["use_cache"] is True
    model = AutoModelForCausalLM.from_pretrained(bigram_dir)
    tok = qwen_tokenizer  # the tokenizer the export holds (loading it back is test_generate_...'s part)
    batch = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    n = batch["input_ids"].shape[1]
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12)[0, n:].tolist()
        on = model.generate(**batch, max_new_tokens=12, eos_token_id=151643)[0, n:].tolist()  # the base EOS alone
    reply = tok.encode(REPLY, add_special_tokens=False)
    assert out == [*reply, 151645]  # the reply, its end of turn, nothing after
    assert len(on) == 12 and on[: len(reply) + 1] == [*reply, 151645]  # what the export did before: on past the turn


PROMPTS = [
    {"messages": [{"role": "user", "content": "Write one short sentence about the sea."}]},
    {"prompt": "The capital of France is"},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]},
]


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory, qwen_tokenizer):
    return random_export(qwen_tokenizer, tmp_path_factory.mktemp("random") / "hf")


def test_bad_prompt_line_named_before_loading(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n\n{"messages": [{"role": "user"}]}\n')
    with pytest.raises(InferError, match=rf"^{f}:3: messages\[0\] needs a string role and a string content"):
        read_prompts(f)
    f.write_text('{"prompt": "ok"}\n{"text": "x"}\n')
    with pytest.raises(InferError, match=rf"^{f}:2: a prompt line is"):
        read_prompts(f)


def test_generate_greedy_batched_equals_one_by_one(tmp_path, random_dir, qwen_tokenizer):
    from typer.testing import CliRunner

    from rayft.cli import app

    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    args = ["generate", str(random_dir), "--prompts", str(f), "--out", str(tmp_path / "out.jsonl"), "--max-new-tokens", "6"]
    res = CliRunner().invoke(app, [*args, "--batch-size", "3", "--temperature", "0"])
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["line"] for r in got] == [1, 2, 3] and got[1]["prompt"] == "The capital of France is"
    assert got[0]["messages"] == PROMPTS[0]["messages"] and all(r["new_tokens"] == 6 and r["finish"] == "length" for r in got)
    from transformers import AutoModelForCausalLM

    model, tok = AutoModelForCausalLM.from_pretrained(random_dir).eval(), qwen_tokenizer  # the export's tokenizer, already loaded
    prompts = read_prompts(f)
    # the same answers again, in batches of 2 (other padding: the second batch has none)
    again = generate_all(model, tok, prompts, max_new_tokens=6, temperature=0, batch_size=2)
    assert [r["completion"] for r in again] == [r["completion"] for r in got]
    # the reference: transformers' greedy generate on each prompt alone (no padding at all)
    for p, rec in zip(prompts, got):
        if p.messages is not None:
            ids = tok.apply_chat_template(p.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tok(p.text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)[0, ids.shape[1] :]
        assert rec["completion"] == tok.decode(ref, skip_special_tokens=True)


def test_chat_two_turns_and_reset(bigram_dir):
    pexpect = pytest.importorskip("pexpect")
    hf = bigram_dir
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p.endswith("src")) or os.environ.get("PYTHONPATH", "")}
    child = pexpect.spawn(sys.executable, ["-m", "rayft.cli", "chat", str(hf), "--temperature", "0"], env=env, encoding="utf-8", timeout=60)
    try:
        child.expect("you> ", timeout=240)  # the first model load, slow under CI load; the later expects get 60 s
        contexts = []
        for text in ("Hi", "And again?"):
            child.sendline(text)
            child.expect(rf"model> {REPLY}\r?\n\[(\d+) tokens, (\d+) in context")
            assert child.match.group(1) == "3"  # the reply's two tokens and the end of turn: it stopped there
            contexts.append(int(child.match.group(2)))
            child.expect("you> ")
        assert contexts[1] > contexts[0]  # the second turn saw the first
        child.sendline("/reset")
        child.expect(r"\(new conversation\)")
        child.expect("you> ")
        child.sendline("Hi")
        child.expect(rf"model> {REPLY}\r?\n\[3 tokens, (\d+) in context")
        assert int(child.match.group(1)) == contexts[0]  # a fresh conversation again
        child.expect("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_export_without_tokenizer_files_refused_before_the_model_loads(bigram_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(bigram_dir, bare, ignore=lambda d, names: [n for n in names if n.startswith("tokenizer") or n.endswith(".jinja")])
    assert not any((bare / f).exists() for f in TOKENIZER_FILES) and (bare / "model.safetensors").is_file()
    with pytest.raises(
        InferError, match=rf"^{bare}: no tokenizer in the directory \(none of tokenizer.json, tokenizer_config.json, tokenizer.model\)"
    ):
        load_model(bare, "cpu")


def test_run_directory_decided_by_checkpoint_dirs_and_nothing_said_without_a_checkpoint(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "checkpoint_manager_snapshot.json").write_text("{}")  # a file, not a checkpoint
    with pytest.raises(InferError, match="neither a Hugging Face model directory"), model_dir(snap):
        pass
    run = tmp_path / "run"
    (run / "checkpoint_0000003").mkdir(parents=True)  # a save interrupted before its state file
    said = []
    with pytest.raises(InferError, match=rf"^{run}: no complete checkpoint in this run"), model_dir(run, say=said.append):
        pass
    assert said == []  # no "exporting ..." line before the error


def test_sigterm_becomes_system_exit_and_handlers_come_back():
    import signal

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(SystemExit) as e, exit_on_signals():
            os.kill(os.getpid(), sig)
        assert e.value.code == 128 + sig
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_sigterm_during_a_step_export_removes_the_temporary_export(tmp_path, monkeypatch):
    import signal

    import rayft.train.checkpoint as ckpt
    import rayft.train.checkpoint_files as files

    run = tmp_path / "run"
    (run / "checkpoint_0000004").mkdir(parents=True)
    (run / "rayft.yaml").write_text("")
    # the checkpoint's discovery and export stand in: what is tested is model_dir's cleanup
    monkeypatch.setattr(files, "find_checkpoints", lambda d: [(4, Path(d) / "checkpoint_0000004")])

    def fake_export(run_dir, step=None, out=None, say=None):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"\0" * 1024)
        return out

    monkeypatch.setattr(ckpt, "export_run", fake_export)
    said, seen, before = [], [], signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        with model_dir(run, step=4, say=said.append) as hf:
            seen.append(hf)
            assert (hf / "model.safetensors").is_file()
            os.kill(os.getpid(), signal.SIGTERM)
    assert e.value.code == 128 + signal.SIGTERM
    assert said and said[0].startswith(f"exporting the checkpoint of step 4 of {run} to ")
    assert not seen[0].parent.exists()  # the temporary directory is gone
    assert signal.getsignal(signal.SIGTERM) == before  # the old handler is back


def test_prompts_file_not_utf8_or_empty_prompt_named_by_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    data = '{"prompt": "ok"}\n{"prompt": "caf'.encode() + b"\xe9" + b'"}\n'
    f.write_bytes(data)
    with pytest.raises(InferError, match=rf"^{f}:2: not UTF-8 \(byte 32\)$"):
        read_prompts(f)
    assert data.index(b"\xe9") == 32
    for empty in ('{"prompt": ""}', '{"prompt": " \\n\\t "}'):
        f.write_text('{"prompt": "ok"}\n' + empty + "\n")
        with pytest.raises(InferError, match=rf"^{f}:2: the prompt is empty$"):
            read_prompts(f)


@pytest.fixture
def unloadable_weights_dir(bigram_dir, tmp_path):
    """The bigram export with garbage weights: a command that loads them fails with another error."""
    import shutil

    d = tmp_path / "garbage"
    shutil.copytree(bigram_dir, d)
    (d / "model.safetensors").write_bytes(b"not safetensors")
    return d


def test_chat_template_error_and_bad_out_named_before_the_model_loads(tmp_path, unloadable_weights_dir):
    from typer.testing import CliRunner

    from rayft.cli import app

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    base = ["generate", str(unloadable_weights_dir), "--prompts", str(f)]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "missing" / "out.jsonl")], terminal_width=400)
    assert res.exit_code == 1 and f"error: {tmp_path / 'missing' / 'out.jsonl'}: no such directory {tmp_path / 'missing'}" in res.output
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path)], terminal_width=400)
    assert res.exit_code == 1 and f"error: {tmp_path}: is a directory (--out is a file)" in res.output
    (unloadable_weights_dir / "chat_template.jinja").write_text("{{ raise_exception('System role not supported') }}")
    res = CliRunner().invoke(app, base, terminal_width=400)
    assert res.exit_code == 1, res.output
    assert f"error: {f}:2: the chat template cannot render these messages (System role not supported)" in res.output


def test_batch_of_two_stops_at_the_end_of_turn_whatever_the_padding(bigram_dir, qwen_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    f = tmp_path / "p.jsonl"
    turns = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "A much longer question, with many more tokens in it?"}]]
    f.write_text("".join(json.dumps({"messages": m}) + "\n" for m in turns))
    prompts = read_prompts(f)
    lengths = [len(ids) for ids in encode_prompts(qwen_tokenizer, prompts)]
    assert lengths[0] + 5 < lengths[1]  # the first row is left-padded
    model = AutoModelForCausalLM.from_pretrained(bigram_dir).eval()
    got = generate_all(model, qwen_tokenizer, prompts, max_new_tokens=12, temperature=0, batch_size=2)
    assert [(r["line"], r["completion"], r["new_tokens"], r["finish"]) for r in got] == [(1, REPLY, 3, "stop"), (2, REPLY, 3, "stop")]

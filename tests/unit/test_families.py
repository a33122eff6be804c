"""Model families (issue 22), on the CPU: each family's tiny preset trains through the worker-level
step (one gloo rank) with loss falling and exports to a Hugging Face directory with equal logits;
each chat template + loss mask equals an independent rendering (the template string rendered by
jinja2 here, masked by the family's literal turn markers) on real alpaca records in the alpaca,
messages and ShareGPT formats; the offline tokenizers give the ids of the packages' own tokenizers;
the liger and attention routing tables. Gemma's and Phi's tokenizers ship in no package: their
templates run on stand-ins of the same vocabulary format (SentencePiece BPE with byte fallback,
from mistral-common) with the families' turn tokens added."""

import json
from types import SimpleNamespace

import jinja2
import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import shared_path
from gloo_ranks import run_ranks

from rayft.data.examples import DataError
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_conversation, tokenize_dataset
from rayft.data.tokenizer import build_standin_tokenizer, load_tokenizer

# The published architecture's tie flag, and the stand-in or offline tokenizer per tiny preset.
TINY = {
    "qwen3-tiny": "qwen3",
    "llama3-tiny": "llama3",
    "mistral-tiny": "mistral-v3",
    "gemma2-tiny": "gemma-standin",
    "phi3-tiny": "phi-standin",
}
# Literal assistant-turn markers of each family's published format: (header, end of turn).
MARKERS = {
    "qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
    "qwen2.5": ("<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
    "mistral-v3": ("[/INST]", "</s>"),
    "gemma-standin": ("<start_of_turn>model\n", "<end_of_turn>"),
    "phi-standin": ("<|assistant|>\n", "<|end|>"),
}


def _mistral_file(name):
    import importlib.util

    return __import__("pathlib").Path(list(importlib.util.find_spec("mistral_common").submodule_search_locations)[0]) / "data" / name


_TOKENIZERS = {}


def tokenizer(name):
    """The offline tokenizers by name, and the Gemma and Phi stand-ins (build_standin_tokenizer)."""
    if name not in _TOKENIZERS:
        standin = {"gemma-standin": "gemma2", "phi-standin": "phi3"}
        _TOKENIZERS[name] = build_standin_tokenizer(standin[name]) if name in standin else load_tokenizer(name)
    return _TOKENIZERS[name]


def alpaca(fname, i):
    return json.loads(shared_path("data", fname).read_text())[i]


def records():
    """(format, record) pairs from ../shared/data: alpaca as is; a messages and a ShareGPT record
    (two turns each, EN and ZH) built from alpaca records."""
    en, zh, en2 = alpaca("alpaca_en_demo.json", 0), alpaca("alpaca_zh_demo.json", 3), alpaca("alpaca_en_demo.json", 7)

    def user(r):
        return r["instruction"] + ("\n" + r["input"] if r.get("input") else "")

    messages = {"messages": [{"role": "user", "content": user(en)}, {"role": "assistant", "content": en["output"]},
                             {"role": "user", "content": user(zh)}, {"role": "assistant", "content": zh["output"]}]}  # fmt: skip
    sharegpt = {"conversations": [{"from": "human", "value": user(en2)}, {"from": "gpt", "value": en2["output"]},
                                  {"from": "human", "value": user(en)}, {"from": "gpt", "value": en["output"]}]}  # fmt: skip
    return [("alpaca", en), ("alpaca", zh), ("messages", messages), ("sharegpt", sharegpt)]


def jinja_render(tok, messages):
    """The tokenizer's template string rendered by jinja2 itself (not by transformers)."""

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    msgs = [{"tool_calls": None, **m} for m in messages]
    return env.from_string(tok.chat_template).render(messages=msgs, tools=None, add_generation_prompt=False,
                                                     bos_token=tok.bos_token, eos_token=tok.eos_token)  # fmt: skip


def marker_mask(tok, name, text):
    """Ids and mask by the family's literal markers: every token overlapping [end of an assistant
    header, end of the next end-of-turn marker] is trained."""
    head, eot = MARKERS[name]
    spans, at = [], 0
    while (h := text.find(head, at)) >= 0:
        e = text.index(eot, h + len(head)) + len(eot)
        spans.append((h + len(head), e))
        at = e
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    off = np.asarray(enc["offset_mapping"]).reshape(-1, 2)
    mask = np.zeros(len(off), bool)
    for s, e in spans:
        mask |= (off[:, 1] > s) & (off[:, 0] < e)
    return enc["input_ids"], mask.tolist(), spans


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral-v3", "gemma-standin", "phi-standin"])
def test_template_and_mask_equal_an_independent_rendering_on_real_records(name):
    tok = tokenizer(name)
    for fmt, rec in records():
        conv = to_conversation(rec, f"{fmt}:1", fmt)
        ex = tokenize_conversation(tok, conv)
        text = jinja_render(tok, list(conv.messages))
        ids, mask, spans = marker_mask(tok, name, text)
        assert ex.input_ids.tolist() == ids, (name, fmt)
        assert ex.trainable.tolist() == mask, (name, fmt)
        assert len(spans) == sum(m["role"] == "assistant" for m in conv.messages) >= 1
        # the trained tokens are the replies and their end-of-turn tokens, nothing of the prompts
        trained = tok.decode(ex.input_ids[ex.trainable])
        last = conv.messages[-1]["content"]
        assert last.strip()[-20:] in trained and MARKERS[name][1] in trained
        assert conv.messages[0]["content"].strip()[:20] not in trained


def test_llama3_mistral_gemma_phi_render_the_published_text():
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo "}]
    assert tokenizer("llama3").apply_chat_template(conv, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
    )
    assert tokenizer("gemma-standin").apply_chat_template(conv, tokenize=False) == (
        "<s><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n"
    )
    assert (
        tokenizer("phi-standin").apply_chat_template(conv, tokenize=False)
        == "<|user|>\nhi<|end|>\n<|assistant|>\nyo <|end|>\n<|endoftext|>"
    )
    # Mistral: the ids of mistral-common's own v3 encoder, system prompt in the last user turn
    from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    mt = MistralTokenizer.from_file(str(_mistral_file("mistral_instruct_tokenizer_240323.model.v3")))
    chat = [("system", "Be brief."), ("user", "Hi there"), ("assistant", "Yo man\n\nok"), ("user", "2+2 in 中文?")]
    want = mt.encode_chat_completion(
        ChatCompletionRequest(
            messages=[{"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}[r](content=c) for r, c in chat]
        )
    ).tokens
    got = tokenizer("mistral-v3").apply_chat_template([{"role": r, "content": c} for r, c in chat], tokenize=True, return_dict=False)
    assert list(got) == want


def test_qwen3_think_blocks_are_rendered_and_trained_as_the_template_does():
    tok = tokenizer("qwen3")
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    # no reasoning: the last turn still gets the (empty) think block, trained with the reply
    ex = tokenize_conversation(tok, to_conversation({"messages": [u("q"), a("A")]}, "t:1", "messages"))
    assert tok.decode(ex.input_ids) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
    assert tok.decode(ex.input_ids[ex.trainable]) == "<think>\n\n</think>\n\nA<|im_end|>"
    # multi-turn: an earlier turn's reasoning is dropped, the last turn's is rendered and trained
    msgs = [u("q1"), a("<think>r1</think>A1"), u("q2"), a("<think>\nr2\n</think>\n\nA2")]
    ex = tokenize_conversation(tok, to_conversation({"messages": msgs}, "t:2", "messages"))
    assert tok.decode(ex.input_ids) == (
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"
    )
    assert tok.decode(ex.input_ids[ex.trainable]) == "A1<|im_end|><think>\nr2\n</think>\n\nA2<|im_end|>"
    trained = tok.convert_ids_to_tokens(ex.input_ids[ex.trainable].tolist())
    assert trained[trained.index("<|im_end|>") + 1] == "<think>"  # the think block's own token, trained


def test_templates_refuse_what_they_cannot_render_naming_the_record():
    conv = to_conversation({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                         {"role": "assistant", "content": "a"}]}, "data.jsonl:7", "messages")  # fmt: skip
    with pytest.raises(DataError, match=r"data.jsonl:7: .*Gemma 2 chat template renders no system turn"):
        tokenize_conversation(tokenizer("gemma-standin"), conv)
    tools = {
        "tools": [{"name": "f", "parameters": {}}],
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    }
    with pytest.raises(DataError, match=r"t:3: .*Phi-3 chat template renders no tools"):
        tokenize_conversation(tokenizer("phi-standin"), to_conversation(tools, "t:3", "messages"))
    # Llama 3 renders tools (tests/unit/test_family_tools.py), but one tool call per turn, as published
    two_calls = {"messages": [{"role": "user", "content": "q"},
                              {"role": "assistant", "content": None, "tool_calls": [{"name": "f", "arguments": {}}] * 2},
                              {"role": "tool", "content": "r"}, {"role": "tool", "content": "r"}, {"role": "assistant", "content": "a"}]}  # fmt: skip
    with pytest.raises(
        DataError, match=r"^t:4: the Llama 3 chat template renders one tool call per assistant turn, as published; this turn has 2$"
    ):
        tokenize_conversation(tokenizer("llama3"), to_conversation(two_calls, "t:4", "messages"))


def test_offline_tokenizers_give_the_packages_ids():
    from llama_models.llama3.tokenizer import Tokenizer
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    pinned = ["Hello world", "Don't stop: 3.14159 — naïve café\tTab", "你好，世界\n\n  x", "def f(x):\n    return x**2"]
    meta = Tokenizer(_mistral_file("x").parents[2] / "llama_models" / "llama3" / "tokenizer.model")
    mistral = MistralTokenizer.from_file(str(_mistral_file("mistral_instruct_tokenizer_240323.model.v3"))).instruct_tokenizer.tokenizer
    for s in pinned:
        assert tokenizer("llama3")(s, add_special_tokens=False)["input_ids"] == meta.encode(s, bos=False, eos=False)
        assert tokenizer("mistral-v3")(s)["input_ids"] == mistral.encode(s, bos=True, eos=False)
    assert tokenizer("llama3")("Hello world")["input_ids"] == [128000, 9906, 1917]  # <|begin_of_text|> added as published
    ll = tokenizer("llama3")
    assert ll.convert_tokens_to_ids(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                     "<|reserved_special_token_247|>"]) == [128000, 128001, 128006, 128007, 128009, 128255]  # fmt: skip
    assert len(ll) == 128256 and (ll.eos_token_id, ll.pad_token_id) == (128001, 128004)
    assert meta.special_tokens["<|eot_id|>"] == 128009 and meta.n_words == len(ll)
    m = tokenizer("mistral-v3")
    assert m.convert_tokens_to_ids(["<s>", "</s>", "[INST]", "[/INST]"]) == [1, 2, 3, 4] == [mistral.bos_id, mistral.eos_id, 3, 4]
    assert len(m) == mistral.n_words == 32768
    q = tokenizer("qwen3")
    assert q("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    assert q.convert_tokens_to_ids(["<|im_end|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]) == [
        151645,
        151665,
        151666,
        151667,
        151668,
    ]
    assert (q.eos_token_id, q.pad_token_id, len(q)) == (151645, 151643, 151669)


def test_liger_and_attention_routing_per_family():
    from transformers import AutoConfig

    from rayft.config import ModelConfig
    from rayft.train.attention import resolve_attn_implementation, unsupported_attention_features
    from rayft.train.families import FAMILIES, liger_call
    from rayft.train.loss import resolve_cross_entropy
    from rayft.train.model import _apply_liger, load_model_config
    from rayft.train.presets import PRESETS

    routes = {t: liger_call(t) for t in ("qwen2", "qwen3", "llama", "mistral", "gemma2", "phi3")}
    assert {t: r[0] for t, r in routes.items()} == {
        "qwen2": "apply_liger_kernel_to_qwen2", "qwen3": "apply_liger_kernel_to_qwen3", "llama": "apply_liger_kernel_to_llama",
        "mistral": "apply_liger_kernel_to_mistral", "gemma2": "apply_liger_kernel_to_gemma2", "phi3": "apply_liger_kernel_to_phi3",
    }  # fmt: skip
    assert routes["gemma2"][1] == {
        "rope": True,
        "rms_norm": True,
        "geglu": True,
        "cross_entropy": False,
        "fused_linear_cross_entropy": False,
    }
    assert routes["llama"][1]["swiglu"] is True and "geglu" not in routes["llama"][1]
    # Qwen3 under activation checkpointing and compiled layers: liger's RoPE and RMSNorm off (they
    # failed on a GPU there); every other family, and Qwen3 otherwise, keeps every kernel
    both = {t: liger_call(t, checkpointed_compiled=True)[1] for t in routes}
    assert both["qwen3"] == {**routes["qwen3"][1], "rope": False, "rms_norm": False}
    assert routes["qwen3"][1]["rope"] is routes["qwen3"][1]["rms_norm"] is True
    assert all(both[t] == routes[t][1] for t in routes if t != "qwen3")
    assert {PRESETS[p]["model_type"] for p in PRESETS} <= set(FAMILIES)  # every preset has a family
    with pytest.raises(ValueError, match="no liger-kernel patch for model_type 'gpt2'"):
        liger_call("gpt2")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        _apply_liger(SimpleNamespace(config=AutoConfig.for_model("llama")), torch.device("cpu"))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    gemma, llama = (load_model_config(ModelConfig(name_or_path=p)) for p in ("gemma2-tiny", "llama3-tiny"))
    assert gemma._attn_implementation == "eager" and llama._attn_implementation == "sdpa"
    assert resolve_attn_implementation("auto", cpu, gemma) == "eager"
    assert resolve_attn_implementation("auto", cuda, gemma) == "flex_attention"  # softcap + sliding window: not varlen
    for bad in ("sdpa", "varlen"):
        with pytest.raises(ValueError, match="attn_logit_softcapping=50.0"):
            resolve_attn_implementation(bad, cpu, gemma)
    assert resolve_cross_entropy("auto", cpu, gemma) == "hf" and resolve_cross_entropy("auto", cpu, llama) == "torch"
    phi = load_model_config(ModelConfig(name_or_path="phi-3.5-mini"), "sdpa")
    phi.sliding_window = 262144  # Phi-3.5's published window, longer than its context: no window
    assert unsupported_attention_features(phi) == []
    phi.sliding_window = 2047  # Phi-3-mini-4k's: a real window, which varlen does not implement
    assert unsupported_attention_features(phi) == ["sliding_window=2047"]


def test_presets_match_the_published_parameter_counts_and_ties():
    """`rayft models --json`: parameter counts of the model cards (to their published precision),
    the tie flags, context lengths and tokenizers."""
    from typer.testing import CliRunner

    from rayft.cli import app

    res = CliRunner().invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["preset"]: r for r in map(json.loads, res.stdout.splitlines())}
    published = {"qwen3-0.6b": 0.6e9, "qwen3-1.7b": 1.72e9, "qwen3-4b": 4.0e9, "qwen3-8b": 8.2e9, "llama-3.2-1b": 1.24e9,
                 "llama-3.2-3b": 3.21e9, "llama-3.1-8b": 8.03e9, "mistral-7b-v0.3": 7.25e9, "gemma-2-2b": 2.61e9, "phi-3.5-mini": 3.82e9}  # fmt: skip
    for p, n in published.items():
        assert abs(rows[p]["params"] - n) / n < 0.01, (p, rows[p]["params"])
    ties = {p: rows[p]["tied"] for p in ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-2-2b", "qwen3-8b")}
    assert ties == {"llama-3.2-1b": True, "llama-3.2-3b": True, "llama-3.1-8b": False, "mistral-7b-v0.3": False, "gemma-2-2b": True,
                    "qwen3-8b": False}  # fmt: skip
    assert rows["gemma-2-2b"]["context"] == 8192 and rows["llama-3.1-8b"]["context"] == 131072
    assert rows["gemma-2-2b"]["tokenizer"] == "google/gemma-2-2b-it" and rows["llama3-tiny"]["tokenizer"] == "llama3"


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"  # a file store: no TCP port to collide with another test process
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("preset", list(TINY))
def test_tiny_preset_trains_and_exports_with_equal_logits(gloo, preset, tmp_path):
    """3 steps of the worker's train_step on real records (loss falls); a packed row's loss equals
    its documents' losses apart (packing, sliding window and soft-capping honoured); the HF export
    loads with AutoModelForCausalLM, ties as the architecture does, gives the same logits, and its
    generation config stops at the family's end-of-turn token."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.data.packing import collate
    from rayft.train import checkpoint as ckpt_lib
    from rayft.train.model import build_sharded_model, load_model_config, tied_embeddings
    from rayft.train.optim import build_optimizer
    from rayft.train.step import micro_batch_loss, train_step

    tok = tokenizer(TINY[preset])
    # two short real records (EN, ZH): rows of 64 tokens keep the 256k-vocabulary logits cheap
    convs = [to_conversation(alpaca(f, i), f"{f}:{i}", "alpaca") for f, i in (("alpaca_en_demo.json", 554), ("alpaca_zh_demo.json", 124))]
    ds = tokenize_dataset(tok, convs, seq_len=64)
    assert len(ds) == 2 and ds.truncated == 0 and min(ds.lengths()) > 16  # each document crosses gemma2-tiny's window
    cpu = torch.device("cpu")
    mcfg = ModelConfig(name_or_path=preset)
    model = build_sharded_model(mcfg, ParallelConfig(), device=cpu, activation_checkpointing=False, compile_layers=False, seed=3)
    rows = lambda r: collate(ds, r, 128, tok.pad_token_id, fixed_len=False, pad_to_multiple=8)  # noqa: E731  (no padding to 128)
    packed = rows([[0, 1]])
    with torch.no_grad():
        apart = sum(float(micro_batch_loss(model, rows([[i]]))) for i in (0, 1))
    opt = build_optimizer(model.module, TrainConfig(lr=3e-3), cpu)
    n = float(packed["num_trainable"])
    losses = [train_step(model, opt, [packed], n, max_grad_norm=1.0).loss for _ in range(3)]
    assert losses[0] * n == pytest.approx(apart, rel=1e-5)  # the first step's loss (initial weights) on the packed row
    assert losses[0] > losses[1] > losses[2] and losses[0] == pytest.approx(np.log(model.module.config.vocab_size), rel=0.15)
    sd = ckpt_lib.full_model_state_dict(model.module)
    conf = load_model_config(mcfg)
    ckpt_lib.write_hf_model(sd, conf, tok, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    # generation stops at the family's end-of-turn token first (then the EOS ids)
    eos = GenerationConfig.from_pretrained(tmp_path / "hf").eos_token_id
    assert (eos if isinstance(eos, list) else [eos])[0] == tok.convert_tokens_to_ids(MARKERS[TINY[preset]][1])
    assert tied_embeddings(hf) == tied_embeddings(model.module) == bool(conf.tie_word_embeddings)
    model.module.eval()
    with torch.no_grad():
        ref = model.module(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits
        # use_cache=False: with a cache (the export's default, for generation) transformers reads a
        # packed row as one sequence; a cache-free forward honours the documents as training does
        got = hf(input_ids=packed["input_ids"], position_ids=packed["position_ids"], use_cache=False).logits
    assert type(hf).__name__ == type(model.module).__name__.removeprefix("FSDP")
    assert (got - ref).abs().max().item() <= 1e-5


def test_the_sentencepiece_fallback_builds_what_transformers_builds():
    """``sentencepiece_bpe_backend`` (for transformers releases whose SentencePiece converter takes
    no ``legacy``, e.g. 5.17 on the GPU host) gives the backend that this transformers builds with
    ``legacy=False``: the same serialized tokenizer, hence the same ids for the pinned texts."""
    import inspect

    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    from rayft.data.tokenizer import sentencepiece_bpe_backend

    if "legacy" not in inspect.signature(SpmConverter.build_tokenizer_from_spm_proto).parameters:
        pytest.skip("this transformers has no SentencePiece-faithful converter to compare with")
    proto = import_protobuf().ModelProto()
    proto.ParseFromString(_mistral_file("mistral_instruct_tokenizer_240323.model.v3").read_bytes())
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    ours = sentencepiece_bpe_backend(proto, vocab)
    theirs = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=False)
    assert json.loads(ours.to_str()) == json.loads(theirs.to_str())
    for s in ["Hello world", "Don't stop: 3.14159 — naïve café\tTab", "你好，世界\n\n  x", "  two  spaces "]:
        assert ours.encode(s).ids == theirs.encode(s).ids


TWO_RANKS = """
import json, sys
import torch, torch.distributed as dist
from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.data.packing import collate
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_dataset
from rayft.train.model import build_sharded_model
from rayft.train.optim import build_optimizer
from rayft.train.step import train_step

rank, store, spec = int(sys.argv[1]), sys.argv[2], json.load(open(sys.argv[3]))
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
cpu, out = torch.device("cpu"), {}
for preset, name in spec["presets"].items():
    tok = TOKENIZERS[name]  # built by the launcher before it forked the ranks (WARM)
    ds = tokenize_dataset(tok, [to_conversation(r, f"r{i}", "alpaca") for i, r in enumerate(spec["records"])], seq_len=64)
    model = build_sharded_model(ModelConfig(name_or_path=preset), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                compile_layers=False, seed=3)
    opt = build_optimizer(model.module, TrainConfig(lr=3e-3), cpu)
    mine = collate(ds, [[rank]], 128, tok.pad_token_id, fixed_len=False, pad_to_multiple=8)  # rank r trains record r
    n = sum(int(collate(ds, [[i]], 128, tok.pad_token_id, fixed_len=False)["num_trainable"]) for i in (0, 1))
    out[preset] = [train_step(model, opt, [mine], n, max_grad_norm=1.0).loss for _ in range(3)]
if rank == 0:
    json.dump(out, open(spec["out"], "w"))
dist.destroy_process_group()
"""
# the rank script's TOKENIZERS, built once in the launcher (tests/gloo_ranks.py) instead of in each rank
WARM = """
from rayft.data.tokenizer import build_standin_tokenizer, load_tokenizer
STANDIN = {"gemma-standin": "gemma2", "phi-standin": "phi3"}
TOKENIZERS = {n: build_standin_tokenizer(STANDIN[n]) if n in STANDIN else load_tokenizer(n) for n in NAMES}
"""


def test_tiny_presets_on_two_gloo_ranks_equal_one_rank(gloo, tmp_path):
    """Every tiny preset, 3 steps on 2 gloo ranks (FSDP2 shards over 2 processes, each rank its own
    record) against 1 rank holding both records as two micro-batches: the same losses (the global
    mean over both records' trainable tokens) step for step, and falling."""
    from rayft.config import ModelConfig, ParallelConfig, TrainConfig
    from rayft.data.packing import collate
    from rayft.train.model import build_sharded_model
    from rayft.train.optim import build_optimizer
    from rayft.train.step import train_step

    recs = [alpaca("alpaca_en_demo.json", 554), alpaca("alpaca_zh_demo.json", 124)]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"presets": TINY, "records": recs, "out": str(tmp_path / "losses.json")}))
    (tmp_path / "two_ranks.py").write_text(TWO_RANKS)
    warm = f"NAMES = {sorted(set(TINY.values()))!r}\n{WARM}"
    ranks = run_ranks(
        tmp_path / "two_ranks.py", [[str(r), str(tmp_path / "store"), str(spec)] for r in (0, 1)], tmp_path / "launch", warm=warm
    )
    assert [rc for rc, _ in ranks] == [0, 0], "\n".join(o[-3000:] for _, o in ranks)
    two = json.loads((tmp_path / "losses.json").read_text())
    cpu = torch.device("cpu")
    for preset, name in TINY.items():
        tok = tokenizer(name)
        ds = tokenize_dataset(tok, [to_conversation(r, f"r{i}", "alpaca") for i, r in enumerate(recs)], seq_len=64)
        rows = [collate(ds, [[i]], 128, tok.pad_token_id, fixed_len=False, pad_to_multiple=8) for i in (0, 1)]
        n = sum(float(r["num_trainable"]) for r in rows)
        model = build_sharded_model(ModelConfig(name_or_path=preset), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                    compile_layers=False, seed=3)  # fmt: skip
        opt = build_optimizer(model.module, TrainConfig(lr=3e-3), cpu)
        one = [train_step(model, opt, rows, n, max_grad_norm=1.0).loss for _ in range(3)]
        assert two[preset] == pytest.approx(one, rel=1e-5), preset
        assert two[preset][0] > two[preset][1] > two[preset][2], preset

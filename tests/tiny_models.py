"""Tiny Qwen2 models with the offline Qwen2.5 tokenizer, exported by rayft's own export
(:func:`rayft.train.checkpoint.write_hf_model`), for the generation tests.

``bigram_export``: a one-layer model whose attention and MLP write nothing (o_proj and down_proj
zero), so the hidden state is the current token's embedding and the next token is a function of
the current one, set through the LM head: after the generation prompt it answers ``REPLY`` then the
chat template's end-of-turn token, then (if generation goes on) the reply again.
``random_export``: the ``qwen2-tiny`` preset randomly initialised with a fixed seed.
"""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rayft.train.checkpoint import write_hf_model
from rayft.train.generation import end_of_turn_ids
from rayft.train.presets import PRESETS

REPLY = "Hello there"


def _conf(**over):
    d = dict(PRESETS["qwen2-tiny"])
    return AutoConfig.for_model(d.pop("model_type"), **{**d, **over})


def bigram_export(tokenizer, out: Path) -> Path:
    conf = _conf(num_hidden_layers=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    gen_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    last = tokenizer.encode(gen_prompt, add_special_tokens=False)[-1]
    reply = tokenizer.encode(REPLY, add_special_tokens=False)
    (eot,) = end_of_turn_ids(tokenizer)
    chain = [last, *reply, eot, reply[0]]
    sd = model.state_dict()
    with torch.no_grad():
        for k in sd:
            if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
                sd[k].zero_()
        emb = sd["model.embed_tokens.weight"]
        emb.normal_()
        unit = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()  # what the final RMSNorm (weight 1) makes of it
        head = sd["lm_head.weight"]
        head.zero_()
        for a, b in zip(chain, chain[1:]):
            head[b] += 4.0 * unit[a] / conf.hidden_size
    return write_hf_model(sd, conf, tokenizer, out)


def random_export(tokenizer, out: Path, seed: int = 0) -> Path:
    conf = _conf()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    sd = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return write_hf_model(sd, conf, tokenizer, out)

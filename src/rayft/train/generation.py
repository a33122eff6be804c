"""The export's ``generation_config.json``: where generation stops, and the base model's sampling defaults.

A chat model trained on a template ends each assistant turn with the template's end-of-turn
token (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``), which is
often not the tokenizer's EOS (Qwen2.5's base EOS is ``<|endoftext|>``). Generation stops at the
tokens listed in ``eos_token_id``, so the export lists the end-of-turn token(s) first, then the
base EOS. The end-of-turn tokens are read from the chat template itself
(:func:`end_of_turn_ids`), not from a table of models.
"""

from __future__ import annotations

import os

from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

# A reply no template can contain by itself: the text after it is what the template adds.
_REPLY = "rayft-reply-marker-7f3a"


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of the tokenizer's special tokens (its named ones and every added token marked special)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
    return ids


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special token(s) the chat template writes right after an assistant reply (e.g. ``[151645]``,
    ``<|im_end|>``, for ChatML), in order, up to the first ordinary token (a newline); ``[]`` when the
    tokenizer has no chat template or the template adds no special token after the reply.

    Found by rendering a one-turn conversation whose reply is a marker and tokenizing what follows it.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _REPLY}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    at = text.rfind(_REPLY)
    if at < 0:
        return []
    after = tokenizer.encode(text[at + len(_REPLY) :], add_special_tokens=False)
    special = special_ids(tokenizer)
    out: list[int] = []
    for i in after:
        if i not in special:
            break
        out.append(i)
    return out


def export_generation_config(
    tokenizer: PreTrainedTokenizerBase | None, model_config: PretrainedConfig, base: GenerationConfig | None = None
) -> GenerationConfig:
    """The exported model's generation config: the base model's (``base``: its sampling defaults,
    kept as they are) or an empty one, with ``eos_token_id`` = the end-of-turn token(s)
    (:func:`end_of_turn_ids`) followed by every EOS the base generation config, the tokenizer and
    the model config name (duplicates dropped), and ``pad_token_id`` / ``bos_token_id`` where known.
    No sampling default is added that the base model does not ship."""
    gen = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
    eos: list[int] = end_of_turn_ids(tokenizer) if tokenizer is not None else []

    def add(ids) -> None:
        for i in [ids] if isinstance(ids, int) else ids or []:
            if i is not None and i not in eos:
                eos.append(int(i))

    add(base.eos_token_id if base is not None else None)
    add(tokenizer.eos_token_id if tokenizer is not None else None)
    add(getattr(model_config, "eos_token_id", None))
    if eos:
        gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    if gen.pad_token_id is None:
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        gen.pad_token_id = pad if pad is not None else (eos[-1] if eos else None)
    if gen.bos_token_id is None and getattr(model_config, "bos_token_id", None) is not None:
        gen.bos_token_id = model_config.bos_token_id
    return gen


def base_generation_config(name_or_path: str, revision: str | None = None, say=None) -> GenerationConfig | None:
    """The base model's ``generation_config.json`` (a hub id or a directory), or None when it ships
    none (an architecture preset, a model without one) or cannot be read (offline: ``say`` gets one
    line saying so)."""
    from rayft.train.presets import is_preset

    if is_preset(name_or_path):
        return None
    if not os.path.isdir(name_or_path) and say is not None:
        from rayft.train.hub import offline_when_unreachable

        offline_when_unreachable([name_or_path], say)  # the cache only, at once, rather than retries
    try:
        return GenerationConfig.from_pretrained(name_or_path, revision=revision)
    except OSError as e:
        if say is not None and not os.path.isdir(name_or_path):
            say(f"note: no generation config from {name_or_path} ({str(e).splitlines()[0]}): the export has no sampling defaults")
        return None

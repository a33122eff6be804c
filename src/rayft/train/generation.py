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
import sys
from collections.abc import Callable

from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

# A reply no template can contain by itself: the text after it is what the template adds.
_REPLY = "rayft-reply-marker-7f3a"

#: The generation config fields that only sampling uses (dropped from a base config with ``do_sample`` off).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def _stderr(line: str) -> None:
    print(f"[rayft] {line}", file=sys.stderr, flush=True)


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of the tokenizer's special tokens (its named ones and every added token marked special)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
    return ids


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase, say: Callable[[str], None] | None = None) -> list[int]:
    """The special token(s) the chat template writes right after an assistant reply (e.g. ``[151645]``,
    ``<|im_end|>``, for ChatML), in order, up to the first ordinary token (a newline); ``[]`` when the
    tokenizer has no chat template, the template adds no special token after the reply, or the
    template cannot render the probe conversation (it raises, e.g. jinja's ``raise_exception``:
    ``say``, default stderr, gets one warning line; the export then stops at the base EOS only).

    Found by rendering a one-turn conversation whose reply is a marker and tokenizing what follows it.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _REPLY}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # a template's own raise_exception, a jinja error: no end-of-turn token known
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        (say or _stderr)(f"warning: the chat template cannot render a user/assistant turn ({first}): generation stops at the base EOS only")
        return []
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
    tokenizer: PreTrainedTokenizerBase | None,
    model_config: PretrainedConfig,
    base: GenerationConfig | None = None,
    say: Callable[[str], None] | None = None,
) -> GenerationConfig:
    """The exported model's generation config: the base model's (``base``: its sampling defaults,
    kept as they are) or an empty one, with ``eos_token_id`` = the end-of-turn token(s)
    (:func:`end_of_turn_ids`) followed by every EOS the base generation config, the tokenizer and
    the model config name (duplicates dropped), and ``pad_token_id`` / ``bos_token_id`` where known.
    No sampling default is added that the base model does not ship.

    The result always passes ``GenerationConfig.validate(strict=True)`` (so ``save_pretrained``
    cannot raise): a base config with ``do_sample`` off loses its sampling fields
    (:data:`SAMPLING_FIELDS`, which would not apply); one still invalid is replaced by a plain
    config with only the EOS/pad/BOS ids. Either change is said in one line to ``say`` (default
    stderr). Never raises for a bad base config."""
    say = say or _stderr
    gen = GenerationConfig.from_dict(base.to_dict()) if base is not None else GenerationConfig()
    if base is not None and not gen.do_sample:
        dropped = [f for f in SAMPLING_FIELDS if getattr(gen, f, None) is not None and _invalid_without_sampling(f, gen)]
        for f in dropped:
            setattr(gen, f, None)
        if dropped:
            say(
                f"note: the base generation config has do_sample false: its {', '.join(dropped)} dropped from the export (they would not apply)"
            )
    eos: list[int] = end_of_turn_ids(tokenizer, say) if tokenizer is not None else []

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
    try:
        gen.validate(strict=True)
    except ValueError as e:
        ids = {k: getattr(gen, k) for k in ("eos_token_id", "pad_token_id", "bos_token_id")}
        why = next((ln.strip(" -") for ln in str(e).splitlines()[1:] if ln.strip()), str(e))
        say(f"note: the base generation config is invalid ({why}): the export has a plain one (EOS/pad ids only)")
        gen = GenerationConfig(**{k: v for k, v in ids.items() if v is not None})
    return gen


def _invalid_without_sampling(field: str, gen: GenerationConfig) -> bool:
    """Whether ``field`` set on ``gen`` (``do_sample`` off) makes it invalid: a value other than the
    library's own default for it (transformers 4 defaults temperature 1.0, top_p 1.0, top_k 50)."""
    return getattr(gen, field) != getattr(GenerationConfig(), field, None)


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

"""Batch generation: prompts from a JSONL file, generated in left-padded batches with the KV cache.

A prompt line is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (rendered with the
model's chat template and its generation prompt) or ``{"prompt": "..."}`` (the text as is).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayft.infer.model_dir import InferError


@dataclass
class Prompt:
    """One prompt line: ``line`` (1-based) of ``file`` and either ``messages`` (chat turns) or ``text``."""

    line: int
    messages: list[dict] | None = None
    text: str | None = None
    file: str | None = None

    @property
    def where(self) -> str:
        """``FILE:LINE`` (``line N`` when the file is not known), the prefix of this prompt's errors."""
        return f"{self.file}:{self.line}" if self.file is not None else f"line {self.line}"

    def record(self) -> dict[str, Any]:
        """The prompt as the output line echoes it."""
        return {"messages": self.messages} if self.messages is not None else {"prompt": self.text}


def read_prompts(path: str | Path) -> list[Prompt]:
    """Every prompt of a JSONL file (blank lines skipped).

    Raises:
        InferError: a missing file, a file that is not UTF-8 (``FILE:LINE: not UTF-8 (byte N)``, N
            the 0-based offset in the file), or a line that is not JSON, not an object, has neither
            or both of ``messages`` and ``prompt``, an empty or whitespace-only ``prompt``, or a
            turn without a string ``role`` and ``content``; the message names ``FILE:LINE``.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InferError(f"{path}: cannot read the prompts file ({e.strerror})") from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise InferError(f"{path}:{line}: not UTF-8 (byte {e.start})") from None
    out: list[Prompt] = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InferError(f"{where}: not JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict) or ("messages" in obj) == ("prompt" in obj):
            raise InferError(f'{where}: a prompt line is {{"messages": [...]}} or {{"prompt": "..."}}')
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str):
                raise InferError(f"{where}: prompt must be a string")
            if not obj["prompt"].strip():
                raise InferError(f"{where}: the prompt is empty")
            out.append(Prompt(n, text=obj["prompt"], file=str(path)))
            continue
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise InferError(f"{where}: messages must be a non-empty list of turns")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InferError(f"{where}: messages[{i}] needs a string role and a string content")
        out.append(Prompt(n, messages=msgs, file=str(path)))
    if not out:
        raise InferError(f"{path}: no prompt in the file")
    return out


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The token ids of a prompt: chat turns through the chat template with the generation prompt
    (the template writes its own special tokens), plain text with the tokenizer's usual specials.

    Raises:
        InferError: ``FILE:LINE: the chat template cannot render these messages (...)`` (a jinja
            error, the template's own ``raise_exception``, or no chat template), or the prompt
            gives no token.
    """
    if prompt.messages is not None:
        try:
            text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # jinja2's errors, or no chat template: named by the prompt's file and line
            raise InferError(f"{prompt.where}: the chat template cannot render these messages ({e})") from None
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(prompt.text)
    if not ids:
        raise InferError(f"{prompt.where}: the prompt gives no token")
    return ids


def encode_prompts(tokenizer, prompts: list[Prompt]) -> list[list[int]]:
    """:func:`prompt_ids` of every prompt, in order: run it before the model loads, so that a
    prompt the tokenizer or chat template refuses fails at once (``FILE:LINE: ...``, InferError)."""
    return [prompt_ids(tokenizer, p) for p in prompts]


def sampling_kwargs(temperature: float | None) -> dict[str, Any]:
    """``generate`` arguments: ``temperature`` 0 → greedy; > 0 → sampled at that temperature
    (the model's top-p/top-k defaults kept); None → the model's generation config as shipped."""
    if temperature is None:
        return {}
    if temperature < 0:
        raise InferError(f"--temperature {temperature}: must be >= 0 (0: greedy)")
    if temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": temperature}


def generate_all(
    model,
    tokenizer,
    prompts: list[Prompt],
    *,
    max_new_tokens: int = 256,
    temperature: float | None = 0.0,
    seed: int = 0,
    batch_size: int = 8,
    on_result=None,
) -> list[dict[str, Any]]:
    """Generate for every prompt, ``batch_size`` at a time, left-padded (the attention mask keeps
    the padding out), with the KV cache; returns one record per prompt, in order:
    ``{"line", "messages"|"prompt", "completion" (str, special tokens dropped), "new_tokens" (int),
    "finish": "stop" | "length"}``. ``on_result(record)`` is called as each batch finishes.
    Sampling draws from torch's generator seeded once with ``seed``."""
    import torch

    if batch_size < 1 or max_new_tokens < 1:
        raise InferError("--batch-size and --max-new-tokens must be >= 1")
    kwargs = sampling_kwargs(temperature)
    torch.manual_seed(seed)
    eos = model.generation_config.eos_token_id
    stops = set([eos] if isinstance(eos, int) else eos or [])
    if tokenizer.pad_token_id is None:  # padding needs a pad id; the masked positions never count
        fallback = model.generation_config.pad_token_id
        tokenizer.pad_token_id = fallback if fallback is not None else min(stops, default=0)
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device
    results: list[dict[str, Any]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        ids = [prompt_ids(tokenizer, p) for p in chunk]
        batch = tokenizer.pad({"input_ids": ids}, padding=True, padding_side="left", return_tensors="pt").to(device)
        width = batch["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, pad_token_id=pad, use_cache=True, **kwargs)
        for p, row in zip(chunk, out[:, width:].tolist()):
            n = next((i + 1 for i, t in enumerate(row) if t in stops), None)
            new = row[:n] if n is not None else row
            rec = {
                "line": p.line,
                **p.record(),
                "completion": tokenizer.decode(new, skip_special_tokens=True),
                "new_tokens": len(new),
                "finish": "stop" if n is not None else "length",
            }
            results.append(rec)
            if on_result is not None:
                on_result(rec)
    return results


def check_out_path(out: str | Path) -> None:
    """Check that ``out`` can be written before anything is loaded: its directory exists and is
    writable, and ``out`` is not a directory.

    Raises:
        InferError: naming ``out`` and what is wrong.
    """
    p = Path(out)
    parent = p.parent
    if p.is_dir():
        raise InferError(f"{out}: is a directory (--out is a file)")
    if not parent.is_dir():
        raise InferError(f"{out}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InferError(f"{out}: cannot be written (permission denied)")

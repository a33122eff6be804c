"""`rayft generate`: completions for a JSONL file of prompts (:mod:`rayft.infer.generate`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from rayft.commands.common import fail, say


def generate(
    model: Annotated[str, typer.Argument(help="A run directory or a Hugging Face model directory (an export).")],
    prompts: Annotated[Path, typer.Option(help='JSONL: one {"messages": [...]} or {"prompt": "..."} per line.')],
    out: Annotated[Optional[Path], typer.Option(help="Output JSONL (default: stdout).")] = None,
    step: Annotated[
        Optional[int], typer.Option(help="A run's checkpoint step, exported on the fly (default: RUN/hf, else the newest checkpoint).")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most new tokens per prompt.")] = 256,
    temperature: Annotated[float, typer.Option(min=0, help="0: greedy; > 0: sampled (the model's top-p/top-k kept).")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampling.")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts per batch (left-padded).")] = 8,
    device: Annotated[Optional[str], typer.Option(help="torch device (default: cuda when there is a GPU, else cpu).")] = None,
) -> None:
    """Generate a completion for every prompt of a JSONL file: batched, left-padded, with the KV cache.

    One JSON line per prompt: {"line", "messages"|"prompt", "completion", "new_tokens", "finish"}."""
    from rayft.infer.generate import check_out_path, encode_prompts, generate_all, read_prompts
    from rayft.infer.model_dir import InferError, load_model, load_tokenizer, model_dir

    try:
        items = read_prompts(prompts)  # a bad line fails here, before any model loads
        if out is not None:
            check_out_path(out)
        with model_dir(model, step, say=say) as hf:
            tok = load_tokenizer(hf)
            encode_prompts(tok, items)  # the chat template's errors (FILE:LINE) before the weights load
            m, tok, dev = load_model(hf, device, tokenizer=tok)
            say(f"generating for {len(items)} prompt(s) with {hf} on {dev}")
            sink = out.open("w", encoding="utf-8") if out else sys.stdout
            try:

                def emit(rec: dict) -> None:
                    sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    sink.flush()

                generate_all(
                    m, tok, items, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size, on_result=emit
                )
            finally:
                if out:
                    sink.close()
    except InferError as e:
        fail(str(e))
    if out:
        say(f"wrote {len(items)} completion(s) to {out}")

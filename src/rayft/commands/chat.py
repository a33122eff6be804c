"""`rayft chat`: talk to a run's model in the terminal (:mod:`rayft.infer.chat`)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from rayft.commands.common import fail, say


def chat(
    model: Annotated[str, typer.Argument(help="A run directory or a Hugging Face model directory (an export).")],
    step: Annotated[
        Optional[int], typer.Option(help="A run's checkpoint step, exported on the fly (default: RUN/hf, else the newest checkpoint).")
    ] = None,
    system: Annotated[Optional[str], typer.Option(help="The system prompt (default: the chat template's).")] = None,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per reply.")] = 512,
    temperature: Annotated[Optional[float], typer.Option(min=0, help="0: greedy; default: the model's generation config.")] = None,
    device: Annotated[Optional[str], typer.Option(help="torch device (default: cuda when there is a GPU, else cpu).")] = None,
) -> None:
    """Chat with a model in the terminal, replies streamed; /reset, /system TEXT, /exit (or Ctrl-D)."""
    from rayft.infer.chat import Chat, chat_loop
    from rayft.infer.model_dir import InferError, load_model, model_dir

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        with model_dir(model, step, say=say) as hf:
            m, tok, dev = load_model(hf, device)
            say(f"model {hf} on {dev}")
            chat_loop(Chat(m, tok, max_new_tokens=max_new_tokens, temperature=temperature, system=system), input, write)
    except InferError as e:
        fail(str(e))

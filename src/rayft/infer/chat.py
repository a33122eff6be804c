"""The terminal chat: the conversation through the model's chat template, replies streamed as they
are generated (transformers' ``TextIteratorStreamer``), and the commands ``/reset``, ``/system TEXT``
and ``/exit``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

HELP = "commands: /reset (new conversation), /system TEXT (set the system prompt and reset), /exit (or Ctrl-D)"


class _Interrupt:
    """A stopping criterion that a Ctrl-C during a reply sets (the reply ends where it is)."""

    def __init__(self):
        self.flag = threading.Event()

    def __call__(self, input_ids, scores, **kwargs) -> bool:
        return self.flag.is_set()


class Chat:
    """One conversation with ``model``: ``messages`` (the turns so far, the system prompt first
    when one is set), replies generated with ``max_new_tokens`` and ``temperature`` (0: greedy;
    None: the model's generation config)."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 512, temperature: float | None = None, system: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.system = system
        self.messages: list[dict] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str, write: Callable[[str], None]) -> dict:
        """Add the user turn ``text``, stream the reply's text through ``write`` as it comes, add
        the reply to the conversation; returns ``{"new_tokens", "context_tokens", "seconds"}``.
        A KeyboardInterrupt during the reply ends it early (what came so far is kept)."""
        import torch
        from transformers import StoppingCriteriaList, TextIteratorStreamer

        from rayft.infer.generate import sampling_kwargs

        self.messages.append({"role": "user", "content": text})
        prompt = self.tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False, return_tensors="pt").to(next(self.model.parameters()).device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        stop = _Interrupt()
        out: dict = {}

        def run() -> None:
            with torch.no_grad():
                out["ids"] = self.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=self.max_new_tokens,
                    streamer=streamer,
                    stopping_criteria=StoppingCriteriaList([stop]),
                    pad_token_id=self.tokenizer.pad_token_id,
                    **sampling_kwargs(self.temperature),
                )

        t0 = time.monotonic()
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        pieces: list[str] = []
        try:
            for piece in streamer:
                pieces.append(piece)
                write(piece)
        except KeyboardInterrupt:
            stop.flag.set()
            for piece in streamer:  # drain what the last step produced
                pieces.append(piece)
        worker.join()
        new = out["ids"].shape[1] - ids.shape[1] if "ids" in out else 0
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
        return {"new_tokens": int(new), "context_tokens": int(ids.shape[1] + new), "seconds": time.monotonic() - t0}


def chat_loop(chat: Chat, read: Callable[[str], str], write: Callable[[str], None]) -> None:
    """Read lines with ``read(prompt)`` until ``/exit`` or end of input (EOFError), answering each
    through ``chat`` and writing to ``write``; after each reply, one line with the new tokens, the
    tokens in context and the speed."""
    write(HELP + "\n")
    while True:
        try:
            line = read("you> ")
        except EOFError:
            write("\n")
            return
        except KeyboardInterrupt:
            write("\n(/exit or Ctrl-D ends the chat)\n")
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            chat.reset()
            write("(new conversation)\n")
            continue
        if text == "/system" or text.startswith("/system "):
            chat.system = text[len("/system") :].strip() or None
            chat.reset()
            write(f"(system prompt {'set' if chat.system else 'cleared'}; new conversation)\n")
            continue
        if text.startswith("/"):
            write(f"unknown command {text.split()[0]}; {HELP}\n")
            continue
        write("model> ")
        stats = chat.reply(text, write)
        rate = stats["new_tokens"] / stats["seconds"] if stats["seconds"] > 0 else 0.0
        write(f"\n[{stats['new_tokens']} tokens, {stats['context_tokens']} in context, {rate:.1f} tok/s]\n")

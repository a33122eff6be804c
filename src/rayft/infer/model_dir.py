"""The Hugging Face model behind ``RUN_DIR|HF_DIR [--step N]``, and loading it for generation."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


class InferError(RuntimeError):
    """A model, prompt file or option that generation cannot use; the message names the path (and line)."""


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model directory: ``config.json`` next to safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


@contextlib.contextmanager
def model_dir(path: str | Path, step: int | None = None, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """The HF directory to load for ``path``: an HF export as is; a run directory's end-of-run
    export (``RUN/hf``) when there is one and no ``step`` is asked; else the run's checkpoint of
    ``step`` (default: the newest complete one), exported on the fly
    (:func:`rayft.train.checkpoint.export_run`) into a temporary directory removed on exit.

    Raises:
        InferError: no such directory, neither an HF directory nor a run directory, ``step`` given
            with an HF directory, or the checkpoint cannot be exported (missing, corrupt).
    """
    p = Path(path)
    if not p.is_dir():
        raise InferError(f"{path}: no such directory")
    if is_hf_dir(p):
        if step is not None:
            raise InferError(f"{path}: a Hugging Face model directory has no steps (--step is for a run directory)")
        yield p
        return
    if not (p / "rayft.yaml").is_file() and not any(p.glob("checkpoint_*")):
        raise InferError(f"{path}: neither a Hugging Face model directory (config.json + *.safetensors) nor a rayft run directory")
    if step is None and is_hf_dir(p / "hf"):
        yield p / "hf"
        return
    from rayft.train.checkpoint import CheckpointError, export_run

    with tempfile.TemporaryDirectory(prefix="rayft-chat-") as tmp:
        if say is not None:
            say(f"exporting {'the newest checkpoint' if step is None else f'the checkpoint of step {step}'} of {path} to {tmp}")
        try:
            out = export_run(str(p), step=step, out=Path(tmp) / "hf", say=say)
        except CheckpointError as e:
            raise InferError(str(e)) from None
        yield out


def pick_device(device: str | None = None):
    """``device`` as a torch device; default: the first CUDA GPU when there is one, else the CPU."""
    import torch

    if device:
        return torch.device(device)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def load_model(hf_dir: Path, device=None):
    """(model, tokenizer, device): the causal LM of ``hf_dir`` in eval mode on ``device``
    (:func:`pick_device`), bfloat16 on a GPU and float32 on the CPU, and its tokenizer.

    Raises:
        InferError: the directory has no tokenizer (an export written without one).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in a chat or before the JSON lines
    device = pick_device(device) if not isinstance(device, torch.device) else device
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    except (OSError, ValueError) as e:
        raise InferError(f"{hf_dir}: no tokenizer to load ({str(e).splitlines()[0]})") from None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).to(device).eval()
    return model, tokenizer, device

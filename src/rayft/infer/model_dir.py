"""The Hugging Face model behind ``RUN_DIR|HF_DIR [--step N]``, and loading it for generation."""

from __future__ import annotations

import contextlib
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


class InferError(RuntimeError):
    """A model, prompt file or option that generation cannot use; the message names the path (and line)."""


#: A Hugging Face directory has its tokenizer when it holds one of these files.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@contextlib.contextmanager
def exit_on_signals(signums=(signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``SystemExit(128 + signum)`` (as the shell's
    exit status of a killed process) instead of ending the process at once, so the ``finally``
    clauses and context managers around the block run (a temporary export is removed); the
    previous handlers are restored on exit. A no-op outside the main thread (Python delivers
    signals there only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum, frame):
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, leave) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def is_hf_dir(path: Path) -> bool:
    """A Hugging Face model directory: ``config.json`` next to safetensors weights."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


@contextlib.contextmanager
def model_dir(path: str | Path, step: int | None = None, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """The HF directory to load for ``path``: an HF export as is; a run directory's end-of-run
    export (``RUN/hf``) when there is one and no ``step`` is asked; else the run's checkpoint of
    ``step`` (default: the newest complete one), exported on the fly
    (:func:`rayft.train.checkpoint.export_run`) into a temporary directory removed on exit.

    While the temporary export exists, SIGTERM and SIGHUP end the process through
    ``SystemExit`` (:func:`exit_on_signals`), so the export is removed then too.

    Raises:
        InferError: no such directory, neither an HF directory nor a run directory, ``step`` given
            with an HF directory, no complete checkpoint (of ``step``), or the checkpoint cannot be
            exported (corrupt); all before "exporting ..." is said.
    """
    p = Path(path)
    if not p.is_dir():
        raise InferError(f"{path}: no such directory")
    if is_hf_dir(p):
        if step is not None:
            raise InferError(f"{path}: a Hugging Face model directory has no steps (--step is for a run directory)")
        yield p
        return
    from rayft.train.checkpoint_files import checkpoint_dirs, find_checkpoints

    if not (p / "rayft.yaml").is_file() and not checkpoint_dirs(p):
        raise InferError(f"{path}: neither a Hugging Face model directory (config.json + *.safetensors) nor a rayft run directory")
    if step is None and is_hf_dir(p / "hf"):
        yield p / "hf"
        return
    steps = [s for s, _ in find_checkpoints(p)]
    if not steps:
        raise InferError(f"{path}: no complete checkpoint in this run (and no end-of-run export hf/)")
    if step is not None and step not in steps:
        raise InferError(f"{path}: no complete checkpoint at step {step} (have {steps})")
    from rayft.train.checkpoint import CheckpointError, export_run

    with exit_on_signals(), tempfile.TemporaryDirectory(prefix="rayft-chat-") as tmp:
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


def load_tokenizer(hf_dir: Path):
    """The tokenizer of the HF directory ``hf_dir`` (cheap: no weights are read).

    Raises:
        InferError: naming the directory: none of :data:`TOKENIZER_FILES` in it (an export written
            without a tokenizer; transformers would build an empty one-token tokenizer instead of
            failing), the tokenizer cannot be loaded, or it has a single token.
    """
    from transformers import AutoTokenizer

    hf_dir = Path(hf_dir)
    if not any((hf_dir / f).is_file() for f in TOKENIZER_FILES):
        raise InferError(f"{hf_dir}: no tokenizer in the directory (none of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    except (OSError, ValueError) as e:
        raise InferError(f"{hf_dir}: no tokenizer to load ({str(e).splitlines()[0]})") from None
    if len(tokenizer) <= 1:
        raise InferError(f"{hf_dir}: the tokenizer has {len(tokenizer)} token(s) (its files are empty or broken)")
    return tokenizer


def load_model(hf_dir: Path, device=None, tokenizer=None):
    """(model, tokenizer, device): the causal LM of ``hf_dir`` in eval mode on ``device``
    (:func:`pick_device`), bfloat16 on a GPU and float32 on the CPU, and its tokenizer
    (``tokenizer`` when given, else :func:`load_tokenizer`, before any weight is read).

    Raises:
        InferError: the directory has no usable tokenizer (:func:`load_tokenizer`).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bar in a chat or before the JSON lines
    device = pick_device(device) if not isinstance(device, torch.device) else device
    if tokenizer is None:
        tokenizer = load_tokenizer(hf_dir)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=dtype).to(device).eval()
    return model, tokenizer, device

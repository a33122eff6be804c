"""Sharded checkpoints (torch.distributed.checkpoint) and the Hugging Face export.

A checkpoint directory holds every rank's DCP shards of ``{"model", "optim"}`` (the last step's
only ``{"model"}`` with ``checkpoint.final_model_only``) plus ``rayft_state.json`` (step, epoch,
world size, loss, ``contents``, and the digest of every other file) and the model's
``config.json``, written by rank 0 *last*: a directory without ``rayft_state.json`` is
incomplete and is never resumed or exported. Ray Train collects the directory of every rank into
one checkpoint on the run's storage.

Integrity: each rank hashes the files it writes while writing them (:mod:`rayft.train.digests`),
rank 0 gathers the digests into the state file, and ``--resume``, a worker-group restart and
``rayft export`` check them before loading (:func:`verify_checkpoint`): a corrupt checkpoint is
skipped for the newest intact one on resume and refused by export. A state file without digests
(written by an earlier rayft) is accepted as unverifiable.

When the training loop checkpoints, and how a save runs in the background and is reported to Ray
Train: :mod:`rayft.train.checkpoint_writer`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rayft.train.checkpoint_files import (
    STATE_FILE,
    CheckpointCheck,
    checkpoint_dirs,
    find_checkpoints,
    holds_optimizer,
    is_complete,
    newest_intact,
    read_state,
    step_of_dir,
    verify_checkpoint,
)
from rayft.train.digests import ALGORITHM, file_digest


class CheckpointError(RuntimeError):
    """A checkpoint or run directory that cannot be used; the message names the path."""


def check_same_data(path: str | os.PathLike, saved: str | None, current: str) -> None:
    """Refuse to resume the checkpoint at ``path``, made from data of fingerprint ``saved``
    (None: a checkpoint without one), with data of fingerprint ``current``: the data order would
    not continue. Checked by the driver before workers start and by the workers after a restart.

    Raises:
        CheckpointError: the fingerprints differ.
    """
    if saved not in (None, current):
        raise CheckpointError(
            f"{path}: the training data changed since this checkpoint (fingerprint {saved} → {current}): it was made "
            "from other data, or by an earlier rayft (fingerprints changed with the token store, issue 18); "
            "resuming would not continue the same data order"
        )


def write_state(path: str, state: dict, model_config, digests: dict[str, str] | None = None) -> None:
    """The model's ``config.json``, then the state file, atomically (last: it marks the checkpoint complete).

    ``digests``: the hex digest of every DCP file of the checkpoint by name (every rank's shards and
    ``.metadata``, see :class:`~rayft.train.hashing_writer.HashingFileSystemWriter`); when given, the state
    file records them with ``config.json``'s (read back here: a few KB) under ``"digests"``, and
    the algorithm under ``"digest_algorithm"``.
    """
    config_file = os.path.join(path, "config.json")
    model_config.to_json_file(config_file)
    if digests is not None:
        state = {**state, "digest_algorithm": ALGORITHM, "digests": {**digests, "config.json": file_digest(config_file)}}
    tmp = os.path.join(path, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, os.path.join(path, STATE_FILE))


def verify_run(run: str | os.PathLike, step: int | None = None) -> list[CheckpointCheck]:
    """Check every checkpoint directory of a run directory (or the one of ``step``), oldest first.

    Raises:
        CheckpointError: no such run directory (or one on object storage), no checkpoint in it, or
            none at ``step``.
    """
    if "://" in str(run):
        raise CheckpointError(f"{run}: checkpoint verify reads a local or mounted run directory (copy an object-storage run down first)")
    run_dir = Path(run)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run}: no such run directory")
    dirs = checkpoint_dirs(run_dir)
    if not dirs:
        raise CheckpointError(f"{run}: no checkpoint in this run directory")
    if step is not None:
        have = [step_of_dir(d) for d in dirs]
        dirs = [d for d in dirs if step_of_dir(d) == step]
        if not dirs:
            raise CheckpointError(f"{run}: no checkpoint at step {step} (have {have})")
    return [verify_checkpoint(d) for d in dirs]


def save_shards(state_dict: dict, path: str, writer: dcp.FileSystemWriter) -> None:
    """Collective: write ``state_dict``'s shards into ``path`` (``dcp.save``). A failed write (an
    exception on any rank, e.g. ENOSPC: DCP raises it on every rank) removes the partial directory
    on each rank, then re-raises."""
    try:
        dcp.save(state_dict, checkpoint_id=path, storage_writer=writer)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def async_save_shards(state_dict: dict, path: str, writer: dcp.FileSystemWriter, process_group) -> Future:
    """Collective: start writing ``state_dict``'s shards into ``path`` in the background
    (``dcp.async_save`` over ``process_group``) and return a future of the write. When the write
    fails (e.g. ENOSPC), the partial directory is removed in the writing thread as soon as it fails,
    before the returned future completes; its ``result()`` then raises the error."""
    done: Future = Future()

    def settle(write: Future) -> None:
        error = CancelledError() if write.cancelled() else write.exception()
        if error is None:
            done.set_result(write.result())
            return
        shutil.rmtree(path, ignore_errors=True)
        done.set_exception(error)

    try:
        write = dcp.async_save(state_dict, checkpoint_id=path, storage_writer=writer, process_group=process_group)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    write.add_done_callback(settle)
    return done


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> dict:
    """Collective: load model and optimizer shards from ``path`` (any saved world size) and return
    its state file's fields (``step``, ``world_size``, ...). A model-only checkpoint
    (:func:`~rayft.train.checkpoint_files.holds_optimizer` false) loads the weights and leaves
    ``optimizer`` as it is: the caller decides whether that may go on (only with no step left).

    Raises:
        CheckpointError: an incomplete checkpoint directory.
    """
    if not is_complete(path):
        raise CheckpointError(f"{path}: incomplete checkpoint (no {STATE_FILE} or .metadata)")
    fields = read_state(path)
    if not holds_optimizer(fields):
        msd = get_model_state_dict(model)
        dcp.load({"model": msd}, checkpoint_id=path)
        set_model_state_dict(model, msd)
        return fields
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return fields


def full_model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded fp32 weights on CPU as plain tensors, on rank 0 only (other ranks
    get ``{}``). Wrapper subclasses (torchao's float8 weight wrapper) are unwrapped to the fp32
    tensor they hold."""
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: plain_tensor(v) for k, v in sd.items()}


def plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain ``torch.Tensor`` inside a single-tensor wrapper subclass (one whose
    ``__tensor_flatten__`` names one inner tensor), else ``t`` itself.

    Raises:
        TypeError: a DTensor (its inner tensor is one rank's shard, not the value), or a wrapper
            holding several inner tensors (no single value to export).
    """
    from torch.distributed.tensor import DTensor

    while type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        if isinstance(t, DTensor):
            raise TypeError("a DTensor is one rank's shard: gather it (full_tensor) before unwrapping")
        inner, _ctx = t.__tensor_flatten__()
        if len(inner) != 1:
            raise TypeError(f"cannot export a {type(t).__name__}: it wraps {len(inner)} tensors ({', '.join(inner)})")
        t = getattr(t, inner[0])
    return t


def write_hf_model(
    state_dict: dict[str, torch.Tensor],
    model_config,
    tokenizer,
    out: str | os.PathLike,
    base_generation=None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Write a Hugging Face model directory (safetensors, config with ``use_cache: true``, tokenizer
    + chat template, ``generation_config.json`` that stops at the chat template's end of turn: see
    :func:`rayft.train.generation.export_generation_config`; ``base_generation``: the base model's
    generation config, whose sampling defaults are kept; ``say`` (default stderr) gets its notes),
    atomically: the files go to ``out.tmp`` which is then renamed to ``out``."""
    from transformers import AutoModelForCausalLM

    from rayft.train.hf_weights import loadable_state_dict, write_weight_files

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    want = loadable_state_dict(skeleton)  # a tied LM head is stored once, as the embedding
    missing = [k for k in want if k not in state_dict]
    unexpected = [k for k in state_dict if k not in skeleton.state_dict()]
    if missing or unexpected:
        raise CheckpointError(f"{out}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    tmp.mkdir(parents=True)
    write_weight_files(
        {k: state_dict[k].numel() * state_dict[k].element_size() for k in want}, lambda names: {k: state_dict[k] for k in names}, tmp
    )
    write_hf_config_files(model_config, tokenizer, tmp, base_generation=base_generation, say=say)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def resolve_resume_dir(ray_checkpoint, chosen: str | None, run_dir: str) -> str | None:
    """Collective (when torch.distributed is initialised): the checkpoint directory to resume from,
    or None to start fresh.

    On a local or shared file system that is the newest *intact* checkpoint in the run directory:
    complete (the state file is written last, after every rank's shards and the DCP metadata) and
    matching the digests its state file records. It may be newer than Ray Train's latest registered
    one when a worker died between writing and registering, so a failure costs at most one
    checkpoint interval. Rank 0 chooses and tells the others: it warns about an incomplete newest
    checkpoint and about each corrupt one it skips (:func:`newest_intact`), notes one it cannot
    verify (no digests: an earlier rayft), and verifies by reading each candidate once (the other
    ranks wait in a broadcast meanwhile); ``chosen``, the checkpoint the driver verified for
    ``--resume``, is not read again. A new run's directory holds no checkpoint (the driver refuses
    to reuse one), so anything found belongs to this run. On object storage (``s3://``) it is Ray
    Train's latest checkpoint (``ray_checkpoint``), downloaded and verified by each rank (its own
    copy), else ``chosen`` (``--resume``).

    Raises:
        CheckpointError: Ray handed over a checkpoint (or ``--resume`` chose one, or the run
            directory holds some) but no intact one exists; on object storage, Ray's latest one is
            incomplete or corrupt. Raised on every rank.
    """
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if "://" in run_dir:
        if ray_checkpoint is None:
            return chosen
        path = ray_checkpoint.to_directory()
        check = verify_checkpoint(path)
        if check.status == "incomplete":
            raise CheckpointError(f"{ray_checkpoint.path}: incomplete checkpoint")
        if check.problem is not None:
            raise CheckpointError(f"{ray_checkpoint.path}: {check.problem}")
        if check.status == "unverifiable" and rank0:
            print(f"[rayft] note: {check.remark()}", flush=True)
        return path
    choice: list[str | None] = [None, None]  # [path, error message]
    if rank0:
        try:
            choice[0] = _choose_local(ray_checkpoint, chosen, run_dir)
        except CheckpointError as e:
            choice[1] = str(e)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(choice, src=0)
    if choice[1] is not None:
        raise CheckpointError(choice[1])
    return choice[0]


def _choose_local(ray_checkpoint, chosen: str | None, run_dir: str) -> str | None:
    """:func:`resolve_resume_dir` on a local or shared file system, on one rank (it prints)."""
    complete = find_checkpoints(run_dir)
    for d in checkpoint_dirs(run_dir):
        if complete and d.name > complete[-1][1].name and not is_complete(d):
            print(f"[rayft] WARNING: {d} is incomplete (interrupted save?); using {complete[-1][1]}", flush=True)

    def report(check: CheckpointCheck) -> None:
        print(f"[rayft] {'note' if check.status == 'unverifiable' else 'WARNING'}: {check.remark()}", flush=True)

    found = newest_intact(run_dir, report, trusted=chosen)
    if found is not None:
        return str(found[1])
    if complete:
        raise CheckpointError(f"{run_dir}: no intact checkpoint to resume from (every complete one is corrupt)")
    if ray_checkpoint is not None or chosen is not None:
        raise CheckpointError(f"{run_dir}: no complete checkpoint to resume from")
    return None


def say_to_stderr(msg: str) -> None:
    """Print ``msg`` to stderr at once (a warning or note beside a command's own output)."""
    print(msg, file=sys.stderr, flush=True)


def export_run(
    run: str,
    step: int | None = None,
    out: str | os.PathLike | None = None,
    say: Callable[[str], None] | None = None,
    file_bytes: int | None = None,
) -> Path:
    """Consolidate a run's checkpoint into a Hugging Face model (single process, CPU, one export
    file of at most ``file_bytes`` (default 2 GiB) in memory at a time), after verifying the
    checkpoint's files against their digests (:func:`verify_checkpoint`). ``say`` receives the note
    about a checkpoint that cannot be verified (default: printed on stderr). Written to ``out.tmp``,
    renamed to ``out`` when whole.

    Raises:
        CheckpointError: no such run, no complete checkpoint, no checkpoint at ``step``, or the
            checkpoint is corrupt (the message names its directory, the file, the expected and the
            actual digest).
    """
    from transformers import AutoConfig

    from rayft.data.tokenizer import load_tokenizer

    run_dir = Path(run)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run}: no such run directory")
    ckpts = find_checkpoints(run_dir)
    if not ckpts:
        raise CheckpointError(f"{run}: no complete checkpoint in this run")
    if step is None:
        step, ckpt = ckpts[-1]
    else:
        match = [c for s, c in ckpts if s == step]
        if not match:
            raise CheckpointError(f"{run}: no complete checkpoint at step {step} (have {[s for s, _ in ckpts]})")
        ckpt = match[0]
    check = verify_checkpoint(ckpt)
    if check.problem is not None:
        raise CheckpointError(check.problem)
    if check.status == "unverifiable":
        (say or say_to_stderr)(f"note: {check.remark()}")
    conf = AutoConfig.from_pretrained(ckpt)
    state = read_state(ckpt)
    from rayft.train.hf_weights import dcp_to_hf_files

    tokenizer = load_tokenizer(state["tokenizer"]) if state.get("tokenizer") else None
    out = Path(out or run_dir / f"hf-step{step}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # one export file's tensors in memory at a time (≤ 2 GiB), not the whole model
    dcp_to_hf_files(str(ckpt), conf, tmp, file_bytes=file_bytes)
    write_hf_config_files(conf, tokenizer, tmp, base_generation=run_base_generation(run_dir, say), say=say)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def write_hf_config_files(
    model_config, tokenizer, out: str | os.PathLike, base_generation=None, say: Callable[[str], None] | None = None
) -> None:
    """Everything of a Hugging Face model directory but the weights, into ``out``: ``config.json``
    (``use_cache: true``, the architecture's class), ``generation_config.json`` that stops at the
    chat template's end of turn (:func:`rayft.train.generation.export_generation_config`; the base
    model's sampling defaults from ``base_generation``), and the tokenizer (when given), its added
    tokens recorded in ``tokenizer_config.json`` too (:func:`rayft.data.tokenizer.record_added_tokens`:
    the chat, eval and serving loads of the directory skip a Python parse of ``tokenizer.json``)."""
    from transformers import AutoModelForCausalLM

    from rayft.data.tokenizer import record_added_tokens
    from rayft.train.generation import export_generation_config

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    conf = skeleton.config
    conf.use_cache = True  # training runs without the KV cache; generation wants it
    conf.architectures = [type(skeleton).__name__]
    export_generation_config(tokenizer, conf, base_generation, say=say).save_pretrained(out)
    conf.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        record_added_tokens(Path(out))


def run_base_generation(run_dir: Path, say: Callable[[str], None] | None = None):
    """The generation config of the model a run fine-tuned (``model.name_or_path`` in its
    ``rayft.yaml``; :func:`rayft.train.generation.base_generation_config`), None without one."""
    import yaml

    from rayft.train.generation import base_generation_config

    try:
        model = (yaml.safe_load((run_dir / "rayft.yaml").read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError):
        return None
    name = model.get("name_or_path")
    return base_generation_config(name, model.get("revision"), say=say or say_to_stderr) if name else None

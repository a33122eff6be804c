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
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
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
    MODEL_AND_OPTIMIZER,
    MODEL_ONLY,
    STATE_FILE,
    CheckpointCheck,
    checkpoint_dirs,
    directory_bytes,
    find_checkpoints,
    free_space_warning,
    holds_optimizer,
    is_complete,
    last_checkpoint_bytes,
    newest_intact,
    read_state,
    step_of_dir,
    verify_checkpoint,
)
from rayft.train.digests import ALGORITHM, file_digest, merge
from rayft.train.hashing_writer import HashingFileSystemWriter
from rayft.train.staging_buffers import BackgroundStaging


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


def on_gpu(model) -> bool:
    """Whether ``model`` trains on CUDA (not whether the host has a GPU: CPU workers may run on one)."""
    return next(model.parameters()).device.type == "cuda"


class CheckpointWriter:
    """Decides when to checkpoint (every N steps and/or M minutes) and writes + reports one.

    On a local or shared file system the shards go straight into the run directory and are handed
    to Ray Train without a copy (``CheckpointUploadMode.NO_UPLOAD``); elsewhere (``s3://``) they go
    to a local temporary directory that Ray Train uploads. Ray Train keeps the last
    ``keep_last`` *registered* checkpoints, and registers one only after every rank reported it, so
    the only complete checkpoint is never deleted for an unfinished one.

    With ``async_save`` the step loop is blocked only while the shards are copied to (reused,
    pinned) CPU buffers; a background thread writes them (``torch.distributed.checkpoint.async_save``
    over a separate gloo process group, so its collectives never interleave with training's NCCL
    ones). The checkpoint is *finalised* — state file written by rank 0, reported to Ray Train —
    at the first step boundary where every rank's write has finished (:meth:`finalize_if_done`),
    before the next save starts, or at :meth:`wait`. Until then it is incomplete and never resumed.

    Digests: each rank's writer threads hash the bytes of the file each of them writes as it writes
    them (:class:`~rayft.train.hashing_writer.HashingFileSystemWriter`: BLAKE2b-128; a save costs 1.5 CPU
    seconds per GB more on this project's CPU test machine, spread over the writer threads where
    cores are idle; no file is read back), so with ``async_save`` the hashing runs in the background
    write, off the step loop; in sync mode it adds to the save's time. At finalisation the ranks'
    digests (a few hundred bytes each) are gathered to rank 0 over the gloo group, and rank 0
    records them in the state file with ``config.json``'s.

    Before a save, rank 0 warns when the target's file system has less free space than the last
    checkpoint took (this writer's last one, else the newest in the run directory). A failed write
    (e.g. ENOSPC) removes its partial directory on every rank, then raises.
    """

    def __init__(self, ccfg, model_config):
        self.every_steps, self.every_minutes = ccfg.every_steps, ccfg.every_minutes
        self.model_config = model_config
        self.last_save = time.monotonic()
        self.async_save = ccfg.async_save
        self.periodic_async = ccfg.periodic_async
        self.write_threads = ccfg.write_threads
        # collective (every rank): async saves' DCP collectives and every save's digest gather run on it
        self._pg = dist.new_group(backend="gloo")
        self._writer: HashingFileSystemWriter | None = None
        self._staging: BackgroundStaging | None = None  # pinned buffers being allocated (see prestage)
        self._buffers_alloc_s: float | None = None  # how long that allocation took, off the loop; reported once
        self._pending: dict | None = None
        self._last_bytes: int | None = None  # the size of the last checkpoint this writer finished (rank 0)

    def _new_writer(self, path: str, cache: bool) -> HashingFileSystemWriter:
        """A DCP file-system writer hashing what it writes: ``write_threads`` files per rank written
        in parallel (fsync'd), with reusable pinned staging buffers when ``cache``."""
        return HashingFileSystemWriter(path, thread_count=self.write_threads, cache_staged_state_dict=cache)

    def model_only_writer(self, path: str) -> HashingFileSystemWriter:
        """The writer of a model-only async save into ``path``: when the periodic saves' reused
        pinned buffers exist, it stages into their model part: for the 1.5B preset on one H200,
        0.18 s for its fp32 weights (bench/results/2026-12-04-wall-time-final-model-only-pinned-1xh200.json),
        where a fresh copy into pageable memory took 4.7-4.8 s
        (bench/results/2026-12-04-wall-time-final-model-only-1xh200.json); else into plain host
        memory, as any one-off save does. Call after the buffers were taken (:meth:`save` does)."""
        cache = self._writer.state_dict_cache if self._writer is not None else None
        writer = self._new_writer(path, cache=cache is not None)
        if cache is not None:
            writer.state_dict_cache = {"model": cache["model"]}  # the same tensors: copied into, not reallocated
        return writer

    def step_is_due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def time_is_due(self) -> bool:
        return bool(self.every_minutes) and (time.monotonic() - self.last_save) >= 60 * self.every_minutes

    def prestage(self, model, optimizer) -> float | None:
        """Start allocating the reusable pinned CPU buffers of async saves (GPU, async only) on a
        background thread (:class:`~rayft.train.staging_buffers.BackgroundStaging`), so that the
        step loop goes on meanwhile; the first save takes them, waiting for what is left (that wait
        is its ``buffers_wait_s``). Call once the optimizer has state (after the first step).
        Returns the seconds the loop spent here (capturing the state's structure), or None when
        there is nothing to do (:meth:`reuses_pinned_buffers` is false, or they exist)."""
        if not self.reuses_pinned_buffers(model) or self._writer is not None:
            return None
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, optimizer)
        self._writer = self._new_writer(tempfile.gettempdir(), cache=True)
        self._staging = BackgroundStaging({"model": msd, "optim": osd})
        return time.perf_counter() - t0

    def _take_staging_buffers(self, needed: bool = True) -> None:
        """Hand the background-allocated buffers to the writer's stager (DCP's
        ``BlockingAsyncStager.state_dict_cache``, which its ``stage`` copies into), waiting for them.
        Raises the allocation's error (e.g. out of host memory) when ``needed``; when not (the run's
        end, no save to come), prints it as a warning instead."""
        if self._staging is None:
            return
        staging, self._staging = self._staging, None
        try:
            self._writer.state_dict_cache = staging.result()
        except Exception as e:
            if needed:
                raise
            _to_stderr(f"[rayft] warning: the async saves' staging buffers could not be allocated ({e}); no save needed them")
            return
        self._buffers_alloc_s = staging.finished - staging.started

    def reuses_pinned_buffers(self, model) -> bool:
        """Async saves stage into reusable pinned host buffers: only on a GPU and only with periodic
        saves (``every_steps``/``every_minutes``). Pinning a copy of the rank's whole state (12 bytes
        per parameter: fp32 weights and AdamW's two moments) costs seconds (18.5 GB: 3.3 s registered,
        bench/results/2026-12-02-staging-alloc-1xh200.json) and holds that host memory for the rest
        of the run, which a run that saves once (the final or a signal's
        checkpoint) or never would pay for nothing: ~178 s of the Mistral-7B run's wall time on one
        H200 went unaccounted after its first step with no checkpoint configured
        (bench/results/2026-12-02-families-mistral-7b-v0.3-1xh200.json). A one-off save stages into
        plain host memory instead."""
        return self.periodic_async and on_gpu(model)

    def local_write_done(self) -> bool:
        """This rank's background write has finished (or none is in flight)."""
        return self._pending is None or self._pending["future"].done()

    def save(self, model, optimizer, state: dict, metrics: dict, model_only: bool = False) -> list[dict]:
        """Collective: checkpoint now. Returns the timings (seconds) of every checkpoint this call
        finished: in sync mode this one (``save_s`` DCP write, ``report_s`` hand-off/upload,
        ``blocked_s`` both); in async mode the previous one if it was still in flight (see
        :meth:`_finalize`), while this one's timings come from a later call. ``model_only``: the
        model's weights without the optimizer's state (the state file's ``contents`` says which),
        staged as :meth:`model_only_writer` says."""
        import pyarrow.fs
        import ray.train

        t_buffers = time.perf_counter()
        self._take_staging_buffers()
        buffers_wait_s = time.perf_counter() - t_buffers  # the first save after prestage: what was left of it
        done = self.wait()  # at most one save in flight
        if done and done[0]["finalize_wait_s"] > 1.0 and dist.get_rank() == 0:
            print(
                f"[rayft] warning: checkpoint {state['step']} waited {done[0]['finalize_wait_s']:.1f} s for the previous "
                "one's write: the checkpoint interval is shorter than a save takes on this storage",
                flush=True,
            )
        t0 = time.perf_counter()
        name = f"checkpoint_{state['step']:07d}"
        storage = ray.train.get_context().get_storage()
        local = isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem)
        path = os.path.join(storage.experiment_fs_path, name) if local else tempfile.mkdtemp(prefix="rayft-ckpt-")
        if dist.get_rank() == 0:
            if local:
                shutil.rmtree(path, ignore_errors=True)  # leftovers of an interrupted save
            self._warn_if_no_room(path, local, state["step"])
        if local:
            dist.barrier()
        state = {**state, "contents": MODEL_ONLY if model_only else MODEL_AND_OPTIMIZER}
        if model_only:
            shards = {"model": get_model_state_dict(model)}
        else:
            msd, osd = get_state_dict(model, optimizer)
            shards = {"model": msd, "optim": osd}
        if self.async_save:
            if model_only:
                writer = self.model_only_writer(path)
            else:
                if self._writer is None:
                    # periodic saves on a GPU: reusable pinned buffers (fast copies from the second save on); else plain copies
                    self._writer = self._new_writer(path, cache=self.reuses_pinned_buffers(model))
                writer = self._writer
            future = async_save_shards(shards, path, writer, self._pg)
            self._pending = {
                "future": future,
                "writer": writer,
                "path": path,
                "local": local,
                "name": name,
                "state": state,
                "metrics": metrics,
                "t0": t0,
                "stage_s": time.perf_counter() - t0,
                "buffers_wait_s": buffers_wait_s,
                "buffers_alloc_s": self._buffers_alloc_s,
            }
            self._buffers_alloc_s = None
            self.last_save = time.monotonic()
            return done
        writer = self._new_writer(path, cache=False)
        try:
            save_shards(shards, path, writer)
            t1 = time.perf_counter()
            self._finish(path, local, name, state, metrics, writer.digests)
        finally:
            if not local:
                shutil.rmtree(path, ignore_errors=True)
        self.last_save = time.monotonic()
        t2 = time.perf_counter()
        timing = {"step": state["step"], "mode": "sync", "save_s": t1 - t0, "report_s": t2 - t1, "blocked_s": t2 - t0}
        return done + [{**timing, "contents": state["contents"]}]

    def finalize_if_done(self, all_ranks_done: bool) -> list[dict]:
        """Collective: finalise the in-flight checkpoint when every rank's write has finished
        (``all_ranks_done``, agreed by an all-reduce of :meth:`local_write_done`). Returns its timings."""
        if self._pending is None or not all_ranks_done:
            return []
        return self.wait()

    def wait(self) -> list[dict]:
        """Collective: block until the in-flight checkpoint is written, then finalise it; its timings.
        Also waits for staging buffers still being allocated (a run that ends before its first save:
        their failure is then only a warning)."""
        self._take_staging_buffers(needed=False)
        return [self._finalize()] if self._pending is not None else []

    def _finalize(self) -> dict:
        """Timings in seconds of an async checkpoint: ``stage_s`` (the loop blocked while shards were
        copied to CPU memory), ``buffers_wait_s`` (the first save's wait for the staging buffers still
        being allocated, see :meth:`prestage`; ~0 otherwise), ``buffers_alloc_s`` (on that save, how
        long their allocation took on its thread, else None), ``save_s`` (start of the save until every shard was on storage, an upper
        bound: measured when the loop looked), ``finalize_wait_s`` (the loop blocked waiting for the
        write; 0 when it had finished), ``finalize_s`` (that wait + state file + Ray report) and
        ``blocked_s`` = ``buffers_wait_s`` + ``stage_s`` + ``finalize_s``, all the step loop lost to
        this checkpoint; ``contents`` as in the state file."""
        p, self._pending = self._pending, None
        t_wait = time.perf_counter()
        try:
            p["future"].result()  # raises the background write's error, if any (its directory is gone then)
            written = time.perf_counter()
            self._finish(p["path"], p["local"], p["name"], p["state"], p["metrics"], p["writer"].digests)
        finally:
            if not p["local"]:
                shutil.rmtree(p["path"], ignore_errors=True)
        done = time.perf_counter()
        return {
            "step": p["state"]["step"],
            "mode": "async",
            "stage_s": p["stage_s"],
            "buffers_wait_s": p["buffers_wait_s"],
            "buffers_alloc_s": p["buffers_alloc_s"],
            "save_s": written - p["t0"],
            "finalize_wait_s": written - t_wait,
            "finalize_s": done - t_wait,
            "blocked_s": p["buffers_wait_s"] + p["stage_s"] + done - t_wait,
            "contents": p["state"]["contents"],
        }

    def _warn_if_no_room(self, path: str, local: bool, step: int) -> None:
        """Rank 0, before a save: print a warning when the last checkpoint would not fit beside ``path``."""
        need = self._last_bytes
        if need is None and local:
            need = last_checkpoint_bytes(os.path.dirname(path))
        if need and (warning := free_space_warning(os.path.dirname(path), need)):
            print(f"[rayft] WARNING: checkpoint {step}: {warning}", flush=True)

    def _finish(self, path: str, local: bool, name: str, state: dict, metrics: dict, digests: dict[str, str]) -> None:
        """Collective: gather every rank's file digests to rank 0, which writes the state file (the
        checkpoint is complete from then on); then report the checkpoint to Ray Train."""
        import ray.train

        rank = dist.get_rank()
        gathered: list | None = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(digests, gathered, dst=0, group=self._pg)
        if rank == 0:
            write_state(path, state, self.model_config, merge(gathered))
            self._last_bytes = directory_bytes(path)
        dist.barrier()
        if local:
            storage = ray.train.get_context().get_storage()
            ckpt = ray.train.Checkpoint(path, filesystem=storage.storage_filesystem)
            ray.train.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD)
        else:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(path), checkpoint_dir_name=name)


def _to_stderr(msg: str) -> None:
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
        (say or _to_stderr)(f"note: {check.remark()}")
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
    model's sampling defaults from ``base_generation``), and the tokenizer (when given)."""
    from transformers import AutoModelForCausalLM

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
    return base_generation_config(name, model.get("revision"), say=say or _to_stderr) if name else None

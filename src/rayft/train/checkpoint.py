"""Sharded checkpoints (torch.distributed.checkpoint) and the Hugging Face export.

A checkpoint directory holds every rank's DCP shards of ``{"model", "optim"}`` plus
``rayft_state.json`` (step, epoch, world size, loss) and the model's ``config.json``, written by
rank 0 *last*: a directory without ``rayft_state.json`` is incomplete and is never resumed or
exported. Ray Train collects the directory of every rank into one checkpoint on the run's storage.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

STATE_FILE = "rayft_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint or run directory that cannot be used; the message names the path."""


def write_state(path: str, state: dict, model_config) -> None:
    """The model's ``config.json``, then the state file, atomically (last: it marks the checkpoint complete)."""
    model_config.to_json_file(os.path.join(path, "config.json"))
    tmp = os.path.join(path, STATE_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, os.path.join(path, STATE_FILE))


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a finished checkpoint: the state file (written last), the DCP
    metadata, and every shard file the metadata names, each at least as long as its data."""
    path = Path(path)
    if not (path / STATE_FILE).is_file() or not (path / ".metadata").is_file():
        return False
    try:
        meta = dcp.FileSystemReader(str(path)).read_metadata()
    except Exception:
        return False
    need: dict[str, int] = {}
    for info in (meta.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    return all((path / f).is_file() and (path / f).stat().st_size >= n for f, n in need.items())


def read_state(path: str | os.PathLike) -> dict:
    with open(Path(path) / STATE_FILE) as f:
        return json.load(f)


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> dict:
    """Collective: load model and optimizer shards from ``path`` (any saved world size) and return
    its state dict (``step``, ``world_size``, ...).

    Raises:
        CheckpointError: an incomplete checkpoint directory.
    """
    if not is_complete(path):
        raise CheckpointError(f"{path}: incomplete checkpoint (no {STATE_FILE} or .metadata)")
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return read_state(path)


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


def write_hf_model(state_dict: dict[str, torch.Tensor], model_config, tokenizer, out: str | os.PathLike) -> Path:
    """Write a Hugging Face model directory (safetensors, config, tokenizer + chat template),
    atomically: the files go to ``out.tmp`` which is then renamed to ``out``."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    if getattr(model_config, "tie_word_embeddings", False):
        model.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise CheckpointError(f"{out}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.config.use_cache = True
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def resolve_resume_dir(ray_checkpoint, chosen: str | None, run_dir: str) -> str | None:
    """The checkpoint directory to resume from, or None to start fresh.

    On a local or shared file system that is the newest *complete* checkpoint in the run
    directory (the state file is written last, after every rank's shards and the DCP metadata):
    it may be newer than Ray Train's latest registered one when a worker died between writing and
    registering, so a failure costs at most one checkpoint interval; an incomplete newest one is
    skipped with a warning. A new run's directory holds no checkpoint (the driver refuses to
    reuse one), so anything found belongs to this run. On object storage (``s3://``) it is Ray
    Train's latest checkpoint (``ray_checkpoint``), downloaded, else ``chosen`` (``--resume``).

    Raises:
        CheckpointError: Ray handed over a checkpoint but no complete one exists.
    """
    if "://" in run_dir:
        if ray_checkpoint is None:
            return chosen
        path = ray_checkpoint.to_directory()
        if not is_complete(path):
            raise CheckpointError(f"{ray_checkpoint.path}: incomplete checkpoint")
        return path
    complete = find_checkpoints(run_dir)
    for d in sorted(Path(run_dir).glob("checkpoint_*")):
        if complete and d.name > complete[-1][1].name and not is_complete(d):
            print(f"[rayft] WARNING: {d} is incomplete (interrupted save?); using {complete[-1][1]}", flush=True)
    if complete:
        return str(complete[-1][1])
    if ray_checkpoint is not None or chosen is not None:
        raise CheckpointError(f"{run_dir}: no complete checkpoint to resume from")
    return None


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
    """

    def __init__(self, ccfg, model_config):
        self.every_steps, self.every_minutes = ccfg.every_steps, ccfg.every_minutes
        self.model_config = model_config
        self.last_save = time.monotonic()
        self.async_save = ccfg.async_save
        self.write_threads = ccfg.write_threads
        self._pg = dist.new_group(backend="gloo") if self.async_save else None  # collective: every rank
        self._writer = None
        self._pending: dict | None = None

    def _new_writer(self, path: str, cache: bool) -> dcp.FileSystemWriter:
        """A DCP file-system writer: ``write_threads`` files per rank written in parallel (fsync'd),
        with reusable pinned staging buffers when ``cache``."""
        return dcp.FileSystemWriter(path, thread_count=self.write_threads, cache_staged_state_dict=cache)

    def step_is_due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def time_is_due(self) -> bool:
        return bool(self.every_minutes) and (time.monotonic() - self.last_save) >= 60 * self.every_minutes

    def prestage(self, model, optimizer) -> float | None:
        """Allocate the reusable pinned CPU buffers of async saves now (GPU, async only), so that
        no later save pays for the allocation inside the step loop. Call once the optimizer has
        state (after the first step). Returns the seconds it took, or None when there is nothing to do."""
        if not self.async_save or not torch.cuda.is_available() or self._writer is not None:
            return None
        t0 = time.perf_counter()
        msd, osd = get_state_dict(model, optimizer)
        self._writer = self._new_writer(tempfile.gettempdir(), cache=True)
        self._writer.stage({"model": msd, "optim": osd})  # fills the cache; save() reuses it
        return time.perf_counter() - t0

    def local_write_done(self) -> bool:
        """This rank's background write has finished (or none is in flight)."""
        return self._pending is None or self._pending["future"].done()

    def save(self, model, optimizer, state: dict, metrics: dict) -> list[dict]:
        """Collective: checkpoint now. Returns the timings (seconds) of every checkpoint this call
        finished: in sync mode this one (``save_s`` DCP write, ``report_s`` hand-off/upload,
        ``blocked_s`` both); in async mode the previous one if it was still in flight (see
        :meth:`_finalize`), while this one's timings come from a later call."""
        import pyarrow.fs
        import ray.train

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
        if local:
            if dist.get_rank() == 0:
                shutil.rmtree(path, ignore_errors=True)  # leftovers of an interrupted save
            dist.barrier()
        msd, osd = get_state_dict(model, optimizer)
        if self.async_save:
            if self._writer is None:
                # GPU: reusable pinned CPU buffers (fast copies from the second save on); CPU: plain copies.
                self._writer = self._new_writer(path, cache=torch.cuda.is_available())
            try:
                future = dcp.async_save(
                    {"model": msd, "optim": osd}, checkpoint_id=path, storage_writer=self._writer, process_group=self._pg
                )
            except BaseException:
                if not local:
                    shutil.rmtree(path, ignore_errors=True)
                raise
            self._pending = {
                "future": future,
                "path": path,
                "local": local,
                "name": name,
                "state": state,
                "metrics": metrics,
                "t0": t0,
                "stage_s": time.perf_counter() - t0,
            }
            self.last_save = time.monotonic()
            return done
        try:
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path, storage_writer=self._new_writer(path, cache=False))
            t1 = time.perf_counter()
            self._finish(path, local, name, state, metrics)
        finally:
            if not local:
                shutil.rmtree(path, ignore_errors=True)
        self.last_save = time.monotonic()
        t2 = time.perf_counter()
        return done + [{"step": state["step"], "mode": "sync", "save_s": t1 - t0, "report_s": t2 - t1, "blocked_s": t2 - t0}]

    def finalize_if_done(self, all_ranks_done: bool) -> list[dict]:
        """Collective: finalise the in-flight checkpoint when every rank's write has finished
        (``all_ranks_done``, agreed by an all-reduce of :meth:`local_write_done`). Returns its timings."""
        if self._pending is None or not all_ranks_done:
            return []
        return self.wait()

    def wait(self) -> list[dict]:
        """Collective: block until the in-flight checkpoint is written, then finalise it; its timings."""
        return [self._finalize()] if self._pending is not None else []

    def _finalize(self) -> dict:
        """Timings in seconds of an async checkpoint: ``stage_s`` (the loop blocked while shards were
        copied to CPU memory), ``save_s`` (start of the save until every shard was on storage, an upper
        bound: measured when the loop looked), ``finalize_wait_s`` (the loop blocked waiting for the
        write; 0 when it had finished), ``finalize_s`` (that wait + state file + Ray report) and
        ``blocked_s`` = ``stage_s`` + ``finalize_s``, all the step loop lost to this checkpoint."""
        p, self._pending = self._pending, None
        t_wait = time.perf_counter()
        try:
            p["future"].result()  # raises the background write's error, if any
            written = time.perf_counter()
            self._finish(p["path"], p["local"], p["name"], p["state"], p["metrics"])
        finally:
            if not p["local"]:
                shutil.rmtree(p["path"], ignore_errors=True)
        done = time.perf_counter()
        return {
            "step": p["state"]["step"],
            "mode": "async",
            "stage_s": p["stage_s"],
            "save_s": written - p["t0"],
            "finalize_wait_s": written - t_wait,
            "finalize_s": done - t_wait,
            "blocked_s": p["stage_s"] + done - t_wait,
        }

    def _finish(self, path: str, local: bool, name: str, state: dict, metrics: dict) -> None:
        import ray.train

        if dist.get_rank() == 0:
            write_state(path, state, self.model_config)
        dist.barrier()
        if local:
            storage = ray.train.get_context().get_storage()
            ckpt = ray.train.Checkpoint(path, filesystem=storage.storage_filesystem)
            ray.train.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD)
        else:
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(path), checkpoint_dir_name=name)


def find_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first. Incomplete ones are skipped."""
    out = []
    for d in Path(run_dir).glob("checkpoint_*"):
        if d.is_dir() and is_complete(d):
            out.append((int(read_state(d)["step"]), d))
    return sorted(out)


def export_run(run: str, step: int | None = None, out: str | os.PathLike | None = None) -> Path:
    """Consolidate a run's checkpoint into a Hugging Face model (single process, CPU).

    Raises:
        CheckpointError: no such run, no complete checkpoint, or no checkpoint at ``step``.
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
    conf = AutoConfig.from_pretrained(ckpt)
    state = read_state(ckpt)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    sd = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in skeleton.state_dict().items()}
    if getattr(conf, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    dcp.load({"model": sd}, checkpoint_id=str(ckpt), no_dist=True)
    tokenizer = load_tokenizer(state["tokenizer"]) if state.get("tokenizer") else None
    return write_hf_model(sd, conf, tokenizer, out or run_dir / f"hf-step{step}")

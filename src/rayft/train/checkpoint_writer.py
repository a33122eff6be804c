"""The training loop's checkpoint writer: when a checkpoint is due (every N steps and/or M
minutes, and the run's last step), and one save written, finalised and reported to Ray Train
(:class:`CheckpointWriter`). The checkpoint's files, its state file and its loading are
:mod:`rayft.train.checkpoint`'s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

from rayft.train.checkpoint import async_save_shards, save_shards, say_to_stderr, write_state
from rayft.train.checkpoint_files import (
    MODEL_AND_OPTIMIZER,
    MODEL_ONLY,
    directory_bytes,
    free_space_warning,
    last_checkpoint_bytes,
)
from rayft.train.digests import merge
from rayft.train.hashing_writer import HashingFileSystemWriter
from rayft.train.staging_buffers import BackgroundStaging


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
            say_to_stderr(f"[rayft] warning: the async saves' staging buffers could not be allocated ({e}); no save needed them")
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

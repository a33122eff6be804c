"""What every Ray Train worker runs: set up, then step, report, evaluate and checkpoint.

:func:`train_func` is the whole run on one screen; the step itself is
:func:`rayft.train.step.launch_step`, the set-up :func:`setup_worker`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from rayft.config import RayftConfig
from rayft.data.packing import StepPlan, collate, packing_rule, rank_micro_batches
from rayft.train import checkpoint as ckpt_lib
from rayft.train.checkpoint_files import holds_optimizer, model_only_refusal, read_state
from rayft.train.checkpoint_writer import CheckpointWriter
from rayft.train.device import cap_gpu_memory
from rayft.train.evaluate import Evaluator
from rayft.train.events import CheckpointEvent, ProgressChannel, ResumedEvent, StepEvent, StoppedEvent
from rayft.train.export import export_and_verify, prepare_export
from rayft.train.metrics import flops_per_token, gpu_peak_flops, mfu
from rayft.train.model import ShardedModel, build_sharded_model, load_model_config, matmul_params, use_compile_cache_dir
from rayft.train.optim import build_optimizer, lr_at, set_lr
from rayft.train.profiling import StepProfiler
from rayft.train.step import (
    COUNT_KEYS,
    GlobalCounts,
    PendingStep,
    StepClock,
    StepResult,
    global_counts,
    launch_step,
    micro_batch_loss,
)
from rayft.train.stop import StopPoll
from rayft.train.worker_args import WorkerArgs


@dataclass
class Worker:
    """One worker's run after set-up: its config, place, data, model, optimizer and helpers."""

    args: WorkerArgs
    cfg: RayftConfig
    rank: int
    world: int
    device: torch.device
    data: Any  # TokenizedDataset
    plan: StepPlan  # the driver's, for this world size
    model: ShardedModel
    model_conf: Any  # transformers PretrainedConfig
    optimizer: torch.optim.Optimizer
    saver: CheckpointWriter
    evaluator: Evaluator
    progress: ProgressChannel  # silent on every rank but 0
    start_step: int
    setup_timings: dict[str, float]  # seconds: setup_s, setup_model_build_s
    gpu_name: str  # "cpu" on CPU workers
    peak_flops: float | None  # the GPU's dense bf16 peak, FLOP/s (None: unknown, or CPU)
    matmul_params: int  # parameters in matrix products (MFU's N)
    stop: StopPoll  # rank 0's view of the run's stop flag (never set on the other ranks)
    counts_group: Any  # the gloo group of the steps' counts and votes (None on one rank)
    profiler: StepProfiler  # train.profile_steps (inactive when unset)
    saved_step: int = 0  # steps held by the newest checkpoint (resumed or saved; 0: none)

    @property
    def total_steps(self) -> int:
        return len(self.plan)

    def batches(self, step: int) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of ``step``, on the device but for the counts' scalars
        (:data:`rayft.train.step.COUNT_KEYS`), which stay on the host for :func:`global_counts`. On a
        GPU the host tensors are pinned first, so the copies are queued behind the device's work
        instead of waiting for it."""
        tc, dc = self.cfg.train, self.cfg.data
        micro = rank_micro_batches(self.plan.step_rows(step), self.rank, self.world, tc.micro_batch_size, tc.grad_accum_steps)
        min_rows = tc.micro_batch_size if dc.packing else 1
        pin = self.device.type == "cuda"
        return [
            {
                k: v if k in COUNT_KEYS else (v.pin_memory() if pin else v).to(self.device, non_blocking=True)
                for k, v in collate(self.data, rows, dc.seq_len, self.args.pad_id, fixed_len=dc.packing, min_rows=min_rows).items()
            }
            for rows in micro
        ]

    def checkpoint_is_due(self, step_done: int, time_vote: float) -> bool:
        final = step_done == self.total_steps and self.cfg.checkpoint.save_final
        return final or self.saver.step_is_due(step_done) or time_vote > 0

    def report_is_due(self, step: int, metrics: dict) -> bool:
        """Send this step to the driver? Every ``train.log_every`` steps, the first step (it
        carries the one-off set-up timings), the last one and every step with an evaluation."""
        step_done = step + 1
        first_or_last = step == self.start_step or step_done == self.total_steps
        return step_done % self.cfg.train.log_every == 0 or first_or_last or "eval_loss" in metrics

    def checkpoint_state(self, step: int, loss: float) -> dict[str, Any]:
        """The state file's fields for a checkpoint after ``step`` (0-based)."""
        tc = self.cfg.train
        return {
            "step": step + 1,
            "epoch": self.plan.epoch(step),
            "world_size": self.world,
            "loss": loss,
            "global_batch_rows": self.world * tc.micro_batch_size * tc.grad_accum_steps,
            "packing": packing_rule(self.cfg.data.packing),
            "data_fingerprint": self.args.data_fingerprint,
            "tokenizer": self.args.tokenizer,
        }


@dataclass
class LaunchedStep:
    """A step whose kernels are queued (:func:`launch_step`), with what its record needs."""

    step: int  # 0-based
    lr: float
    counts: GlobalCounts
    data_s: float  # host seconds before its launch: the counts (and its rows, where made then)
    pending: PendingStep


def train_func(loop_config: dict[str, Any], start_unix: dict[str, float] | None = None) -> None:
    """The Ray Train worker's run (from :func:`rayft.train.worker_entry.train_func`); ``loop_config``
    carries a :class:`WorkerArgs`. ``start_unix``: the worker's start, wall clock (unix s), recorded
    in the first step's metrics for the driver's timeline: ``worker_entry_unix`` (the worker was ready:
    the loop imported) and ``worker_args_unix`` (its arguments arrived); both now when not given.

    Each step is queued before the previous one is finished (its loss read, its record made and
    sent), so that the device never waits for the host between two steps: ~3 ms a step on one
    GPU, where the records and the next step's start ran with the device idle (bench/NOTES.md §33,
    §38). A step after which something reads the weights or the run's state (a checkpoint, an
    evaluation, the profiler's window, the first and last steps) is finished before the next is
    queued (:func:`must_finish_now`). Over several ranks the next step's counts and votes are
    all-reduced on the host (a gloo group of their own), so they do not wait for the step in flight.
    """
    now = time.time()
    start_unix = {"worker_entry_unix": now, "worker_args_unix": now} | (start_unix or {})
    w = setup_worker(WorkerArgs.from_loop_config(loop_config))
    if w.rank == 0 and w.profiler.window and w.start_step >= w.profiler.window[1]:
        print(
            f"[rayft] train.profile_steps {list(w.profiler.window)}: this run starts after step {w.start_step}: nothing to trace",
            flush=True,
        )
    clock = StepClock(device_marks=w.device.type == "cuda")
    last: tuple[int, float, dict] | None = None  # the last finished step: (0-based index, loss, metrics), for a stop's checkpoint
    in_flight: LaunchedStep | None = None  # queued, not yet finished
    t_top = time.perf_counter()  # the first step's rows are made here: its data_s
    batches: list[dict[str, torch.Tensor]] | None = w.batches(w.start_step) if w.start_step < w.total_steps else []
    for step in range(w.start_step, w.total_steps):
        if step > w.start_step:
            t_top = time.perf_counter()
        lr = lr_at(step, w.total_steps, w.cfg.train)
        set_lr(w.optimizer, lr)  # read by the optimizer as this step is queued (a float: the step in flight has its own)
        if batches is None:  # making them during the previous step failed: again here, where an error stops the run
            batches = w.batches(step)
        counts = global_counts(
            batches, w.rank == 0 and w.saver.time_is_due(), w.saver.local_write_done(), w.counts_group, w.stop.requested()
        )
        report_checkpoints(w.saver.finalize_if_done(counts.writes_done == w.world), w.progress)  # a background save that finished
        if counts.stop_vote > 0:  # every rank agreed: abandon this step, keep the finished ones
            if in_flight is not None:
                last = finish_step(w, in_flight, clock, start_unix)
            return stop_early(w, last)
        data_s = time.perf_counter() - t_top
        w.profiler.before(step + 1)
        launched = LaunchedStep(
            step, lr, counts, data_s, launch_step(w.model, w.optimizer, batches, counts.trainable, w.cfg.train.max_grad_norm)
        )
        if in_flight is not None:  # the previous step's loss and record, while the device runs this one
            last = finish_step(w, in_flight, clock, start_unix)
            in_flight = None
        # a CPU step ran whole inside launch_step: nothing to overlap
        finish_now = launched.pending.copied is None or must_finish_now(w, step, counts)
        if step + 1 < w.total_steps:  # the next step's rows, made and copied while the device runs this one
            try:
                batches = w.batches(step + 1)
            except Exception:  # made again at the next step's start, where an error stops the run: this step is recorded first
                batches, finish_now = None, True
        if finish_now:
            last = finish_step(w, launched, clock, start_unix)
        else:
            in_flight = launched
    export_inputs = None
    try:  # while the last checkpoint is written: what the export needs that is none of its files
        if w.cfg.checkpoint.export_hf:
            export_inputs = prepare_export(w.model, w.data, w.cfg, w.args, w.device)
    finally:
        report_checkpoints(w.saver.wait(), w.progress)  # the last save must be complete before the run ends or the export starts
    if export_inputs is not None:
        export_and_verify(w.model, w.model_conf, w.cfg, w.args, w.device, w.progress, export_inputs)


def must_finish_now(w: Worker, step: int, counts: GlobalCounts) -> bool:
    """Finish ``step`` (0-based) before the next is queued? Where the next would change what is read
    after it: a checkpoint or an evaluation after it, the profiler's window around it; and the
    first step (its set-up timings and the checkpoints' one-off staging) and the last."""
    done = step + 1
    return (
        step == w.start_step
        or done == w.total_steps
        or w.checkpoint_is_due(done, counts.time_vote)
        or w.evaluator.is_due(done, w.total_steps)
        or w.profiler.covers(done)
        or w.profiler.covers(done + 1)
    )


def finish_step(w: Worker, launched: LaunchedStep, clock: StepClock, start_unix: dict[str, float]) -> tuple[int, float, dict]:
    """Wait for a queued step, then record, report, evaluate and checkpoint it as due; returns it as
    the last finished step (0-based index, loss, metrics). ``start_unix``: :func:`train_func`'s,
    added to the first step's metrics.

    Raises:
        FloatingPointError: its loss is not finite.
    """
    step, result = launched.step, launched.pending.result()
    timings = {"data_s": launched.data_s, "fwd_bwd_s": result.fwd_bwd_s, "optim_s": result.optim_s}
    step_time = clock.lap(launched.pending.events[-1] if launched.pending.events else None)
    if (traces := w.profiler.after(step + 1)) is not None:
        clock.skip()  # writing the trace is not step time
        if w.rank == 0:
            print(f"[rayft] profile of steps {w.profiler.first_traced}-{step + 1}: every rank's trace in {traces}", flush=True)
    if step == w.start_step:
        timings.update(w.setup_timings)
        if (staged := w.saver.prestage(w.model.module, w.optimizer)) is not None:
            timings["prestage_s"] = staged  # one-off: pinned buffers for async checkpoint saves
            clock.skip()
    metrics = step_record(w, step, launched.lr, result, launched.counts, step_time, timings)
    if step == w.start_step:
        metrics.update(start_unix)
    if w.profiler.covers(step + 1):
        metrics["profiled"] = True
    if not math.isfinite(result.loss):
        raise FloatingPointError(f"loss is {result.loss} at step {step + 1}")
    if w.evaluator.is_due(step + 1, w.total_steps):
        metrics.update(w.evaluator(w.model))  # eval_loss, eval_tokens
        clock.skip()  # evaluation time is not step time
    if w.report_is_due(step, metrics):  # the last step's metrics must reach the driver before the worker exits
        w.progress.send(StepEvent(metrics), wait=step + 1 == w.total_steps)
    if w.checkpoint_is_due(step + 1, launched.counts.time_vote):
        model_only = step + 1 == w.total_steps and w.cfg.checkpoint.final_model_only
        saved = w.saver.save(w.model.module, w.optimizer, w.checkpoint_state(step, result.loss), metrics, model_only=model_only)
        report_checkpoints(saved, w.progress)
        w.saved_step = step + 1
        clock.skip()  # checkpoint time is not step time
    return step, result.loss, metrics


def setup_worker(args: WorkerArgs) -> Worker:
    """Collective: everything before the first step — device and memory cap, data, the driver's
    step plan, the sharded model and its weights, optimizer, resume, the checkpoint writer and the
    initial evaluation. ``setup_timings``: ``setup_s`` (this function, seconds) and
    ``setup_model_build_s`` (model build and weight broadcast).

    Raises:
        RuntimeError: the plan was made for another global batch than this worker group's.
    """
    t_enter = time.perf_counter()
    cfg = args.parsed_config()
    tc = cfg.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if tc.compile and tc.compile_cache_dir:  # before the first compile: Inductor reads it at every use
        use_compile_cache_dir(os.path.expanduser(tc.compile_cache_dir), say=print if rank == 0 else None)
    if tc.gpu_memory_limit_gib is not None:
        cap_gpu_memory(device, tc.gpu_memory_limit_gib)
    data = ray.get(args.dataset)
    plan = ray.get(args.plan)  # made once by the driver (make_plan), not recomputed here
    rows_per_step = world * tc.micro_batch_size * tc.grad_accum_steps
    if plan.rows_per_step != rows_per_step:
        raise RuntimeError(f"the step plan is for {plan.rows_per_step} rows a step, this worker group takes {rows_per_step}")

    t_model = time.perf_counter()
    model = build_sharded_model(
        cfg.model,
        cfg.parallel,
        device=device,
        activation_checkpointing=tc.activation_checkpointing,
        compile_layers=tc.compile,
        seed=tc.seed,
        liger_kernels=tc.liger_kernels,
        cross_entropy=tc.cross_entropy,
        float8=tc.float8,
        fused_loss_chunk_mem=tc.fused_loss_chunk_mem,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    model_build_s = time.perf_counter() - t_model
    model_conf = load_model_config(cfg.model)
    optimizer = build_optimizer(model.module, tc, device)
    why_not = model.use_copying_adamw(optimizer) if tc.one_pass_adamw else None
    if why_not and rank == 0 and model.compute_copies is not None:  # said only where it could have run
        print(f"[rayft] the optimizer step: the clip, AdamW and the compute copies' cast in three passes ({why_not})", flush=True)
    progress = args.progress.for_rank(rank)
    start_step = resume(model, optimizer, args, rows_per_step, packing_rule(cfg.data.packing), progress, len(plan))

    saver = CheckpointWriter(cfg.checkpoint, model_conf)
    # the steps' counts and votes: host tensors, so that reading them never waits for the device (train_func);
    # not the saver's gloo group, whose async saves run collectives from a thread of their own
    counts_group = dist.new_group(backend="gloo") if world > 1 else None
    validation = ray.get(args.validation) if args.validation is not None else None
    evaluator = Evaluator(cfg, validation, args.pad_id, device, micro_batch_loss)
    evaluator.before_training(model, start_step, progress)
    gpu_name, peak = gpu_peak_flops(device)
    stop = StopPoll(args.stop_flag if rank == 0 else None)
    stop.check_now()  # a stop requested while the workers started: seen before the first step
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return Worker(
        args=args,
        cfg=cfg,
        rank=rank,
        world=world,
        device=device,
        data=data,
        plan=plan,
        model=model,
        model_conf=model_conf,
        optimizer=optimizer,
        saver=saver,
        evaluator=evaluator,
        progress=progress,
        start_step=start_step,
        setup_timings={"setup_s": time.perf_counter() - t_enter, "setup_model_build_s": model_build_s},
        gpu_name=gpu_name,
        peak_flops=peak,
        matmul_params=matmul_params(model.module),
        stop=stop,
        counts_group=counts_group,
        profiler=StepProfiler(tc.profile_steps, args.run_dir, rank, device),
        saved_step=start_step,
    )


def stop_early(w: Worker, last: tuple[int, float, dict] | None) -> None:
    """Collective: the workers' end on a stop request. The last finished step is checkpointed
    (``checkpoint.on_signal``) unless a checkpoint holds it already; every save is finished; rank 0
    sends a :class:`StoppedEvent` before the workers return (normally: Ray Train sees a success)."""
    w.profiler.discard()  # a window the stop cut short: no partial trace
    if last is not None and w.cfg.checkpoint.on_signal and w.saved_step != last[0] + 1:
        step, loss, metrics = last
        report_checkpoints(w.saver.save(w.model.module, w.optimizer, w.checkpoint_state(step, loss), metrics), w.progress)
        w.saved_step = step + 1
    report_checkpoints(w.saver.wait(), w.progress)
    done = last[0] + 1 if last is not None else w.start_step
    w.progress.send(StoppedEvent(done, w.saved_step or None, w.stop.reason or "a stop request"), wait=True)


def step_record(
    w: Worker, step: int, lr: float, result: StepResult, counts: GlobalCounts, step_time_s: float, timings: dict[str, float]
) -> dict[str, Any]:
    """The step's line of ``rayft_metrics.jsonl`` (units: seconds, tokens, FLOP/s, GiB).

    ``timings``: ``data_s`` (CPU wall seconds before compute: the counts, all-reduced over several
    ranks; the rows were made and copied under the previous step's device work, the first step's
    here), ``fwd_bwd_s`` and ``optim_s`` (:class:`StepResult`), plus the one-off set-up timings on
    the first step; they need not add up to ``step_time_s``.
    """
    conf, tc = w.model_conf, w.cfg.train
    span = counts.attn_tokens_sq / max(counts.tokens, 1)
    tps_gpu = counts.tokens / step_time_s / w.world
    flops_tok = flops_per_token(w.matmul_params, conf.num_hidden_layers, conf.hidden_size, span)
    return {
        "step": step + 1,
        "total_steps": w.total_steps,
        "epoch": w.plan.epoch(step),
        "loss": result.loss,
        "lr": lr,
        "grad_norm": result.grad_norm,
        "step_time_s": step_time_s,
        **{f"time_{k}": v for k, v in timings.items()},
        "tokens": counts.tokens,
        "attn_tokens_sq": counts.attn_tokens_sq,
        "trainable_tokens": counts.trainable,
        "tokens_per_s_per_gpu": tps_gpu,
        "trainable_tokens_per_s_per_gpu": counts.trainable / step_time_s / w.world,
        "mfu": mfu(tps_gpu, flops_tok, w.peak_flops),
        "peak_flops": w.peak_flops,
        "gpu": w.gpu_name,
        "world_size": w.world,
        "attn_implementation": w.model.attn_implementation,
        "cross_entropy": w.model.loss.impl,
        "float8": w.model.float8,
        "weights": w.model.weights_mode,  # fsdp2, compute_copy or plain: parallel.single_worker as resolved
        "copying_adamw": result.one_pass,  # this step's clip, AdamW and the copies' cast ran in one pass
        "peak_mem_gib": torch.cuda.max_memory_allocated(w.device) / 2**30 if w.device.type == "cuda" else None,
        "gpu_memory_limit_gib": tc.gpu_memory_limit_gib,
        "fused_loss_chunk_mem": w.model.loss.chunk_mem,  # liger's chunk_mem_const as passed (None: not the fused loss)
        # wall clock when the record is made: the step's end for a step finished at once (the first and last, the
        # driver's wall-time breakdown reads them), up to one step later for one finished after the next was queued
        "unix_time": time.time(),
    }


def report_checkpoints(timings: list[dict], progress: ProgressChannel) -> None:
    """Send finished checkpoints' timings (seconds) to the driver's display and summary."""
    for timing in timings:
        progress.send(CheckpointEvent(timing), wait=True)


def resume(
    model: ShardedModel, optimizer, args: WorkerArgs, rows_per_step: int, rule: str, progress: ProgressChannel, total_steps: int
) -> int:
    """Collective: load the checkpoint to continue from, if any, and return its step (else 0).
    Rank 0 prints the resume, with :func:`resume_note`'s warnings (``rule``: this run's packing rule).
    A model-only checkpoint (``checkpoint.final_model_only``) is taken only when no step is left
    (``total_steps``: a restart after the last step, which then exports).

    That is Ray Train's latest checkpoint after a worker-group restart, else the one ``--resume``
    chose (see :func:`checkpoint.resolve_resume_dir` for incomplete, corrupt and unregistered ones:
    rank 0 verifies the files against their digests and falls back to the newest intact one).

    Raises:
        CheckpointError: the checkpoint was made from other training data, or no intact checkpoint
            is left to resume from, or it holds the model only and steps are left.
    """
    path = ckpt_lib.resolve_resume_dir(ray.train.get_checkpoint(), args.resume_from, args.run_dir)
    if path is None:
        return 0
    saved = read_state(path)
    if not holds_optimizer(saved) and saved["step"] < total_steps:
        raise ckpt_lib.CheckpointError(model_only_refusal(path, saved["step"], total_steps))
    t0 = time.perf_counter()
    state = ckpt_lib.load_sharded(model.module, optimizer, path)
    load_s = time.perf_counter() - t0
    ckpt_lib.check_same_data(path, state.get("data_fingerprint"), args.data_fingerprint)
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        note = resume_note(state, world, rows_per_step, rule)
        print(f"[rayft] resumed from step {state['step']} of {path}{note}", flush=True)
    progress.send(ResumedEvent(int(state["step"]), state["world_size"], world, load_s), wait=True)
    return int(state["step"])


def resume_note(state: dict[str, Any], world: int, rows_per_step: int, rule: str) -> str:
    """What the resume line adds about the checkpoint's ``state`` (its state file's fields): a
    reshard to ``world`` workers, and warnings when the data order differs from the original run's:
    another global batch than ``rows_per_step`` rows, or another packing rule than ``rule``
    (:func:`rayft.data.packing.packing_rule`; a checkpoint without one was written before rules were
    recorded, by a packer whose rows may differ: best fit in visiting order, or rows in opening order
    without shuffle)."""
    note = f" (saved at world size {state['world_size']}, resharded to {world} by DCP)" if state["world_size"] != world else ""
    if state.get("global_batch_rows", rows_per_step) != rows_per_step:
        note += (
            f"; WARNING: the global batch changed from {state['global_batch_rows']} to {rows_per_step} rows, so the "
            "data order differs from the original run (keep workers × micro_batch_size × grad_accum_steps)"
        )
    saved = state.get("packing")
    if saved != rule and not (saved is None and rule == "none"):  # padding mode's rows never changed
        was = f"packing rule {saved!r}" if saved is not None else "no packing rule (written before rayft recorded it)"
        note += (
            f"; WARNING: the checkpoint records {was}, this run packs with {rule!r}, so the rows, and the data order, "
            "differ from the original run's from here on"
        )
    return note

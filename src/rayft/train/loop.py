"""What every Ray Train worker runs: the training step, top to bottom.

Loss is the mean cross-entropy over every trainable token of the *global* batch (all ranks, all
accumulation micro-batches): each micro-batch contributes ``sum(token losses) / N_global`` where
``N_global`` is all-reduced before the first backward. FSDP2 averages gradients over ranks, so the
backward loss is multiplied by the world size to undo that average. Uneven shards (a rank with
fewer rows at the end of an epoch) are therefore weighted correctly.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist

from rayft.config import RayftConfig
from rayft.data.packing import collate, plan_steps, rank_micro_batches
from rayft.train import checkpoint as ckpt_lib
from rayft.train.attention import VARLEN
from rayft.train.evaluate import Evaluator
from rayft.train.metrics import flops_per_token, gpu_peak_flops, mfu
from rayft.train.model import after_optimizer_step, build_sharded_model, load_model_config, matmul_params, tied_embeddings
from rayft.train.optim import build_optimizer, lr_at, set_lr


def make_plan(cfg: RayftConfig, ds, world_size: int):
    """The run's step plan (identical on the driver and on every worker)."""
    return plan_steps(
        ds,
        rows_per_step=world_size * cfg.train.micro_batch_size * cfg.train.grad_accum_steps,
        row_len=cfg.data.seq_len,
        packing=cfg.data.packing,
        shuffle=cfg.data.shuffle,
        seed=cfg.data.seed,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
    )


def memory_fraction(limit_gib: float, total_bytes: int, device_name: str = "the GPU") -> float:
    """The fraction of ``total_bytes`` that ``limit_gib`` GiB is, for
    ``torch.cuda.set_per_process_memory_fraction``.

    Raises:
        ValueError: the limit is above the card's memory (nothing to emulate).
    """
    limit = limit_gib * 2**30
    if limit > total_bytes:
        raise ValueError(f"train.gpu_memory_limit_gib={limit_gib:g} exceeds {device_name}'s {total_bytes / 2**30:.1f} GiB")
    return limit / total_bytes


def cap_gpu_memory(device: torch.device, limit_gib: float) -> float:
    """Cap this process's PyTorch allocations on ``device`` at ``limit_gib`` GiB (the caching
    allocator refuses beyond it with ``torch.OutOfMemoryError``). CUDA's own context and NCCL's
    buffers are outside the cap, where on the emulated card they come out of the same memory: a cap
    at a card's usable memory lets a little more fit than that card would. Returns the fraction set.

    Raises:
        ValueError: ``device`` is not a GPU, or the limit exceeds its memory (:func:`memory_fraction`).
    """
    if device.type != "cuda":
        raise ValueError(f"train.gpu_memory_limit_gib caps GPU memory; this worker runs on {device.type}")
    fraction = memory_fraction(limit_gib, torch.cuda.get_device_properties(device).total_memory, torch.cuda.get_device_name(device))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def micro_batch_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of token cross-entropies (fp32, 0-d) over the micro-batch's trainable targets.

    Variable-length attention gets the document boundaries only when some row holds more than one
    document (more boundaries than rows); rows of one document each (random full-length rows, or a
    row per long example) need no boundaries and run plain causal attention.
    """
    multi_doc = batch["cu_seq_lens"].numel() - 1 > batch["input_ids"].shape[0]  # shapes only: no device sync
    extra = {}
    if model.config._attn_implementation == VARLEN and multi_doc:
        # the document count varies between micro-batches: compile its dimension as dynamic from the
        # first call instead of recompiling when the second micro-batch brings another count
        torch._dynamo.maybe_mark_dynamic(batch["cu_seq_lens"], 0)
        extra = {"cu_seq_lens": batch["cu_seq_lens"]}
    return model.token_loss_sum(batch["input_ids"], batch["position_ids"], batch["labels"], **extra)


def train_func(loop_config: dict[str, Any]) -> None:
    """The Ray Train worker entry point. ``loop_config``: ``config`` (RayftConfig as a dict),
    ``dataset`` (ObjectRef of the TokenizedDataset), ``validation`` (ObjectRef of the validation
    TokenizedDataset, or None), ``data_fingerprint``, ``pad_id``, ``tokenizer``, ``run_dir``,
    ``progress`` (optional ray.util.queue.Queue for the driver's live display)."""
    t_enter, entry_unix = time.perf_counter(), time.time()
    cfg = RayftConfig.model_validate(loop_config["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if cfg.train.gpu_memory_limit_gib is not None:
        cap_gpu_memory(device, cfg.train.gpu_memory_limit_gib)
    ds = ray.get(loop_config["dataset"])
    plan = make_plan(cfg, ds, world)
    total_steps = len(plan)
    tc = cfg.train

    t_model = time.perf_counter()
    model = build_sharded_model(
        cfg.model, cfg.parallel, device=device, activation_checkpointing=tc.activation_checkpointing,
        compile_layers=tc.compile, seed=tc.seed, liger_kernels=tc.liger_kernels, cross_entropy=tc.cross_entropy, float8=tc.float8,
        fused_loss_chunk_mem=tc.fused_loss_chunk_mem,
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    model_build_s = time.perf_counter() - t_model
    model_conf = load_model_config(cfg.model)
    optimizer = build_optimizer(model, tc, device)
    n_matmul = matmul_params(model)
    gpu_name, peak = gpu_peak_flops(device)

    progress = loop_config.get("progress")
    rows_per_step = world * tc.micro_batch_size * tc.grad_accum_steps
    start_step = resume(model, optimizer, loop_config, rows_per_step)

    saver = ckpt_lib.CheckpointWriter(cfg.checkpoint, model_conf)
    val = loop_config.get("validation")
    evaluator = Evaluator(cfg, ray.get(val) if val is not None else None, loop_config["pad_id"], device, micro_batch_loss)
    evaluator.before_training(model, start_step, rank, progress)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_last = time.perf_counter()
    # one-off, reported with the first step: worker setup before it (data fetch, model build and
    # weight broadcast, optimizer, resume, initial evaluation)
    setup = {"setup_s": t_last - t_enter, "setup_model_build_s": model_build_s}
    for step in range(start_step, total_steps):
        lr = lr_at(step, total_steps, tc)
        set_lr(optimizer, lr)
        micro = rank_micro_batches(plan.rows[step], rank, world, tc.micro_batch_size, tc.grad_accum_steps)
        batches = [
            {k: v.to(device, non_blocking=True) for k, v in collate(
                ds, rows, cfg.data.seq_len, loop_config["pad_id"], fixed_len=cfg.data.packing,
                min_rows=tc.micro_batch_size if cfg.data.packing else 1).items()}
            for rows in micro
        ]
        # Global count of trainable targets: the denominator of the step's mean loss.
        # One all-reduce: the step's global token counts, and rank 0's clock-based vote to checkpoint.
        counts = [sum(b[k] for b in batches).to(torch.float64) for k in ("num_trainable", "num_tokens", "attn_tokens_sq")]
        counts.append(torch.tensor(float(rank == 0 and saver.time_is_due()), dtype=torch.float64, device=device))
        counts.append(torch.tensor(float(saver.local_write_done()), dtype=torch.float64, device=device))
        counts = torch.stack(counts)
        dist.all_reduce(counts)
        n_trainable, n_tokens, attn_sq, time_vote, writes_done = counts.tolist()  # (synchronises: data time ends here)
        report_checkpoint(saver.finalize_if_done(writes_done == world), rank, progress)  # a background save that finished
        t_data = time.perf_counter()
        # GPU time of the step's phases from CUDA events, read after the step's one sync (the
        # loss): no synchronize between backward and the optimizer, so the CPU launches the
        # gradient clipping and optimizer kernels while the backward still runs.
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if device.type == "cuda" else None
        if events:
            events[0].record()

        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        for i, batch in enumerate(batches):
            model.set_requires_gradient_sync(i == len(batches) - 1)
            ce = micro_batch_loss(model, batch)
            (ce * (world / n_trainable)).backward()
            loss_sum += ce.detach().double()
        if events:
            events[1].record()
        t_fwd_bwd = time.perf_counter()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
            if tc.max_grad_norm
            else torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        )
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        after_optimizer_step(model)
        if events:
            events[2].record()
        dist.all_reduce(loss_sum)
        loss = loss_sum.item() / n_trainable  # the step's sync point
        now = time.perf_counter()
        dt, t_last = now - t_last, now
        if events:
            fwd_bwd_s, optim_s = events[0].elapsed_time(events[1]) / 1e3, events[1].elapsed_time(events[2]) / 1e3
        else:
            fwd_bwd_s, optim_s = t_fwd_bwd - t_data, now - t_fwd_bwd
        # data_s: CPU wall seconds before compute (collate, copy, the counts' all-reduce); fwd_bwd_s
        # and optim_s: GPU seconds on CUDA (events), CPU wall seconds on CPU; they need not add up
        # to step_time_s.
        breakdown = {"data_s": t_data - (now - dt), "fwd_bwd_s": fwd_bwd_s, "optim_s": optim_s}
        if step == start_step:
            breakdown.update(setup)

        step_done = step + 1
        if step == start_step and (staged := saver.prestage(model, optimizer)) is not None:
            breakdown["prestage_s"] = staged  # one-off: pinned buffers for async checkpoint saves
            t_last = time.perf_counter()  # not part of the next step's time
        span = attn_sq / max(n_tokens, 1)
        tps_gpu = n_tokens / dt / world
        metrics = {
            "step": step_done,
            "total_steps": total_steps,
            "epoch": plan.epoch_of_step[step],
            "loss": loss,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "step_time_s": dt,
            **{f"time_{k}": v for k, v in breakdown.items()},
            "tokens": n_tokens,
            "attn_tokens_sq": attn_sq,
            "trainable_tokens": n_trainable,
            "tokens_per_s_per_gpu": tps_gpu,
            "trainable_tokens_per_s_per_gpu": n_trainable / dt / world,
            "mfu": mfu(tps_gpu, flops_per_token(n_matmul, model_conf.num_hidden_layers, model_conf.hidden_size, span), peak),
            "peak_flops": peak,
            "gpu": gpu_name,
            "world_size": world,
            "attn_implementation": model.config._attn_implementation,
            "cross_entropy": model.rayft_cross_entropy,
            "float8": getattr(model, "rayft_float8", False),
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "gpu_memory_limit_gib": tc.gpu_memory_limit_gib,
            # liger's chunk_mem_const as passed (None: not the fused loss, or a liger without it)
            "fused_loss_chunk_mem": getattr(model, "rayft_fused_ce_options", {}).get("chunk_mem_const"),
            "unix_time": time.time(),  # the step's end, wall clock (the driver's wall-time breakdown)
        }
        if step == start_step:
            metrics["worker_entry_unix"] = entry_unix
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step_done}")
        if evaluator.is_due(step_done, total_steps):
            metrics.update(evaluator(model))  # eval_loss, eval_tokens
            t_last = time.perf_counter()  # evaluation time is not step time
        # Live metrics go to the driver through our own queue: ray.train.report() waits for the
        # controller to consume each result (a queue of one), which costs ~1.5 s per call.
        # (the first step always: it carries the one-off setup timings)
        if rank == 0 and progress is not None and (step_done % tc.log_every == 0 or step == start_step or step_done == total_steps
                                                   or "eval_loss" in metrics):  # fmt: skip
            sent = progress.actor.put_nowait.remote(metrics)
            if step_done == total_steps:
                ray.get(sent)  # the last step's metrics must reach the driver before the worker exits
        if (step_done == total_steps and cfg.checkpoint.save_final) or saver.step_is_due(step_done) or time_vote > 0:
            state = {"step": step_done, "epoch": plan.epoch_of_step[step], "world_size": world, "loss": loss,
                     "global_batch_rows": rows_per_step, "data_fingerprint": loop_config["data_fingerprint"],
                     "tokenizer": loop_config.get("tokenizer")}  # fmt: skip
            report_checkpoint(saver.save(model, optimizer, state, metrics), rank, progress)
            t_last = time.perf_counter()  # checkpoint time is not step time
    report_checkpoint(saver.wait(), rank, progress)  # the last save must be complete before the run ends

    if cfg.checkpoint.export_hf:
        export_and_verify(model, model_conf, loop_config, ds, cfg, device, rank, progress)


def report_checkpoint(timings: list[dict], rank: int, progress) -> None:
    """Send finished checkpoints' timings (seconds) to the driver's display and summary."""
    if rank == 0 and progress is not None:
        for timing in timings:
            ray.get(progress.actor.put_nowait.remote({"checkpoint": timing}))


def resume(model, optimizer, loop_config: dict[str, Any], rows_per_step: int) -> int:
    """Collective: load the checkpoint to continue from, if any, and return its step (else 0).

    That is Ray Train's latest checkpoint after a worker-group restart, else the one ``--resume``
    chose (see :func:`checkpoint.resolve_resume_dir` for incomplete and unregistered ones).
    """
    path = ckpt_lib.resolve_resume_dir(ray.train.get_checkpoint(), loop_config.get("resume_from"), loop_config["run_dir"])
    if path is None:
        return 0
    t0 = time.perf_counter()
    state = ckpt_lib.load_sharded(model, optimizer, path)
    load_s = time.perf_counter() - t0
    if state.get("data_fingerprint") not in (None, loop_config["data_fingerprint"]):
        raise ckpt_lib.CheckpointError(
            f"{path}: the training data changed since this checkpoint (fingerprint {state['data_fingerprint']} → "
            f"{loop_config['data_fingerprint']}); resuming would not continue the same data order"
        )
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        note = f" (saved at world size {state['world_size']}, resharded to {world} by DCP)" if state["world_size"] != world else ""
        if state.get("global_batch_rows", rows_per_step) != rows_per_step:
            note += (f"; WARNING: the global batch changed from {state['global_batch_rows']} to {rows_per_step} rows, so the "
                     "data order differs from the original run (keep workers × micro_batch_size × grad_accum_steps)")  # fmt: skip
        print(f"[rayft] resumed from step {state['step']} of {path}{note}", flush=True)
        if loop_config.get("progress") is not None:
            event = {"step": int(state["step"]), "from_world_size": state["world_size"], "world_size": world, "load_s": load_s}
            ray.get(loop_config["progress"].actor.put_nowait.remote({"resumed": event}))
    return int(state["step"])


def export_and_verify(model, model_conf, loop_config, ds, cfg: RayftConfig, device, rank: int, progress) -> None:
    """Collective: write the HF export from rank 0, then check that the exported model's logits
    equal the trained model's on a fixed batch (the first packed row); report the largest gap."""
    from transformers import AutoModelForCausalLM

    from rayft.data.tokenizer import load_tokenizer

    sd = ckpt_lib.full_model_state_dict(model)
    run_dir = loop_config["run_dir"]
    remote = "://" in run_dir
    probe = collate(ds, [[0]], cfg.data.seq_len, loop_config["pad_id"], fixed_len=False)
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
    if rank == 0:
        out = os.path.join(tempfile.mkdtemp(prefix="rayft-hf-"), "hf") if remote else os.path.join(run_dir, "hf")
        assert tied_embeddings(model) == bool(getattr(model_conf, "tie_word_embeddings", False))
        ckpt_lib.write_hf_model(sd, model_conf, load_tokenizer(loop_config["tokenizer"]), out)
        dtype = torch.bfloat16 if device.type == "cuda" and cfg.parallel.param_dtype == "bfloat16" else torch.float32
        hf = AutoModelForCausalLM.from_pretrained(out, dtype=dtype).to(device).eval()
        with torch.no_grad():
            got = hf(input_ids=probe["input_ids"].to(device), position_ids=probe["position_ids"].to(device)).logits.float().cpu()
        diff = (got - ref).abs().max().item()
        # with train.float8 the trained model's matmuls ran in float8 and the export's run in bf16/fp32:
        # the gap then includes float8 rounding, not only the export's
        info = {"export_dir": out, "export_max_abs_logit_diff": diff, "export_tied": tied_embeddings(hf),
                "trained_float8": bool(getattr(model, "rayft_float8", False))}  # fmt: skip
        with open(os.path.join(out, "rayft_export_check.json"), "w") as f:
            json.dump(info, f, indent=2)
        if remote:  # upload to the run directory on object storage
            import pyarrow.fs

            pyarrow.fs.copy_files(out, f"{run_dir.rstrip('/')}/hf")
            info["export_dir"] = f"{run_dir.rstrip('/')}/hf"
        if progress is not None:
            ray.get(progress.actor.put_nowait.remote({"export": info}))
    dist.barrier()

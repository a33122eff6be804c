"""One optimizer step: micro-batches in, the step's loss, gradient norm and phase timings out.

The loss is the mean cross-entropy over every trainable token of the *global* batch (all ranks,
all accumulation micro-batches): each micro-batch contributes ``sum(token losses) / N_global``
where ``N_global`` (:func:`global_counts`) is all-reduced before the first backward. FSDP2 averages
gradients over ranks, so the backward loss is multiplied by the world size to undo that average
(one worker without FSDP2: a world size of 1, nothing to undo).
Uneven shards (a rank with fewer rows at the end of an epoch) are therefore weighted correctly.

The training loop (:mod:`rayft.train.loop`) calls :func:`launch_step` and makes the next step's
micro-batches before it waits for the result; the benchmarks under ``bench/gpu/`` call
:func:`train_step` (the two at once); none keeps a copy of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rayft.train.attention import VARLEN
from rayft.train.model import ShardedModel


def micro_batch_loss(model: ShardedModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum of token cross-entropies (fp32, 0-d) over the micro-batch's trainable targets.

    ``batch``: :func:`rayft.data.packing.collate`'s tensors, those the model reads on its device
    (without ``trained_positions``, e.g. a benchmark's hand-made rows, the LM head runs over every
    position).
    Variable-length attention gets the document boundaries only when some row holds more than one
    document (more boundaries than rows); rows of one document each (random full-length rows, or a
    row per long example) need no boundaries and run plain causal attention.
    """
    multi_doc = batch["cu_seq_lens"].numel() - 1 > batch["input_ids"].shape[0]  # shapes only: no device sync
    extra = {}
    if model.attn_implementation == VARLEN and multi_doc:
        # the document count varies between micro-batches: compile its dimension as dynamic from the
        # first call instead of recompiling when the second micro-batch brings another count
        torch._dynamo.maybe_mark_dynamic(batch["cu_seq_lens"], 0)
        extra = {"cu_seq_lens": batch["cu_seq_lens"]}
    return model.token_loss_sum(batch["input_ids"], batch["position_ids"], batch["labels"], batch.get("trained_positions"), **extra)


@dataclass(frozen=True)
class GlobalCounts:
    """The step's sums over every rank (one all-reduce): ``trainable`` targets (the loss's
    denominator), non-padding ``tokens``, ``attn_tokens_sq`` (Σ document length², for MFU's
    attention span), the two checkpoint votes: ``time_vote`` > 0 when rank 0's clock says a save
    is due, ``writes_done`` = ranks whose background save finished; and ``stop_vote`` > 0 when
    rank 0 saw a stop request (:mod:`rayft.train.stop`)."""

    trainable: float
    tokens: float
    attn_tokens_sq: float
    time_vote: float
    writes_done: float
    stop_vote: float = 0.0


COUNT_KEYS = ("num_trainable", "num_tokens", "attn_tokens_sq")
"""The micro-batch scalars :func:`global_counts` sums; the training loop keeps them in host memory."""


def global_counts(
    batches: list[dict[str, torch.Tensor]],
    time_vote: bool,
    write_done: bool,
    group: dist.ProcessGroup | None = None,
    stop_vote: bool = False,
) -> GlobalCounts:
    """Collective: the step's token counts, checkpoint and stop votes summed over ranks.

    ``batches``: the rank's micro-batches; their :data:`COUNT_KEYS` scalars are read with ``float``,
    so host tensors cost no device sync (the training loop leaves them on the host; a device tensor
    works too, with a sync each). The rank's six values are summed on the host and, over several
    ranks, all-reduced in one float64 host tensor over ``group``, a gloo group (None: the default
    group, which must take CPU tensors). No device is touched: the training loop queues the next
    step while the previous one runs, and a collective on the device read here would wait for it.
    """
    local = [sum(float(b[k]) for b in batches) for k in COUNT_KEYS] + [float(time_vote), float(write_done), float(stop_vote)]
    if dist.get_world_size() == 1:
        return GlobalCounts(*local)
    stacked = torch.tensor(local, dtype=torch.float64)
    dist.all_reduce(stacked, group=group)
    return GlobalCounts(*stacked.tolist())


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did: ``loss`` (mean nats per trainable token of the global batch),
    ``grad_norm`` (the total gradient norm before clipping), ``fwd_bwd_s`` and ``optim_s`` (GPU
    seconds from CUDA events on a GPU, CPU wall seconds on the CPU; ``optim_s`` includes the work of
    :meth:`rayft.train.model.ShardedModel.after_optimizer_step`, the compute copies' cast since
    bench/NOTES.md §33, which was in the next step's ``fwd_bwd_s`` before); ``one_pass``: the clip,
    AdamW and the compute copies' cast ran as one pass (:mod:`rayft.train.copying_adamw`) this step,
    False where the optimizer stepped as torch's AdamW does (no one pass, or it declined the step)."""

    loss: float
    grad_norm: float
    fwd_bwd_s: float
    optim_s: float
    one_pass: bool = False


def forward_backward(model: ShardedModel, batches: list[dict[str, torch.Tensor]], n_trainable: float, world: int) -> torch.Tensor:
    """Forward and backward over the micro-batches, gradients reduced after the last one.

    Returns the rank's sum of token losses (float64, 0-d, detached; not yet all-reduced).
    """
    loss_sum = torch.zeros((), device=batches[0]["input_ids"].device, dtype=torch.float64)
    for i, batch in enumerate(batches):
        model.set_gradient_sync(i == len(batches) - 1)
        with model.computing():  # the backward too: activation checkpointing runs the forward again in it
            ce = micro_batch_loss(model, batch)
            (ce * (world / n_trainable)).backward()
        loss_sum += ce.detach().double()
    return loss_sum


def optimizer_step(model: ShardedModel, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> tuple[torch.Tensor, bool]:
    """Clip (when ``max_grad_norm``), step, zero the gradients; returns the total gradient norm
    before clipping (0-d, on the device) and whether the step ran as one pass: with
    ``model.copying_adamw`` the clip, the step and the compute copies' cast are one pass
    (:mod:`rayft.train.copying_adamw`), unless it declines this step (a master without its copy)."""
    params = model.module.parameters
    if model.copying_adamw is not None and model.copying_adamw.optimizer is optimizer:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params() if p.grad is not None])
        # clip_grad_norm_'s coefficient: max_norm / (norm + 1e-6), at most 1
        coef = torch.clamp(max_grad_norm / (grad_norm + 1e-6), max=1.0) if max_grad_norm else None
        if model.copying_adamw.step(coef):
            optimizer.zero_grad(set_to_none=True)
            model.compute_copies.copies_written()
            return grad_norm, True
        if max_grad_norm:  # a master without its copy: the three passes, on the norm made above
            torch.nn.utils.clip_grads_with_norm_(params(), max_grad_norm, grad_norm)
    elif max_grad_norm:
        grad_norm = torch.nn.utils.clip_grad_norm_(params(), max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params() if p.grad is not None])
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.after_optimizer_step()
    return grad_norm, False


@dataclass
class PendingStep:
    """An optimizer step whose kernels are queued on the device and not yet waited for.

    :meth:`result` is the step's one sync. Between :func:`launch_step` and it the host is free
    while the device works: the training loop makes the next step's micro-batches there, and may
    queue the whole next step before it asks for this one's result (on a GPU :meth:`result` waits
    for this step's kernels only, not for what was queued after them).
    """

    loss_sum: torch.Tensor  # float64, 0-d: the global sum of token losses (all-reduce queued)
    grad_norm: torch.Tensor  # 0-d: the total gradient norm before clipping
    n_trainable: float
    events: list[torch.cuda.Event] | None  # start, after backward, after the optimizer (on a GPU)
    host_times: tuple[float, float]  # fwd_bwd_s, optim_s as host wall seconds (the CPU's figures)
    # on a GPU: [loss_sum, grad_norm] (float64, pinned host memory), copied when the step's kernels are done
    host_values: torch.Tensor | None = None
    copied: torch.cuda.Event | None = None  # recorded after that copy
    one_pass: bool = False  # the optimizer's step ran as one pass (StepResult.one_pass)

    def result(self) -> StepResult:
        """Wait for the step; its loss, gradient norm and phase times (see :class:`StepResult`)."""
        if self.copied is not None:
            self.copied.synchronize()  # the step's sync point: this step's queue position, not the stream's end
            loss_sum, grad_norm = self.host_values.tolist()
        else:
            loss_sum, grad_norm = self.loss_sum.item(), float(self.grad_norm)
        if self.events:
            start, backward_done, optimizer_done = self.events
            fwd_bwd_s, optim_s = start.elapsed_time(backward_done) / 1e3, backward_done.elapsed_time(optimizer_done) / 1e3
        else:
            fwd_bwd_s, optim_s = self.host_times
        return StepResult(loss_sum / self.n_trainable, grad_norm, fwd_bwd_s, optim_s, self.one_pass)


def launch_step(
    model: ShardedModel,
    optimizer: torch.optim.Optimizer,
    batches: list[dict[str, torch.Tensor]],
    n_trainable: float,
    max_grad_norm: float | None,
) -> PendingStep:
    """Collective: queue one optimizer step over this rank's ``batches``; nothing waits for the device.

    Args:
        batches: the rank's micro-batches (:func:`rayft.data.packing.collate`; the tensors the model
            reads on the device, the :data:`COUNT_KEYS` scalars may stay on the host).
        n_trainable: the global batch's trainable targets (:func:`global_counts`), > 0.
        max_grad_norm: clip the total gradient norm to this (None or 0: no clipping).

    Nothing synchronises between backward and the optimizer, so the CPU launches the clipping and
    optimizer kernels while the backward still runs; the phase times come from CUDA events read in
    :meth:`PendingStep.result`, which returns a non-finite loss as it is (the caller decides: the
    training loop stops with an error).
    """
    world = dist.get_world_size()
    on_gpu = batches[0]["input_ids"].device.type == "cuda"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if on_gpu else None
    t0 = time.perf_counter()
    if events:
        events[0].record()
    loss_sum = forward_backward(model, batches, n_trainable, world)
    if events:
        events[1].record()
    t1 = time.perf_counter()
    grad_norm, one_pass = optimizer_step(model, optimizer, max_grad_norm)
    if events:
        events[2].record()
    dist.all_reduce(loss_sum)
    host_times = (t1 - t0, time.perf_counter() - t1)
    if not on_gpu:
        return PendingStep(loss_sum, grad_norm, n_trainable, events, host_times, one_pass=one_pass)
    host_values = torch.empty(2, dtype=torch.float64, pin_memory=True)
    if grad_norm.device.type == "cpu":  # parallel.cpu_offload: computed on the host already; a copy to the device would sync
        host_values[1] = grad_norm.to(torch.float64)
        host_values[:1].copy_(loss_sum.reshape(1), non_blocking=True)
    else:
        host_values.copy_(torch.stack([loss_sum, grad_norm.to(torch.float64)]), non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return PendingStep(loss_sum, grad_norm, n_trainable, events, host_times, host_values, copied, one_pass)


def train_step(
    model: ShardedModel,
    optimizer: torch.optim.Optimizer,
    batches: list[dict[str, torch.Tensor]],
    n_trainable: float,
    max_grad_norm: float | None,
) -> StepResult:
    """Collective: one optimizer step, waited for (:func:`launch_step`, then its result)."""
    return launch_step(model, optimizer, batches, n_trainable, max_grad_norm).result()


class StepClock:
    """Wall time per step, with pauses: :meth:`lap` returns the seconds since the previous lap (or
    :meth:`skip`), :meth:`skip` restarts the count so that what ran since (a checkpoint, an
    evaluation, a one-off staging) is not step time.

    With ``device_marks`` (a CUDA device), the clock's marks are timed CUDA events on the current
    stream, and a lap given its step's end (a timed event after the step's kernels) measures between
    the mark and that end on the device: the training loop finishes a step after the next one is
    queued (:func:`rayft.train.loop.train_func`), so the host's own moment is late by as much as
    that queueing blocked (at liger's host sync in the loss's backward), differently for a step
    finished at once. A mark made at :meth:`skip` is where the host is then (the device has nothing
    else queued, or it counts what is).
    """

    def __init__(self, device_marks: bool = False) -> None:
        self.device_marks = device_marks
        self.mark = time.perf_counter()
        self.device_mark = self._device_now()

    def _device_now(self) -> torch.cuda.Event | None:
        if not self.device_marks:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, step_end: torch.cuda.Event | None = None) -> float:
        """Seconds since the last mark; the next mark is now (``step_end`` on the device)."""
        now = time.perf_counter()
        dt = now - self.mark
        if step_end is not None and self.device_mark is not None:
            dt = self.device_mark.elapsed_time(step_end) / 1e3
        self.mark, self.device_mark = now, step_end
        return dt

    def skip(self) -> None:
        self.mark = time.perf_counter()
        self.device_mark = self._device_now()

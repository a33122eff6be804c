"""Validation loss on the workers (``eval_loss``).

The validation set is packed like the training data (``data.packing``, ``data.seq_len``) but never
shuffled, so every evaluation sees the same rows. Row *r* goes to rank ``r % world_size``; each rank
runs the same number of micro-batches of ``train.micro_batch_size`` rows (a rank out of rows runs
all-pad ones, which have no target), since every FSDP2 forward is a collective. The loss is the
global mean cross-entropy over every trainable validation token: the per-rank sums and counts are
all-reduced, exactly as the training loss is normalised.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from rayft.data.packing import Rows, collate, epoch_rows


def eval_rows(val_ds, cfg) -> Rows:
    """The validation rows, in order: packed (``data.packing``), not shuffled. ``val_ds``: the
    validation examples (``lengths()``)."""
    return epoch_rows(val_ds.lengths(), 0, cfg.data.seed, cfg.data.seq_len, cfg.data.packing, shuffle=False)


def eval_is_due(step_done: int, total_steps: int, every: int | None) -> bool:
    """Evaluate after this step? After the last step always; with ``train.eval_every`` also after
    every multiple of it, and before the first step (``step_done == 0``)."""
    return step_done == total_steps or (every is not None and step_done % every == 0)


def evaluate(model, val_ds, rows: Rows, cfg, pad_id: int, device: torch.device, loss_fn) -> dict[str, float]:
    """Collective (every rank calls it): the model's mean loss over the validation set.

    Args:
        model: the :class:`~rayft.train.model.ShardedModel`.
        rows: :func:`eval_rows`. loss_fn: ``(model, batch) → 0-d`` sum of token losses over the
            batch's trainable targets (:func:`rayft.train.step.micro_batch_loss`).
    Returns:
        ``{"eval_loss": mean nats per trainable token (float), "eval_tokens": trainable targets (float)}``.
    Raises:
        FloatingPointError: a non-finite validation loss.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mbs = cfg.train.micro_batch_size
    mine = np.arange(rank, len(rows), world)  # this rank's row indices
    n_micro = math.ceil(len(rows) / (world * mbs))  # the same on every rank
    module = model.module
    was_training = module.training
    module.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # [sum of token losses, trainable targets]
    with torch.no_grad():
        for k in range(n_micro):
            b = collate(val_ds, rows.select(mine[k * mbs : (k + 1) * mbs]), cfg.data.seq_len, pad_id, fixed_len=cfg.data.packing)
            batch = {key: v.to(device, non_blocking=True) for key, v in b.items()}
            totals[0] += loss_fn(model, batch).double()
            totals[1] += batch["num_trainable"].double()
    module.train(was_training)
    dist.all_reduce(totals)
    loss_sum, count = totals.tolist()
    loss = loss_sum / count
    if not math.isfinite(loss):
        raise FloatingPointError(f"validation loss is {loss}")
    return {"eval_loss": loss, "eval_tokens": count}


class Evaluator:
    """The training loop's handle on validation: ``val_ds`` None (no validation set) makes every
    call a no-op. ``loss_fn`` as in :func:`evaluate`."""

    def __init__(self, cfg, val_ds, pad_id: int, device: torch.device, loss_fn):
        self.cfg, self.val, self.pad_id, self.device, self.loss_fn = cfg, val_ds, pad_id, device, loss_fn
        self.rows = eval_rows(val_ds, cfg) if val_ds is not None else None

    def is_due(self, step_done: int, total_steps: int) -> bool:
        return self.val is not None and eval_is_due(step_done, total_steps, self.cfg.train.eval_every)

    def __call__(self, model) -> dict[str, float]:
        return evaluate(model, self.val, self.rows, self.cfg, self.pad_id, self.device, self.loss_fn)

    def before_training(self, model, start_step: int, progress) -> None:
        """With ``train.eval_every``, a fresh run (not a resumed one) evaluates the initial model
        and sends an :class:`~rayft.train.events.InitialEvalEvent` to the driver (``progress``:
        a :class:`~rayft.train.events.ProgressChannel`, silent on every rank but 0)."""
        from rayft.train.events import InitialEvalEvent

        if self.val is None or not self.cfg.train.eval_every or start_step != 0:
            return
        result = self(model)
        progress.send(InitialEvalEvent(result["eval_loss"], result["eval_tokens"]), wait=True)

"""The run's step plan from its config: which examples each step's rows hold, made once by the driver
(:func:`rayft.train.driver.train_run`) and handed to every worker."""

from __future__ import annotations

from rayft.config import RayftConfig
from rayft.data.packing import StepPlan, plan_steps


def make_plan(cfg: RayftConfig, ds, world_size: int) -> StepPlan:
    """The run's step plan for ``world_size`` workers: the one place a config becomes a plan.

    The driver calls it once per run (the workers receive the result, see :func:`rayft.train.loop.setup_worker`);
    ``ds``: the training data (``len``, ``lengths()``). A pure function of the example lengths,
    ``data.seed``/``packing``/``shuffle``/``seq_len``, the batch settings and ``world_size``.

    Raises:
        ValueError: no example; with packing, an example longer than ``data.seq_len``.
    """
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

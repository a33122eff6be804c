"""The training step on its own (one CPU rank, gloo): the loss is the global mean over trainable
targets, the gradient matches the reference model's, the step record has the metrics file's
fields; and the library's modules import no CLI code (typer; Ray itself imports click)."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.data.packing import collate
from rayft.data.tokenize import TokenizedDataset
from rayft.train.model import build_sharded_model
from rayft.train.optim import build_optimizer
from rayft.train.step import global_counts, micro_batch_loss, train_step


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"  # a file store: no TCP port to collide with another test process
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def batches():
    rng = np.random.default_rng(0)
    lengths = [20, 12, 30, 9]
    tokens = rng.integers(0, 150000, sum(lengths)).astype(np.int32)
    trainable = rng.random(sum(lengths)) > 0.4
    ds = TokenizedDataset(tokens, trainable, np.cumsum([0] + lengths))
    return [collate(ds, [[0, 1]], 32, 0), collate(ds, [[2], [3]], 32, 0)]  # two micro-batches: accumulation


def test_train_step_is_the_global_mean_and_steps_the_optimizer(gloo):
    cpu = torch.device("cpu")
    model = build_sharded_model(ModelConfig(name_or_path="qwen2-tiny"), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                compile_layers=False, seed=7)  # fmt: skip
    opt = build_optimizer(model.module, TrainConfig(lr=1e-3), cpu)
    bs = batches()
    counts = global_counts(bs, time_vote=False, write_done=True, device=cpu, stop_vote=True)
    n = sum(int(b["num_trainable"]) for b in bs)
    assert (counts.trainable, counts.tokens, counts.time_vote, counts.writes_done, counts.stop_vote) == (n, 71.0, 0.0, 1.0, 1.0)
    with torch.no_grad():
        expected = sum(float(micro_batch_loss(model, b)) for b in bs) / n  # the same weights, before the step
    before = model.module.model.layers[0].mlp.up_proj.weight.full_tensor().clone()
    result = train_step(model, opt, bs, counts.trainable, max_grad_norm=1.0)
    assert result.loss == pytest.approx(expected, rel=1e-6)
    assert result.grad_norm > 0 and result.fwd_bwd_s > 0 and result.optim_s > 0
    assert not torch.equal(model.module.model.layers[0].mlp.up_proj.weight.full_tensor(), before)
    assert all(p.grad is None for p in model.module.parameters())  # zeroed for the next step


def test_the_worker_loop_imports_no_cli_code():
    code = "import sys, rayft.train.loop, rayft.train.driver, rayft.benchmarks.train; print(sorted(m for m in sys.modules if m.split('.')[0] == 'typer'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"

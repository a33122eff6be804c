"""The training step on its own (one CPU rank, gloo): the loss is the global mean over trainable
targets, the gradient matches the reference model's, the step record has the metrics file's
fields; the step's counts and votes summed over two gloo ranks; and the library's modules import no
CLI code (typer; Ray itself imports click)."""

import ast
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks

import rayft
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
    counts = global_counts(bs, time_vote=False, write_done=True, stop_vote=True)
    n = sum(int(b["num_trainable"]) for b in bs)
    assert (counts.trainable, counts.tokens, counts.time_vote, counts.writes_done, counts.stop_vote) == (n, 71.0, 0.0, 1.0, 1.0)
    with torch.no_grad():
        expected = sum(float(micro_batch_loss(model, b)) for b in bs) / n  # the same weights, before the step
    before = model.module.model.layers[0].mlp.up_proj.weight.full_tensor().clone()
    result = train_step(model, opt, bs, counts.trainable, max_grad_norm=1.0)
    assert result.loss == pytest.approx(expected, rel=1e-6)
    assert result.grad_norm > 0 and result.fwd_bwd_s > 0 and result.optim_s > 0
    assert result.one_pass is False  # FSDP2, no compute copies: torch's AdamW stepped
    assert not torch.equal(model.module.model.layers[0].mlp.up_proj.weight.full_tensor(), before)
    assert all(p.grad is None for p in model.module.parameters())  # zeroed for the next step


def test_a_step_taken_in_one_pass_says_so_in_its_result(gloo, monkeypatch):
    """``launch_step`` carries what ``optimizer_step`` says it did (the one pass ran: the step record's
    ``copying_adamw``) through the pending step to the result; the one pass itself needs a GPU or
    Triton's interpreter (tests/unit/test_compute_copy.py), so here optimizer_step is the plain one,
    saying it took the one pass."""
    import rayft.train.step as step_module

    cpu = torch.device("cpu")
    model = build_sharded_model(ModelConfig(name_or_path="qwen2-tiny"), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                compile_layers=False, seed=7)  # fmt: skip
    opt = build_optimizer(model.module, TrainConfig(lr=1e-3), cpu)
    plain = step_module.optimizer_step
    monkeypatch.setattr(step_module, "optimizer_step", lambda *a: (plain(*a)[0], True))
    bs = batches()
    result = train_step(model, opt, bs, float(sum(int(b["num_trainable"]) for b in bs)), max_grad_norm=1.0)
    assert result.one_pass is True and result.grad_norm > 0


def test_global_counts_of_one_rank_are_host_sums_with_no_collective(gloo, monkeypatch):
    """One rank: the micro-batches' count scalars (host tensors, as the loop keeps them) summed on
    the host; no collective."""

    def no_collective(*args, **kwargs):
        raise AssertionError("an all-reduce on one rank")

    monkeypatch.setattr(dist, "all_reduce", no_collective)
    bs = batches()
    counts = global_counts(bs, time_vote=True, write_done=False)
    n = sum(int(b["num_trainable"]) for b in bs)
    sq = sum(float(b["attn_tokens_sq"]) for b in bs)
    assert (counts.trainable, counts.tokens, counts.attn_tokens_sq) == (n, 71.0, sq) and sq == 20**2 + 12**2 + 30**2 + 9**2
    assert (counts.time_vote, counts.writes_done, counts.stop_vote) == (1.0, 0.0, 0.0)


COUNTS_RANK = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from rayft.train.step import global_counts
    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    scalar = lambda v, dt=torch.int64: torch.tensor(v, dtype=dt)  # host tensors, as the training loop keeps them
    batches = [  # rank 0: two micro-batches; rank 1: one
        {"num_trainable": scalar(10 + rank), "num_tokens": scalar(50 + rank), "attn_tokens_sq": scalar(0.5 + rank, torch.float64)}
        for _ in range(2 - rank)
    ]
    group = dist.new_group(backend="gloo")  # as the training loop passes its own
    c = global_counts(batches, time_vote=rank == 0, write_done=True, group=group, stop_vote=rank == 1)
    json.dump(c.__dict__, open(out, "w"))
    dist.destroy_process_group()
""")


def test_global_counts_sums_every_count_and_vote_over_two_ranks(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(COUNTS_RANK)
    argvs = [[str(r), str(tmp_path / "store"), str(tmp_path / f"counts-{r}.json")] for r in range(2)]
    ranks = run_ranks(script, argvs, tmp_path / "ranks", timeout=120)
    assert [rc for rc, _ in ranks] == [0, 0], "\n".join(o[-2000:] for _, o in ranks)
    got = [json.loads((tmp_path / f"counts-{r}.json").read_text()) for r in range(2)]
    expected = {
        "trainable": 2 * 10 + 11,
        "tokens": 2 * 50 + 51,
        "attn_tokens_sq": 2 * 0.5 + 1.5,
        "time_vote": 1.0,
        "writes_done": 2.0,
        "stop_vote": 1.0,
    }
    assert got == [expected, expected]


def module_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: module-level imports, including those under
    ``if``/``try`` (but not ``if TYPE_CHECKING:``), not those inside functions; ``from a import b``
    gives ``a`` and ``a.b`` (b may be a submodule)."""
    found: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0 and node.module, f"{path}:{node.lineno}: a relative import (not followed here)"
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for h in node.handlers:
                    visit(h.body)

    visit(ast.parse(path.read_text()).body)
    return found


def test_the_worker_loop_imports_no_cli_code():
    """What importing the worker loop, the driver and the benchmark runner imports of rayft (each
    package's __init__ too), followed module by module: no rayft.cli, rayft.commands or typer (a
    check without importing torch in a process of its own: ~8 CPU-s of CI)."""
    src = Path(rayft.__file__).parent.parent

    def file_of(name: str) -> Path | None:
        base = src.joinpath(*name.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    todo, seen, cli = ["rayft.train.loop", "rayft.train.driver", "rayft.benchmarks.train"], set(), []
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for k in range(1, len(parts) + 1):  # a module's packages are imported before it
            mod = ".".join(parts[:k])
            if mod in seen or (mod.split(".")[0] != "rayft" and mod != "typer"):
                continue
            seen.add(mod)
            if mod == "typer" or mod.startswith(("rayft.cli", "rayft.commands")):
                cli.append(mod)
            elif (f := file_of(mod)) is not None:
                todo.extend(module_level_imports(f))
    assert "rayft.train.model" in seen and "rayft.config" in seen and len(seen) > 30  # the walk reached the library
    assert cli == []

"""The memory planner (rayft.train.memory_plan) against hand-computed figures, `rayft fit`, and
`rayft train` refusing a config that cannot fit its cluster's GPUs before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rayft.config import ModelConfig
from rayft.train.compute_copy import GRAD_GROUP_BYTES
from rayft.train.memory_plan import (
    ModelDims,
    TrainShape,
    checkpointed_layer_count,
    count_model_dims,
    liger_chunk_tokens,
    model_dims,
    offload_host_bytes,
    parse_gpus,
    plan_memory,
)
from rayft.train.model import load_model_config

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alpaca_en_demo.json"


@pytest.fixture(scope="module")
def qwen15():
    return count_model_dims(load_model_config(ModelConfig(name_or_path="qwen2.5-1.5b")))


def test_qwen2_5_1_5b_dims_are_the_published_sizes(qwen15):
    # Qwen2.5-1.5B: 1.54B parameters with the tied LM head counted once; per layer q/k/v (with biases),
    # o, gate/up/down and two norms
    h, kv, i = 1536, 256, 8960
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    assert qwen15.params_layer == layer == 46_797_824
    assert qwen15.params_root == 151936 * h + h  # the embedding (= the LM head) and the final norm
    assert qwen15.params == 28 * layer + qwen15.params_root == 1_543_714_304
    assert (qwen15.q_dim, qwen15.kv_dim, qwen15.intermediate, qwen15.layers, qwen15.norms_per_layer) == (1536, 256, 8960, 28, 2)


def test_plan_of_the_sample_job_on_8_l4s_by_hand(qwen15):
    """The 1.5B, one 2048-token row per GPU on 8 GPUs, compiled, fused loss (chunk 8): every part
    computed by hand from the sizes above."""
    p = qwen15.params
    plan = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=1, seq_len=2048, compiled=True))
    per_token_layer = 2 * 4 * 1536 + 4 * 1536 + 4 * 256 + 6 * 8960  # 73,216 bytes
    chunk = 256  # ⌈151936 / (8 · 1536)⌉ = 13; ⌈2048 / 13⌉ = 158 → the next power of two
    assert plan.parts == {
        # the gradients are None until the step's first reduce-scatter (zero_grad(set_to_none=True))
        "sharded fp32 weights and AdamW moments": 12 * p // 8,
        "bf16 weights gathered for compute": 2 * (151936 * 1536 + 1536 + 2 * 46_797_824),
        "activations kept for backward": 2048 * 28 * per_token_layer,
        "loss: logits chunk": 2 * chunk * 151936,
        "loss: input gradient (fp32)": 4 * 2048 * 1536,
        "LM head gradient": 4 * 151936 * 1536,
    }
    assert plan.phase.startswith("end of the forward pass")
    assert plan.peak == 8_191_880_448


def test_the_sharded_gradients_count_where_they_exist(qwen15):
    """Measured: the 32B checkpointed as rank 0 of 8 peaked at 82.92 GiB with 16 rows, 15 GiB under a
    count that held its 15.3 GiB of fp32 gradient shards through the forward pass
    (bench/results/2026-12-02-bigger-models-fakepg-1xh200.json). They exist only from the step's
    reduce-scatter on; with accumulation, FSDP2 holds every layer's whole fp32 gradient between
    micro-batches (no sync before the last), on each GPU."""
    p, root = qwen15.params, 151936 * 1536 + 1536
    one = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=4, seq_len=2048, compiled=True))
    accum = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=4, seq_len=2048, compiled=True, grad_accum_steps=2))
    assert accum.parts["unsharded fp32 gradients accumulated between micro-batches"] == 4 * p
    assert accum.peak - one.peak == 4 * p
    # one GPU, checkpointing, one row: the activations are small, the end of the backward pass is the peak:
    # every other unit's gradient, and the root's fp32 reduce-scatter input beside its reduced copy
    small = plan_memory(qwen15, TrainShape(gpus=1, micro_batch_size=1, seq_len=2048, compiled=True, activation_checkpointing=True))
    assert small.phase.startswith("end of the backward pass")
    assert small.parts == {
        "sharded fp32 weights and AdamW moments": 12 * p,
        "every other unit's fp32 gradient shard": 4 * (p - root),
        "the root's fp32 reduce-scatter input and its reduced copy": 8 * root,
    }
    # on 8 GPUs: the root's bf16 gradients and their fp32 reduce-scatter input
    eight = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=1, seq_len=64, compiled=True, activation_checkpointing=True))
    assert eight.parts["the root's gradients (compute dtype) and their fp32 reduce-scatter input"] == 6 * root
    # the 7B with checkpointing alone on 8 L4s: measured out of memory at 1 row (19.86 GiB allocated at
    # the try's peak, then a 520 MiB request refused under the 22.5 GiB cap; same results file)
    q7 = model_dims(load_model_config(ModelConfig(name_or_path="qwen2.5-7b")))
    end = plan_memory(q7, TrainShape(gpus=8, micro_batch_size=1, seq_len=2048, compiled=True, activation_checkpointing=True))
    assert end.phase.startswith("end of the backward pass") and end.peak / 2**30 == pytest.approx(19.86, rel=0.02)
    assert end.needed() > 22.4 * 2**30  # with the allocator's slack and the runtime: does not fit an L4, as measured


def test_one_gpu_without_fsdp2_counts_its_compute_copies_only_where_they_exist(qwen15):
    """parallel.single_worker on one GPU: a bf16 copy of every weight, kept (measured 89.7 GiB against
    FSDP2's 87.2 for this model at 16 × 2,048: bench/NOTES.md §29); none with fp32 compute (the module
    computes with its masters); and CPU offload always runs under FSDP2, so its plan (and the advice
    that tries it) counts FSDP2's gathered layers, not copies."""
    p, root, head = qwen15.params, 151936 * 1536 + 1536, 151936 * 1536
    shape = TrainShape(gpus=1, micro_batch_size=16, seq_len=2048, compiled=True)
    fsdp2, copies = plan_memory(qwen15, shape), plan_memory(qwen15, replace(shape, without_fsdp2=True))
    gathered = fsdp2.parts["bf16 weights gathered for compute"]
    assert copies.parts["compute copies of every weight (rayft.train.compute_copy)"] == 2 * p
    assert copies.peak - fsdp2.peak == 2 * p - gathered
    fp32 = plan_memory(qwen15, replace(shape, without_fsdp2=True, compute_bytes=4))
    assert not {"compute copies of every weight (rayft.train.compute_copy)", "fp32 weights gathered for compute"} & set(fp32.parts)
    assert fp32.peak < plan_memory(qwen15, replace(shape, compute_bytes=4)).peak  # the masters compute: nothing gathered
    small = replace(shape, micro_batch_size=1, activation_checkpointing=True, without_fsdp2=True)
    end = plan_memory(qwen15, small)
    # the end of the backward: the weights and moments, every fp32 gradient, the copies, the LM head's
    # bf16 gradient and the copies' last group of gradients (256 MiB), moved into fp32 as the backward ends
    group = 256 * 2**20
    assert end.phase.startswith("end of the backward pass") and GRAD_GROUP_BYTES == group
    assert end.peak == 12 * p + 4 * (p - root) + 2 * p + 4 * root + 2 * head + group
    # with accumulation a later micro-batch's group is cast into an fp32 scratch (2 × its bytes) before its add
    accum = plan_memory(qwen15, replace(small, grad_accum_steps=2))
    assert accum.parts["the compute copies' last group of gradients (and its fp32 scratch)"] == 3 * group
    assert (
        "the compute copies' last group of gradients (and its fp32 scratch)"
        not in plan_memory(qwen15, replace(small, compute_bytes=4)).parts
    )  # fp32 compute: no copies, no group
    offload = replace(shape, cpu_offload=True)
    assert plan_memory(qwen15, replace(offload, without_fsdp2=True)).parts == plan_memory(qwen15, offload).parts


def test_checkpointing_keeps_layer_inputs_and_recomputes_one_layer(qwen15):
    full = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=8, seq_len=2048, compiled=True))
    ac = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=8, seq_len=2048, compiled=True, activation_checkpointing=True))
    every2 = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=8, seq_len=2048, compiled=True, activation_checkpointing=2))
    t, a = 8 * 2048, 73_216
    assert full.parts["activations kept for backward"] == t * 28 * a
    assert ac.parts["activations kept for backward"] == t * 28 * 2 * 1536
    assert every2.parts["activations kept for backward"] == t * (14 * a + 14 * 2 * 1536)
    assert ac.phase.startswith("backward") and ac.parts["one layer recomputed (checkpointing)"] == t * a
    assert [checkpointed_layer_count(28, s) for s in (False, True, 1, 2, 3, 28, 100)] == [0, 28, 28, 14, 10, 1, 1]


def test_offload_moves_the_sharded_state_to_the_host(qwen15):
    plan = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=1, seq_len=2048, cpu_offload=True))
    assert "sharded fp32 weights, gradients, AdamW moments" not in plan.parts
    # pinned fp32 parameter and gradient shards in power-of-two blocks, AdamW's moments as they are;
    # measured on an H200 as rank 0 of 8 (bench/results/2026-12-02-bigger-models-fakepg-1xh200.json):
    # the process's RSS grew by 3.25 GiB over the same run without offload
    assert plan.host_per_gpu / 2**30 == pytest.approx(3.25, abs=0.01)
    assert plan.host_per_gpu > 16 * qwen15.params // 8
    # an async save under offload stages a plain copy of the weights and both moments: 12 bytes/param ÷ GPUs more
    saving = plan_memory(qwen15, TrainShape(gpus=8, micro_batch_size=1, seq_len=2048, cpu_offload=True, async_save_copy=True))
    assert saving.host_per_gpu - plan.host_per_gpu == 12 * qwen15.params // 8
    # by hand: a 10 × 3 and a 5-element parameter on 2 GPUs: shards of 5 × 3 and 3 rows, 60 and 12 bytes
    small = ModelDims(
        params=35,
        params_layer=0,
        params_root=35,
        hidden=3,
        q_dim=3,
        kv_dim=3,
        intermediate=3,
        vocab=10,
        layers=0,
        param_shapes=((10, 3), (5, 1)),
    )
    assert offload_host_bytes(small, 2) == 2 * (64 + 16) + 2 * (60 + 12)
    assert offload_host_bytes(replace(small, param_shapes=()), 2) == 16 * 35 // 2


def test_liger_chunk_and_the_plain_loss(qwen15):
    assert liger_chunk_tokens(32768, 1536, 151936, 8) == 4096  # ⌈151936/12288⌉ = 13; ⌈32768/13⌉ = 2521 → 4096
    assert liger_chunk_tokens(32768, 1536, 151936, 1) == 512
    assert liger_chunk_tokens(100, 1536, 151936, 8) == 8  # ⌈100/13⌉ = 8
    assert liger_chunk_tokens(4096, 5120, 152064, 8) == 1024  # ⌈152064/40960⌉ = 4; ⌈4096/4⌉ = 1024 (not 8 × liger's 1-chunk 256)
    plain = plan_memory(qwen15, TrainShape(gpus=1, micro_batch_size=8, seq_len=2048, fused_loss=False))
    assert plain.parts["loss: whole logits (logits + fp32 log-softmax + gradient)"] == 10 * 16384 * 151936
    fp32 = plan_memory(qwen15, TrainShape(gpus=1, micro_batch_size=8, seq_len=2048, compiled=True, compute_bytes=4))
    bf16 = plan_memory(qwen15, TrainShape(gpus=1, micro_batch_size=8, seq_len=2048, compiled=True))
    assert fp32.parts["activations kept for backward"] == 2 * bf16.parts["activations kept for backward"]
    assert fp32.parts["fp32 weights gathered for compute"] == 2 * bf16.parts["bf16 weights gathered for compute"]


def test_parse_gpus_reads_the_catalog():
    t = parse_gpus("8xL4")
    assert (t.count, t.model, t.memory) == (8, "L4", 22888 * 2**20)
    assert parse_gpus("16 × h100").memory == 81920 * 2**20
    with pytest.raises(ValueError, match="expected <count>x<GPU>"):
        parse_gpus("L4")
    with pytest.raises(ValueError, match="no GPU 'V100'; known: .*L4"):
        parse_gpus("8xV100")


def rayft(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rayft.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def write_config(tmp_path: Path, extra: str = "") -> Path:
    """A job config of the 7B with two alpaca records of its own (a fresh clone need not have ../shared)."""
    data = tmp_path / "records.json"
    data.write_text(
        json.dumps(
            [{"instruction": "Add 2 and 3.", "input": "", "output": "5"}, {"instruction": "Name a colour.", "input": "", "output": "Blue."}]
        )
    )
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        f"model: {{name_or_path: qwen2.5-7b}}\ndata: {{train_files: [{data}], seq_len: 2048}}\n"
        f"train: {{micro_batch_size: 1, compile: true}}\n{extra}"
    )
    return cfg


def fit_cli(*args: str) -> subprocess.CompletedProcess:
    """`rayft fit ARGS` through the CLI app in this process (the test process has torch and
    transformers loaded already: ~1 s a call instead of a new process's ~7 s on 2 cores), as a
    CompletedProcess like :func:`rayft`'s."""
    from typer.testing import CliRunner

    from rayft.cli import app

    r = CliRunner().invoke(app, ["fit", *args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(["rayft", "fit", *args], r.exit_code, r.stdout, r.stderr)


def test_rayft_fit_judges_the_7b_on_8_l4s(tmp_path):
    cfg = write_config(tmp_path)
    out = fit_cli(str(cfg), "--gpus", "8xL4", "--json")
    assert out.returncode == 1, out.stderr
    plan = json.loads(out.stdout)
    assert plan["fits"] is False and plan["gpus"]["memory_gib"] == pytest.approx(22888 / 1024)
    assert plan["advice"].startswith("fits with train.activation_checkpointing: true and parallel.cpu_offload: true")
    ok = fit_cli(str(cfg), "--gpus", "8xL4", "--set", "train.activation_checkpointing=true", "--set", "parallel.cpu_offload=true")
    assert ok.returncode == 0, ok.stderr
    assert "fits: needs" in ok.stderr and "host memory per GPU (offloaded shards)" in ok.stderr
    import importlib.util

    # auto counts liger's fused loss only where liger-kernel is installed, and says so when it does not
    assert ("counted as the plain loss" in ok.stderr) == (importlib.util.find_spec("liger_kernel") is None)
    none = fit_cli(str(cfg))
    assert none.returncode == 2 and "say which GPUs with --gpus" in none.stderr


def test_rayft_train_refuses_what_cannot_fit_its_cluster_before_ray_starts(tmp_path):
    """A cluster: of 2 g6.12xlarge (8 L4s) and the 7B without checkpointing or offload: `rayft train`
    exits 1 naming the verdict and the way out, and no Ray session was started."""
    cfg = write_config(tmp_path, "cluster: {instance_type: g6.12xlarge, num_nodes: 2}\n")
    out = rayft("train", str(cfg), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    err = " ".join(out.stderr.split())
    assert "qwen2.5-7b with train.micro_batch_size=1 × data.seq_len=2048 does not fit: needs" in err
    assert "8× L4" in err and "--force (or train.fit_check: warn) trains anyway" in err
    assert "ray:" not in out.stdout + out.stderr and not (tmp_path / "runs").exists()


def test_ray_accelerator_types_map_to_the_catalog():
    from rayft.train.memory_plan import gpu_of_accelerator_type

    assert gpu_of_accelerator_type("accelerator_type:L4").gpu_memory_mib == 22888
    assert gpu_of_accelerator_type("accelerator_type:A100-40G").gpu_memory_mib == 40960
    assert gpu_of_accelerator_type("accelerator_type:A100-80G").gpu_memory_mib == 81920
    assert gpu_of_accelerator_type("accelerator_type:A100").gpu_memory_mib == 81920  # open: the larger, never a wrong refusal
    assert gpu_of_accelerator_type("accelerator_type:TPU-V4") is None and gpu_of_accelerator_type("CPU") is None


def sample_config(**train):
    from rayft.config import RayftConfig

    return RayftConfig.model_validate(
        {
            "model": {"name_or_path": "qwen2.5-7b"},
            "data": {"train_files": [str(DATA)], "seq_len": 2048},
            "train": {"micro_batch_size": 1, "compile": True, **train},
            "cluster": {"instance_type": "g6.12xlarge", "num_nodes": 2},
        }
    )


def test_fit_problem_refuses_only_when_the_peak_alone_is_over(monkeypatch):
    """On 8 L4s: the 7B plain is refused (its allocated peak alone exceeds 22.35 GiB); with float8 the
    count is an upper bound and with checkpointing only the margins are over: warnings; with
    checkpointing and offload it fits; a hub id that cannot be read offline is not judged."""
    from rayft.train.memory_plan import cluster_gpus, fit_problem

    target = cluster_gpus(sample_config())
    assert (target.count, target.model, target.host_memory_per_gpu) == (8, "L4", 196608 * 2**20 // 4)
    level, why = fit_problem(sample_config(), target)
    assert level == "refuse" and "does not fit" in why
    assert fit_problem(sample_config(float8=True), target)[0] == "warn"
    # checkpointing: an allocated peak of 21.4 GiB, 25.0 with the margins: only a warning
    level, why = fit_problem(sample_config(activation_checkpointing=True), target)
    assert level == "warn" and why.endswith("(within the allocator and runtime margins)")
    offload = sample_config(activation_checkpointing=True)
    offload.parallel.cpu_offload = True
    assert fit_problem(offload, target) is None
    hub = sample_config()
    hub.model.name_or_path = "no-such-org/no-such-model"
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `rayft train` / `rayft fit` switch to when the Hub cannot be reached
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert fit_problem(hub, target) is None


def test_the_cli_check_leaves_cpu_workers_and_capped_gpus_to_their_settings(capsys):
    from rayft.commands.train import check_cluster_fit

    cpu = sample_config(use_gpu=False)
    check_cluster_fit(cpu, "job.yaml")  # CPU workers: nothing judged, no exit
    off = sample_config(fit_check="off")
    check_cluster_fit(off, "job.yaml")
    warn = sample_config(fit_check="warn")
    check_cluster_fit(warn, "job.yaml")
    assert "warning: job.yaml: qwen2.5-7b with train.micro_batch_size=1" in " ".join(capsys.readouterr().err.split())


def test_rayft_fit_without_the_hub_says_so_in_one_line_and_reads_only_the_cache(tmp_path, monkeypatch):
    """A Hub id and no Hub: `rayft fit` switches to the local cache before it reads the model's config
    (one line; not huggingface_hub's five retries, 23 s), then names what it cannot read."""
    import os

    from huggingface_hub import constants
    from typer.testing import CliRunner

    from rayft.cli import app

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: the Hub cannot be reached
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("qwen2.5-7b", "no-such-org/no-such-model"))
    r = CliRunner().invoke(app, ["fit", str(cfg), "--gpus", "8xL4"])
    assert r.exit_code == 2, r.output
    assert "http://127.0.0.1:9 cannot be reached" in r.output
    assert "no-such-org/no-such-model from the local Hugging Face cache only (HF_HUB_OFFLINE=1)" in r.output
    assert "model.name_or_path=no-such-org/no-such-model: cannot read its config" in r.output
    assert constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"  # switched before the read


def test_one_h200_takes_fsdp2_for_the_7b_where_compute_copies_do_not_fit(tmp_path):
    """parallel.single_worker: auto on one GPU keeps compute copies, 2 bytes per parameter more than
    FSDP2: the 7B's plan then exceeds an H200 (141 GiB) where FSDP2's fits. The driver's choice takes
    FSDP2 there, says why, and writes it into the config the workers and the run directory get; the
    1.5B keeps its copies; an explicit compute_copy is left as asked (the fit check judges it); and
    `rayft fit` advises the switch first."""
    from rayft.config_load import load_config
    from rayft.train.memory_plan import copies_do_not_fit
    from rayft.train.ray_cluster import choose_single_worker

    one_h200 = "cluster: {instance_type: p5en.48xlarge, num_nodes: 1}\n"
    cfg = load_config(write_config(tmp_path, one_h200), overrides=["train.num_workers=1"])
    said: list[str] = []
    choose_single_worker(cfg, 1, embedded=False, say=said.append)
    assert cfg.parallel.single_worker == "fsdp2" and len(said) == 1
    assert said[0].startswith("parallel.single_worker: auto takes fsdp2 on this GPU: compute copies need 143.3 GiB of H200's 141.0, FSDP2 ")
    assert "(cluster.instance_type p5en.48xlarge)" in said[0]
    target = parse_gpus("1xH200")
    from rayft.train.memory_plan import fit_problem

    # the fit check (`rayft train` with a cluster: section, the driver's) judges what auto chooses: FSDP2 fits
    assert fit_problem(load_config(write_config(tmp_path)), target) is None
    asked = load_config(write_config(tmp_path, "parallel: {single_worker: compute_copy}\n"))
    assert copies_do_not_fit(asked, target) is None and asked.parallel.single_worker == "compute_copy"
    assert copies_do_not_fit(load_config(write_config(tmp_path)), parse_gpus("2xH200")) is None  # FSDP2 over two anyway
    small = load_config(write_config(tmp_path), overrides=["model.name_or_path=qwen2.5-1.5b"])
    assert copies_do_not_fit(small, target) is None
    choose_single_worker(small, 2, embedded=False, say=said.append)
    assert small.parallel.single_worker == "auto" and len(said) == 1
    # `rayft fit` judges what `rayft train` runs there; with copies asked for, it advises the switch first
    chosen = fit_cli(str(write_config(tmp_path)), "--gpus", "1xH200", "--json")
    assert chosen.returncode == 0 and json.loads(chosen.stdout)["fits"] is True
    assert "parallel.single_worker: auto takes fsdp2 on this GPU: compute copies need 143.3 GiB" in " ".join(chosen.stderr.split())
    kept = fit_cli(str(write_config(tmp_path)), "--gpus", "1xH200", "--json", "--set", "parallel.single_worker=compute_copy")
    assert kept.returncode == 1 and json.loads(kept.stdout)["advice"].startswith("fits with parallel.single_worker: fsdp2")

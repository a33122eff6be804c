"""Loading and exporting Hugging Face safetensors shard by shard (rayft.train.hf_weights), CPU
offload and per-layer activation checkpointing, on real gloo process groups of 1, 2 and 4 ranks
(one OS process per rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_ranks

RANKS = """
import json, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.train.hf_weights import compare_export, shard_rows, write_sharded_hf_weights
from rayft.train.model import build_sharded_model
from rayft.train.optim import build_optimizer
from rayft.train.step import train_step

rank, world, store, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.load(open(sys.argv[4]))
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
cpu, report = torch.device("cpu"), {}
ids = torch.tensor([spec["ids"]])
n = ids.shape[1]
batch = {"input_ids": ids, "position_ids": torch.arange(n)[None], "labels": ids.clone(), "num_trainable": torch.tensor(n),
         "cu_seq_lens": torch.tensor([0, n], dtype=torch.int32), "max_length": n}
for name, src in spec["sources"].items():
    model = build_sharded_model(ModelConfig(name_or_path=src), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                compile_layers=False, seed=3)
    full = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
    equal = []
    for key, p in model.module.state_dict().items():
        start, stop = shard_rows(p.shape[0], rank, world)
        equal.append(p.dtype == torch.float32 and torch.equal(p.to_local(), full[key][start:stop]))
    # train a step so that the export differs from the source, then export and read back
    opt = build_optimizer(model.module, TrainConfig(lr=1e-2), cpu)
    train_step(model, opt, [batch], n, max_grad_norm=1.0)
    out = spec["out"] + "/" + name
    index = write_sharded_hf_weights(model.module, out, file_bytes=spec["file_bytes"])
    check = compare_export(model.module, out, cpu)
    # a changed value in the export is seen by the rank whose rows hold it: a number, then a NaN
    from safetensors.torch import load_file, save_file
    spoiled, exact = [], model.module.model.norm.weight.full_tensor()[0].item()  # collective: on every rank
    for bad in (0.5, float("nan")):
        dist.barrier()
        if rank == 0:
            file = out + "/" + json.load(open(out + "/model.safetensors.index.json"))["weight_map"]["model.norm.weight"]
            tensors = load_file(file)
            tensors["model.norm.weight"][0] += bad
            save_file(tensors, file)
        dist.barrier()
        spoiled.append(compare_export(model.module, out, cpu)["max_abs_diff"])
    dist.barrier()
    if rank == 0:  # put the exact value back
        tensors = load_file(file)
        tensors["model.norm.weight"][0] = exact
        save_file(tensors, file)
    dist.barrier()
    model.module.eval()
    with torch.no_grad():
        logits = model.module(input_ids=ids, position_ids=batch["position_ids"]).logits
    report[name] = {"all_equal": all(equal), "n": len(equal), "files": max(index.values()), "check": check, "spoiled": spoiled,
                    "logits": logits[0, :, :8].tolist()}
# tensors of uneven rows (a short last shard, empty ones) reach each rank whole, and only that rank
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from rayft.train.hf_weights import gathered_on
mesh, uneven = init_device_mesh("cpu", (world,)), []
for rows in (2 * world + 1, 1, 0):
    full = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)
    for placement in (Shard(0), Replicate()):
        t = distribute_tensor(full, mesh, [placement])
        for dst in range(world):
            got = gathered_on(t, dst)
            uneven.append(torch.equal(got, full) if rank == dst else got is None)
report["uneven"] = uneven
if spec.get("fail"):  # rank 1 cannot create its file (a directory holds the name): every rank raises
    import os
    import rayft.train.safetensors_stream as stream_mod
    bad, k = spec["out"] + "/failing", max(index.values())
    if rank == 1:
        os.makedirs(f"{bad}/model-00002-of-{k:05d}.safetensors")
    dist.barrier()
    try:
        write_sharded_hf_weights(model.module, bad, file_bytes=spec["file_bytes"])
        report["failing"] = None
    except OSError as e:
        report["failing"] = f"{type(e).__name__}: {e}"
    # the disk fills while rank 0 writes the second tensor of a file: every rank raises, the partial file is gone
    plain_write, calls = stream_mod.SafetensorsStream.write, []
    def full_disk(self, name, tensor):
        calls.append(self.path.name)
        if rank == 0 and calls.count(self.path.name) == 2 and "full_disk_file" not in report:
            report["full_disk_file"] = self.path.name
            raise OSError(28, "No space left on device")
        plain_write(self, name, tensor)
    stream_mod.SafetensorsStream.write = full_disk
    try:
        write_sharded_hf_weights(model.module, spec["out"] + "/full", file_bytes=spec["file_bytes"])
        report["full_disk"] = None
    except OSError as e:
        report["full_disk"] = f"{type(e).__name__}: {e}"
    stream_mod.SafetensorsStream.write = plain_write
    # the read back: a file cut short fails on every rank, whichever rows it reads; a failure on one
    # rank only (rank 1's reads) fails every rank after their one all-reduce, instead of a mismatch
    import shutil
    from rayft.train import safetensors_rows
    from rayft.train.hf_weights import WeightsError
    cut = spec["out"] + "/cut"
    if rank == 0:
        shutil.copytree(out, cut)
        last = sorted(p for p in os.listdir(cut) if p.endswith(".safetensors"))[-1]
        os.truncate(f"{cut}/{last}", os.path.getsize(f"{cut}/{last}") - 4)
    dist.barrier()
    for key, where in (("cut", cut), ("one_rank", out)):
        plain_gap = safetensors_rows.RowComparer.gap
        def rank1_fails(self, path, *args):
            if rank == 1 and key == "one_rank":
                raise safetensors_rows.LayoutError(f"{path}: made to fail on rank 1")
            return plain_gap(self, path, *args)
        safetensors_rows.RowComparer.gap = rank1_fails
        try:
            report[key] = compare_export(model.module, where, cpu)
        except WeightsError as e:
            report[key] = f"WeightsError: {e}"
        safetensors_rows.RowComparer.gap = plain_gap
if spec.get("offload"):
    losses = {}
    for off in (False, True):
        model = build_sharded_model(ModelConfig(name_or_path="mistral-tiny"), ParallelConfig(cpu_offload=off), device=cpu,
                                    activation_checkpointing=2, compile_layers=False, seed=3)
        opt = build_optimizer(model.module, TrainConfig(lr=3e-3), cpu)
        losses[str(off)] = [train_step(model, opt, [batch], n, max_grad_norm=1.0).loss for _ in range(3)]
    report["offload"] = losses
json.dump(report, open(f"{spec['out']}/report{rank}.json", "w"))
dist.destroy_process_group()
"""


def write_source(preset: str, out: Path, dtype: torch.dtype, max_shard_size: str) -> Path:
    """A Hugging Face directory of a tiny preset's seeded random weights, in ``dtype``, split into
    files of at most ``max_shard_size``."""
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.model import load_model_config

    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(load_model_config(ModelConfig(name_or_path=preset)), dtype=dtype)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    return out


def run_gloo_ranks(world: int, tmp_path: Path, spec: dict) -> list[dict]:
    """Run :data:`RANKS` on ``world`` gloo ranks (one process each); every rank's report."""
    (tmp_path / "ranks.py").write_text(RANKS)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    ranks = run_ranks(tmp_path / "ranks.py", [[str(r), str(world), str(tmp_path / "store"), str(spec_file)] for r in range(world)],
                      tmp_path / "launch")  # fmt: skip
    outs = [o for _, o in ranks]
    assert [rc for rc, _ in ranks] == [0] * world, "\n".join(o[-3000:] for o in outs)
    assert "each rank read its shards" in outs[0]
    return [json.loads((Path(spec["out"]) / f"report{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_load_and_export_on_gloo_ranks(world, tmp_path):
    """On 2 and 4 ranks, for a tied model stored in bf16 over several files (qwen2-tiny) and an
    untied one stored in fp32 (mistral-tiny): every rank's fp32 shards equal its rows of transformers'
    own full load, exactly; after a training step the export (written by every rank, several files)
    reads back equal to every shard, a value changed in it is found (a number, then a NaN), and it
    loads in transformers with the trained model's logits; on 2 ranks, a file one rank cannot write
    makes every rank raise, naming it."""
    from transformers import AutoModelForCausalLM

    sources = {
        "qwen": str(write_source("qwen2-tiny", tmp_path / "qwen-src", torch.bfloat16, "5MB")),
        "mistral": str(write_source("mistral-tiny", tmp_path / "mistral-src", torch.float32, "1GB")),
    }
    assert len(list(Path(sources["qwen"]).glob("*.safetensors"))) == 2  # the source itself spans files
    ids = torch.randint(0, 32000, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    out = tmp_path / "out"
    out.mkdir()
    spec = {"sources": sources, "ids": ids, "out": str(out), "offload": world == 2, "fail": world == 2, "file_bytes": 5 * 2**20}
    reports = run_gloo_ranks(world, tmp_path, spec)
    assert all(all(r["uneven"]) and len(r["uneven"]) == 3 * 2 * world for r in reports)
    for name in sources:
        for r in reports:
            assert r[name]["all_equal"], (name, r[name])
            assert r[name]["check"] == {"tensors": r[name]["n"] - (name == "qwen"), "max_abs_diff": 0.0}
        # files of at most 5 MiB where the tensors allow (qwen's 39 MB embedding is one tensor): several files
        assert reports[0][name]["spoiled"] == [0.5, float("inf")]  # +0.5 on one value, then a NaN: both seen
        k = reports[0][name]["files"]
        assert k >= 2 and (out / name / "model.safetensors.index.json").exists()
        export = out / name
        assert sorted(p.name for p in export.glob("*.safetensors")) == [f"model-{i:05d}-of-{k:05d}.safetensors" for i in range(1, k + 1)]
        assert not (export / "sharded").exists()
        (export / "config.json").write_text((Path(sources[name]) / "config.json").read_text())
        hf = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
        with torch.no_grad():
            got = hf(input_ids=torch.tensor([ids]), position_ids=torch.arange(len(ids))[None]).logits[0, :, :8]
        torch.testing.assert_close(got, torch.tensor(reports[0][name]["logits"]), rtol=0, atol=1e-5)
        src = AutoModelForCausalLM.from_pretrained(sources[name], dtype=torch.float32)
        assert not torch.equal(src.model.layers[0].mlp.up_proj.weight, hf.model.layers[0].mlp.up_proj.weight)  # it trained
    if world == 2:
        # a write that fails on one rank: that rank raises its error, every other rank names it; no index is written
        k = reports[0]["mistral"]["files"]
        own = f"IsADirectoryError: [Errno 21] Is a directory: '{out}/failing/model-00002-of-{k:05d}.safetensors'"
        assert reports[1]["failing"] == own
        assert reports[0]["failing"] == f"OSError: writing the export failed on rank 1: {own}"
        assert not (out / "failing" / "model.safetensors.index.json").exists()
        assert reports[0]["full_disk"] == "OSError: [Errno 28] No space left on device"
        assert reports[1]["full_disk"] == "OSError: writing the export failed on rank 0: OSError: [Errno 28] No space left on device"
        for r in reports:
            assert r["cut"].startswith("WeightsError: ") and "/cut/model-" in r["cut"] and "bytes, its header describes" in r["cut"]
        assert reports[1]["one_rank"].startswith("WeightsError: ") and reports[1]["one_rank"].endswith(": made to fail on rank 1")
        assert reports[0]["one_rank"].startswith("WeightsError: ") and "another rank found the export wrong" in reports[0]["one_rank"]
        assert reports[0]["full_disk_file"].startswith("model-0000")
        assert not (out / "full" / reports[0]["full_disk_file"]).exists()  # the partial file was removed
        assert not (out / "full" / "model.safetensors.index.json").exists()
        losses = reports[0]["offload"]
        assert losses["True"] == pytest.approx(losses["False"], rel=1e-6)
        assert losses["True"][0] > losses["True"][2]


def test_checkpointing_every_kth_layer_keeps_the_gradients(one_rank_group):
    """``activation_checkpointing: 2`` on a 5-layer model checkpoints layers 0, 2, 4; gradients
    equal those of no checkpointing and of every layer's."""
    from rayft.config import ModelConfig, ParallelConfig
    from rayft.train.model import build_sharded_model

    cfg = ModelConfig(name_or_path="mistral-tiny", config_overrides={"num_hidden_layers": 5})
    ids = torch.randint(0, 32000, (2, 16), generator=torch.Generator().manual_seed(1))
    grads, flags = {}, {}
    for ac in (False, True, 2):
        m = build_sharded_model(
            cfg, ParallelConfig(), device=torch.device("cpu"), activation_checkpointing=ac, compile_layers=False, seed=7
        )
        flags[ac] = [bool(layer.gradient_checkpointing) for layer in m.module.model.layers]
        m.module(input_ids=ids).logits.sum().backward()
        grads[ac] = m.module.model.layers[1].mlp.up_proj.weight.grad.full_tensor()
    assert flags == {False: [False] * 5, True: [True] * 5, 2: [True, False, True, False, True]}
    torch.testing.assert_close(grads[2], grads[False], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-5, atol=1e-6)


def test_which_checkpoints_are_read_shard_by_shard(one_rank_group, tmp_path):
    """Rank 0 decides for every rank: a plain safetensors directory is read shard by shard; stray
    safetensors beside the indexed files (Mistral's ``consolidated.safetensors``) are not read; a
    checkpoint whose tensor names differ from the model's (a format transformers renames while
    loading), whose tensors are stored in another dtype (a quantized format) or have another shape
    is loaded whole by rank 0, with the reason; read shard by shard anyway, the last one is an error
    naming the directory and the tensor."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from rayft.config import ModelConfig
    from rayft.train.hf_weights import agree_on_source, checkpoint_files
    from rayft.train.model import load_model_config

    cpu = torch.device("cpu")
    src = write_source("mistral-tiny", tmp_path / "src", torch.float32, "10MB")
    conf = load_model_config(ModelConfig(name_or_path=str(src)))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(conf)
    indexed = checkpoint_files(src)
    assert len(indexed) >= 2
    save_file({"junk": torch.zeros(2)}, src / "consolidated.safetensors")
    assert checkpoint_files(src) == indexed  # the stray file is not one of them
    assert agree_on_source(str(src), None, skeleton, conf, cpu) == (str(src), "")
    from rayft.config import ParallelConfig
    from rayft.train.model import build_sharded_model

    model = build_sharded_model(ModelConfig(name_or_path=str(src)), ParallelConfig(), device=cpu, activation_checkpointing=False,
                                compile_layers=False, seed=0)  # fmt: skip
    full = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).state_dict()
    assert all(torch.equal(p.full_tensor(), full[k]) for k, p in model.module.state_dict().items())

    first = src / indexed[0]
    tensors = load_file(first)
    key = sorted(tensors)[0]
    renamed = {(k + ".renamed" if k == key else k): v for k, v in tensors.items()}
    save_file(renamed, first, metadata={"format": "pt"})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][key + ".renamed"] = index["weight_map"].pop(key)
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    got, why = agree_on_source(str(src), None, skeleton, conf, cpu)
    assert got is None and why.startswith(f"1 tensor name(s) of the model are not in its safetensors (e.g. ['{key}'])")

    save_file({**tensors, key: tensors[key].to(torch.float8_e4m3fn)}, first, metadata={"format": "pt"})
    index["weight_map"][key] = index["weight_map"].pop(key + ".renamed")
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    got, why = agree_on_source(str(src), None, skeleton, conf, cpu)
    assert got is None and why.startswith("tensors stored as F8_E4M3")

    save_file({**tensors, key: tensors[key][:-1].clone()}, first, metadata={"format": "pt"})  # one row short
    got, why = agree_on_source(str(src), None, skeleton, conf, cpu)
    assert got is None and why.startswith(f"tensor shapes differ from the model's: {key} [{tensors[key].shape[0] - 1}")
    from rayft.train.hf_weights import WeightsError, load_sharded_weights

    with pytest.raises(WeightsError, match=f"{src}: tensor shapes differ from the model's: {key}"):
        load_sharded_weights(model.module, src)


def test_activation_checkpointing_parses_as_written():
    """YAML ``true``/``false`` are booleans, an integer is every k-th layer (1 and ``true`` both
    mean every layer); 0 and below are refused naming the field."""
    from pydantic import ValidationError

    from rayft.config import RayftConfig

    def parse(v):
        return RayftConfig.model_validate(
            {"data": {"train_files": ["x.json"]}, "train": {"activation_checkpointing": v}}
        ).train.activation_checkpointing

    assert [parse(v) for v in (True, False, 1, 2, 7)] == [True, False, 1, 2, 7]
    assert parse(0) is False  # YAML 0 reads as false
    with pytest.raises(ValidationError, match="train.activation_checkpointing"):
        parse(-1)


def test_file_index_cuts_equal_runs_in_order():
    from rayft.train.hf_weights import export_file_count, file_index

    sizes = [("a", 10), ("b", 10), ("c", 10), ("d", 10), ("e", 40)]
    assert file_index(sizes, 2) == {"a": 1, "b": 1, "c": 1, "d": 1, "e": 2}
    assert file_index(sizes, 4) == {"a": 1, "b": 1, "c": 2, "d": 2, "e": 3}  # a file left empty is not numbered
    assert file_index(sizes, 1) == dict.fromkeys("abcde", 1)
    gib = 2**30
    assert export_file_count(6 * gib) == 3  # files of at most 2 GiB
    assert export_file_count(gib) == 1  # a small model: model.safetensors
    assert export_file_count(20 * gib, 5 * gib) == 4


def test_shard_rows_follow_torch_chunk():
    from rayft.train.hf_weights import shard_rows

    for n in (0, 1, 5, 7, 8, 151936):
        for world in (1, 2, 3, 4, 8):
            chunks = torch.arange(n).chunk(world) if n else ()
            for rank in range(world):
                start, stop = shard_rows(n, rank, world)
                want = chunks[rank].tolist() if rank < len(chunks) else []
                assert list(range(start, stop)) == want, (n, world, rank)

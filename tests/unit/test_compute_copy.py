"""One worker without FSDP2 (``parallel.single_worker: compute_copy``, rayft.train.compute_copy):
the same training as FSDP2 on one rank, step for step, with bf16 compute on the CPU; the masters
stay fp32 and registered; a load into the masters reaches the copies; checkpoints move between the
two modes (one CPU rank, gloo)."""

import copy
import gc
import weakref

import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from rayft.config import ModelConfig, ParallelConfig, TrainConfig
from rayft.data.packing import collate
from rayft.data.tokenize import TokenizedDataset
from rayft.train import checkpoint as ckpt_lib
from rayft.train.compute_copy import ComputeCopies
from rayft.train.hashing_writer import HashingFileSystemWriter
from rayft.train.loss import TokenLoss, enable_sharded_token_loss
from rayft.train.model import ShardedModel, build_sharded_model, checkpoint_layers, decoder_layers
from rayft.train.optim import build_optimizer
from rayft.train.step import micro_batch_loss, train_step

CPU = torch.device("cpu")


VOCAB = 4096  # qwen2-tiny's embedding cut from 151,936 rows: bf16 on the CPU is slow, the mechanism is the same


def batches(seed: int):
    rng = np.random.default_rng(seed)
    lengths = [20, 12, 30, 9]
    tokens = rng.integers(0, VOCAB, sum(lengths)).astype(np.int32)
    trainable = rng.random(sum(lengths)) > 0.4
    ds = TokenizedDataset(tokens, trainable, np.cumsum([0] + lengths))
    return [collate(ds, [[0, 1]], 32, 0), collate(ds, [[2], [3]], 32, 0)]  # two micro-batches: accumulation


def plain(seed: int = 7) -> ShardedModel:
    """qwen2-tiny (tied embeddings; VOCAB rows) without FSDP2, fp32 on the CPU."""
    pc = ParallelConfig(single_worker="compute_copy")
    mc = ModelConfig(name_or_path="qwen2-tiny", config_overrides={"vocab_size": VOCAB})
    return build_sharded_model(mc, pc, device=CPU, activation_checkpointing=False,
                               compile_layers=False, seed=seed)  # fmt: skip


def with_bf16_copies(model: ShardedModel) -> ShardedModel:
    """The plain model computing in bf16 through compute copies (on a GPU build_sharded_model does
    this itself; the CPU computes in fp32 there)."""
    model.compute_copies = ComputeCopies(model.module, torch.bfloat16)
    return model


def fsdp2_bf16_like(model: ShardedModel) -> ShardedModel:
    """A copy of ``model``'s weights under FSDP2 on one rank, bf16 compute, fp32 reduction: what a
    one-GPU run did before compute copies."""
    module = copy.deepcopy(model.module)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (1,))
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    enable_sharded_token_loss(module)
    return ShardedModel(module, TokenLoss.create("torch"))


def weights(model: ShardedModel) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone() for k, v in model.module.state_dict().items()}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "activation-checkpointing"])
def test_compute_copies_train_as_fsdp2_on_one_rank(one_rank_group, checkpointed):
    copies = with_bf16_copies(plain())
    fsdp = fsdp2_bf16_like(copies)
    assert isinstance(fsdp.module, FSDPModule) and not isinstance(copies.module, FSDPModule) and not copies.fsdp
    if checkpointed:  # the backward runs each layer's forward again: the copies must still be in place
        for m in (copies, fsdp):
            checkpoint_layers(m.module)
    # fused AdamW, as on a GPU: its step leaves the parameters' version counters as they were, so
    # only ShardedModel.after_optimizer_step tells the copies to cast again
    opts = [torch.optim.AdamW(m.module.parameters(), lr=1e-3, weight_decay=0.1, fused=True) for m in (copies, fsdp)]
    for step in range(2):  # the second step computes with copies cast again after the first's optimizer step
        bs = batches(step)
        n = float(sum(int(b["num_trainable"]) for b in bs))
        got = [train_step(m, o, bs, n, max_grad_norm=1.0) for m, o in ((copies, opts[0]), (fsdp, opts[1]))]
        assert got[0].loss == got[1].loss and got[0].grad_norm == got[1].grad_norm, (step, got)
        # cast at the step's end (ComputeCopies.refresh, queued behind the optimizer), not at the next forward
        pairs = copies.compute_copies.copy_of.values()
        assert pairs and all(torch.equal(c, m.detach().to(torch.bfloat16)) for m, c in pairs), step
    a, b = weights(copies), weights(fsdp)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    # outside a forward the module holds its fp32 masters, and the optimizer steps them
    params = list(copies.module.parameters())
    assert {p.dtype for p in params} == {torch.float32}
    assert {id(p) for g in opts[0].param_groups for p in g["params"]} == {id(p) for p in params}
    assert copies.module.get_output_embeddings().weight is copies.module.get_input_embeddings().weight  # still tied


def test_the_copies_compute_in_bf16_and_follow_a_load(one_rank_group):
    model = with_bf16_copies(plain())
    seen = []
    hook = model.module.model.layers[0].mlp.up_proj.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight.dtype))
    b = batches(0)[0]
    with torch.no_grad():
        before = float(micro_batch_loss(model, b))
    hook.remove()
    assert seen == [torch.bfloat16]
    # a load into the masters (a checkpoint's, in place) bumps their versions: the next forward casts again
    other = plain(seed=8).module.state_dict()
    with torch.no_grad():
        model.module.load_state_dict(other)
        after = float(micro_batch_loss(model, b))
    fresh = with_bf16_copies(plain(seed=8))
    with torch.no_grad():
        assert after == float(micro_batch_loss(fresh, b)) and after != before


def test_every_gradient_reaches_the_fp32_masters_inside_the_block_or_after_it(one_rank_group):
    """Inside ``computing()`` (the step's way) and with the backward after the forward's block closed
    (a caller of micro_batch_loss without activation checkpointing): the same fp32 gradients on the
    masters, none left on the copies."""
    grads = []
    for inside in (True, False):
        model = with_bf16_copies(plain())
        b = batches(1)[0]
        if inside:
            with model.computing():
                micro_batch_loss(model, b).backward()
                copies = list(model.module.parameters())
            assert {p.dtype for p in copies} == {torch.bfloat16} and all(p.grad is None for p in copies)
        else:
            micro_batch_loss(model, b).backward()
        masters = dict(model.module.named_parameters())
        assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in masters.values())
        grads.append({k: p.grad for k, p in masters.items()})
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_the_copies_gradients_reach_the_masters_in_groups_the_last_at_the_backward_end(one_rank_group, monkeypatch):
    """A copy's gradient waits in its group until the group holds GRAD_GROUP_BYTES, the last group
    until the backward ends (a callback queued with autograd's engine), not one cast per parameter as
    autograd makes it. Observed where the backward reaches the embedding's output: every decoder
    layer's gradient exists there. The groups' size changes when the masters get their gradients,
    not which: the same fp32 gradients either way."""
    import rayft.train.compute_copy as compute_copy

    grads, waiting = [], []
    for group_bytes in (compute_copy.GRAD_GROUP_BYTES, 64 * 1024):
        monkeypatch.setattr(compute_copy, "GRAD_GROUP_BYTES", group_bytes)
        model = with_bf16_copies(plain())
        masters = dict(model.module.named_parameters())
        seen = []

        def at_the_embedding_output(grad, model=model, masters=masters, seen=seen):
            on_copies = {id(m) for m, c in model.compute_copies.copy_of.values() if c.grad is not None}
            seen.append(([k for k, m in masters.items() if m.grad is not None], [k for k, m in masters.items() if id(m) in on_copies]))

        model.module.model.embed_tokens.register_forward_hook(
            lambda mod, args, out, f=at_the_embedding_output: [out.register_hook(f)] and None
        )
        micro_batch_loss(model, batches(1)[0]).backward()
        assert len(seen) == 1
        waiting.append(seen[0])
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in masters.values())
        assert all(c.grad is None for _m, c in model.compute_copies.copy_of.values())
        assert model.compute_copies.moves_queued == 0 and model.compute_copies.group == []
        grads.append({k: p.grad for k, p in masters.items()})
    (moved_whole, on_copies_whole), (moved_small, on_copies_small) = waiting
    assert moved_whole == [] and "model.norm.weight" in on_copies_whole  # one group: nothing moved before the end
    # 64 KiB groups (qwen2-tiny's layer weights are 16 KiB or less in bf16): the last layer's, whose backward runs first, moved
    assert "model.norm.weight" in moved_small and "model.layers.1.mlp.down_proj.weight" in moved_small
    assert len(on_copies_small) < len(on_copies_whole)
    assert all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_a_copy_whose_gradient_arrives_twice_in_a_group_is_moved_once():
    """A weight used inside a reentrant-checkpointed block and after it gets its gradient twice in
    one backward (the outer graph's, then the nested one's, added into the same copy.grad before
    the group moves): moved once, and over two micro-batches the masters hold what fp32 training
    gives. Integer values keep bf16 exact, so the two compare bit for bit."""
    from torch.utils.checkpoint import checkpoint

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([[1.0, 2.0], [3.0, -1.0]]))

        def forward(self, x):
            h = checkpoint(lambda t: t @ self.w, x, use_reentrant=True)
            return (h @ self.w).sum()

    xs = [torch.tensor([[1.0, 2.0], [0.0, 1.0]]), torch.tensor([[2.0, -1.0], [1.0, 1.0]])]
    reference, module = Twice(), Twice()
    copies = ComputeCopies(module, torch.bfloat16)
    for x in xs:  # two micro-batches: the second adds into the masters' gradients
        reference(x.clone().requires_grad_(True)).backward()
        with copies.computing():
            module(x.to(torch.bfloat16).requires_grad_(True)).backward()
    assert module.w.grad.dtype == torch.float32 and torch.equal(module.w.grad, reference.w.grad), (module.w.grad, reference.w.grad)
    assert copies.moves_queued == 0 and copies.group == []


def test_a_dropped_model_is_freed_with_its_copies(one_rank_group):
    """The copies' hooks hold their owner weakly: a model dropped without release() (a test, a bench,
    a second model in one process) is freed with its copies; a hook that held it strongly made a
    cycle through a tensor's hooks that the collector does not break."""
    model = with_bf16_copies(plain())
    micro_batch_loss(model, batches(1)[0]).backward()
    alive = [weakref.ref(model.compute_copies)] + [weakref.ref(c) for _m, c in model.compute_copies.copy_of.values()]
    del model
    gc.collect()
    assert len(alive) > 1 and all(r() is None for r in alive)


def test_a_backward_that_raised_leaves_nothing_for_the_next_one(one_rank_group):
    """A backward that raises before its end never moves the copies' gradients it made: the next
    block drops them, so after the masters' ``zero_grad`` the next backward gives what a fresh model's
    does (kept, they would be added to its own)."""
    model, fresh = with_bf16_copies(plain()), with_bf16_copies(plain())
    b = batches(1)[0]
    fail = [True]

    def raise_once(grad):
        if fail.pop() if fail else False:
            raise RuntimeError("a backward that fails midway")

    model.module.model.embed_tokens.register_forward_hook(lambda mod, args, out: [out.register_hook(raise_once)] and None)
    with pytest.raises(RuntimeError, match="fails midway"):
        micro_batch_loss(model, b).backward()
    assert model.compute_copies.moves_queued == 1 and any(c.grad is not None for _m, c in model.compute_copies.copy_of.values())
    model.module.zero_grad(set_to_none=True)  # what a caller does after a failed step: the masters only
    micro_batch_loss(model, b).backward()
    micro_batch_loss(fresh, b).backward()
    got, want = dict(model.module.named_parameters()), dict(fresh.module.named_parameters())
    assert all(torch.equal(got[k].grad, want[k].grad) for k in want), [k for k in want if not torch.equal(got[k].grad, want[k].grad)]


def test_a_frozen_master_gets_no_gradient_and_released_copies_come_back(one_rank_group):
    model = with_bf16_copies(plain())
    b = batches(1)[0]
    with torch.no_grad():
        before = float(micro_batch_loss(model, b))  # the copies exist from here
    norm = model.module.model.norm.weight
    norm.requires_grad_(False)
    micro_batch_loss(model, b).backward()
    assert norm.grad is None and model.module.model.layers[0].mlp.up_proj.weight.grad is not None
    alive = [weakref.ref(c) for _m, c in model.compute_copies.copy_of.values()]
    gc.disable()  # freed when released, not at the next collection: nothing refers to a copy but its ComputeCopies
    try:
        model.release_compute_copies()
        assert model.compute_copies.copy_of == {} and alive and all(r() is None for r in alive)
    finally:
        gc.enable()
    with torch.no_grad():
        assert float(micro_batch_loss(model, b)) == before  # made again, from the same masters


def test_a_refresh_inside_the_block_is_refused(one_rank_group):
    model = with_bf16_copies(plain())
    with model.computing():
        with pytest.raises(RuntimeError, match="inside a computing"):
            model.compute_copies.refresh()
    assert {p.dtype for p in model.module.parameters()} == {torch.float32}  # the masters are back in their slots


def test_checkpoints_move_between_fsdp2_and_compute_copies(one_rank_group, tmp_path):
    """A one-worker run resumed under the other mode (e.g. a run begun before compute copies, or a
    GPU run resumed on CPU workers): DCP reshards DTensor shards to plain tensors and back."""
    src = plain(seed=3)
    fsdp = fsdp2_bf16_like(src)
    opt = build_optimizer(fsdp.module, TrainConfig(lr=1e-3), CPU)
    bs = batches(2)
    train_step(fsdp, opt, bs, float(sum(int(b["num_trainable"]) for b in bs)), max_grad_norm=1.0)
    path = str(tmp_path / "ckpt")
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(fsdp.module, opt)
    ckpt_lib.save_shards({"model": msd, "optim": osd}, path, HashingFileSystemWriter(path))
    ckpt_lib.write_state(path, {"step": 1, "world_size": 1}, fsdp.module.config)
    dst = with_bf16_copies(plain(seed=4))
    dst_opt = build_optimizer(dst.module, TrainConfig(lr=1e-3), CPU)
    ckpt_lib.load_sharded(dst.module, dst_opt, path)
    assert all(torch.equal(weights(dst)[k], v) for k, v in weights(fsdp).items())
    moments = [dst_opt.state[p]["exp_avg"] for p in dst.module.parameters()]
    assert len(moments) == len(list(dst.module.parameters())) and all(m.abs().sum() > 0 for m in moments)
    with torch.no_grad():  # and the copies compute with the loaded weights
        assert float(micro_batch_loss(dst, bs[0])) == float(micro_batch_loss(fsdp, bs[0]))


def test_compute_copies_with_cpu_offload_is_refused_naming_the_file_and_field(tmp_path):
    from rayft.config import ConfigError
    from rayft.config_load import load_config

    f = tmp_path / "job.yaml"
    f.write_text("data: {synthetic: {rows: 4}}\nparallel:\n  single_worker: compute_copy\n  cpu_offload: true\n")
    with pytest.raises(ConfigError) as e:
        load_config(f)
    assert str(f) in str(e.value) and "parallel" in str(e.value) and "cpu_offload needs fsdp2" in str(e.value), str(e.value)
    assert ParallelConfig(single_worker="fsdp2", cpu_offload=True).uses_fsdp2(1, "cuda")
    assert not ParallelConfig().uses_fsdp2(1, "cuda") and ParallelConfig().uses_fsdp2(1, "cpu") and ParallelConfig().uses_fsdp2(2, "cuda")


def test_copies_written_is_trusted_only_where_every_master_has_its_copy():
    """What CopyingAdamW's step leaves: masters and copies written in place (no version change).
    ``copies_written`` records that as a cast, so the next block does not cast again; a master whose
    copy is missing or stale (its requires_grad changed) leaves nothing recorded: the next block casts."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    copies = ComputeCopies(module, torch.bfloat16)
    assert copies.copy_for(module[0].weight) is None  # none made yet
    with copies.computing():
        pass
    w = module[0].weight
    copy = copies.copy_for(w)
    assert copy.dtype == torch.bfloat16 and torch.equal(copy, w.detach().to(torch.bfloat16))
    assert copies.copy_for(torch.nn.Parameter(w.detach().clone())) is None  # not a master of this module
    version = w._version
    w.data.add_(1.0)  # an optimizer's in-place write: the version counter stays
    copy.data.fill_(7.0)  # what the step wrote into the copy (here: not the cast, to see that it is kept)
    assert w._version == version
    copies.copies_written()
    with copies.computing():
        assert torch.equal(module[0].weight, torch.full_like(copy, 7.0))  # trusted: not cast again
    module[1].bias.requires_grad_(False)  # its copy no longer fits: copy_for says so
    assert copies.copy_for(module[1].bias) is None
    copies.copies_written()
    assert copies.synced is None
    with copies.computing():  # cast again: every copy is its master's
        assert torch.equal(module[0].weight, w.detach().to(torch.bfloat16))


def test_copying_adamw_says_why_it_cannot_step_an_optimizer():
    from rayft.train.copying_adamw import unsupported_reason

    module = torch.nn.Linear(4, 3)
    ps = list(module.parameters())
    assert unsupported_reason(torch.optim.SGD(ps, lr=0.1)) == "the optimizer is SGD, not AdamW"
    assert unsupported_reason(torch.optim.AdamW(ps, amsgrad=True)) == "AdamW's amsgrad=True"
    assert unsupported_reason(torch.optim.AdamW(ps)) == "AdamW is not fused (its parameters are not all on the GPU)"
    assert unsupported_reason(torch.optim.AdamW(ps, lr=torch.tensor(1e-3), fused=True)) == "a hyperparameter is a tensor"
    assert unsupported_reason(torch.optim.AdamW(ps, fused=True)) == "a parameter is torch.float32 on cpu"
    model = ShardedModel(module, loss=None)  # no compute copies (fp32 compute, or FSDP2): nothing to use it for
    assert model.use_copying_adamw(torch.optim.AdamW(ps)) == "no compute copies: the weights are plain (FSDP2, or fp32 compute)"
    assert model.copying_adamw is None


def test_copies_written_does_not_trust_a_master_written_since_the_cast():
    module = torch.nn.Linear(4, 3)
    bias = module.bias
    copies = ComputeCopies(module, torch.bfloat16)
    with copies.computing():
        pass
    with torch.no_grad():
        bias.add_(5.0)  # e.g. a load between the block's cast and the step: its version moves
    copies.copies_written()
    assert copies.synced is None
    with copies.computing():  # cast again: the copy follows the write
        assert module.bias is not bias and torch.equal(module.bias, bias.detach().to(torch.bfloat16))


def test_copying_adamws_step_counts_are_read_again_after_any_other_write():
    """The host's count of each parameter's steps (the bias corrections) is trusted only while
    ``state["step"]`` is the tensor it counted, unwritten since: torch's own step (the fallback) and
    a load in place both write it."""
    from rayft.train.copying_adamw import CopyingAdamW

    module = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(module.parameters(), fused=True)
    update = CopyingAdamW(opt, ComputeCopies(module, torch.bfloat16))
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # torch's: step 1 on the device, nothing counted on the host
    ps = list(module.parameters())
    assert update._host_counts(ps) == [1, 1]
    t = opt.state[ps[0]]["step"]
    update._counts[id(ps[0])] = (t, t._version, 1)
    opt.step()  # torch's again: the same tensor, written
    assert opt.state[ps[0]]["step"] is t and update._host_counts(ps) == [2, 2]
    update._counts[id(ps[0])] = (t, t._version, 2)
    assert update._host_counts(ps)[0] == 2  # unwritten: the host's count, no read
    update._counts[id(ps[0])] = (t, t._version, 9)
    assert update._host_counts(ps)[0] == 9  # (the host's number is what is used)
    t.copy_(torch.tensor(100.0))  # a load in place (DCP writes into the live state)
    assert update._host_counts(ps)[0] == 100


@pytest.fixture
def interpreted_kernel(monkeypatch):
    """rayft.train.copying_adamw with its kernel built as Triton's interpreter's (TRITON_INTERPRET):
    it runs on CPU tensors. Skips without Triton (CUDA builds of torch bring it; CI's CPU build does not)."""
    pytest.importorskip("triton", reason="Triton's interpreter: pip install triton (CUDA builds of torch bring it)")
    import rayft.train.copying_adamw as copying_adamw

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(copying_adamw, "_KERNEL", None)  # built again, as the interpreter's
    return copying_adamw


def test_the_one_pass_kernel_steps_as_clip_then_adamw_in_tritons_interpreter(interpreted_kernel, monkeypatch):
    """The kernel's arithmetic on the CPU, through Triton's interpreter (TRITON_INTERPRET), against
    the clip and torch's AdamW on the same weights and gradients: clipped and unclipped steps, a
    changing learning rate, weight decay on one group, sizes around the block, and torch's own step
    on the same state in between (the host's counts are read again). The interpreter casts to bf16 by
    truncation, a GPU to nearest even: the copies are compared with the truncated masters here, with
    the cast itself on a GPU (tests/gpu/test_copying_adamw_gpu.py)."""
    copying_adamw = interpreted_kernel
    monkeypatch.setattr(copying_adamw, "BLOCK", 1024)

    def module():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 1024 + 3), torch.nn.LayerNorm(1024 + 3), torch.nn.Linear(1024 + 3, 7, bias=False))

    def adamw(m):
        groups = [
            {"params": [p for p in m.parameters() if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)

    def grads(m, step):
        g = torch.Generator().manual_seed(100 + step)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=g) * (10.0 if step == 1 else 1e-3)  # step 1 clipped

    def close(got, want):  # a few ulps of the tensor's scale: a moment can be a difference of two close terms
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6 * float(want.detach().abs().max()))

    ref, new = module(), module()
    ref_opt, new_opt = adamw(ref), adamw(new)
    copies = ComputeCopies(new, torch.bfloat16)
    with copies.computing():
        pass
    update = copying_adamw.CopyingAdamW(new_opt, copies)
    for step, lr in ((1, 1e-3), (2, 5e-4), (3, 2e-3), (4, 1e-3), (5, 1e-3)):
        for opt in (ref_opt, new_opt):
            for group in opt.param_groups:
                group["lr"] = lr
        grads(ref, step)
        grads(new, step)
        if step == 4:  # torch's own step on the same state, unclipped
            new_opt.step()
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in new.parameters()])
            assert torch.equal(norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
            assert update.step(torch.clamp(1.0 / (norm + 1e-6), max=1.0))
        ref_opt.step()
        for a, b in zip(ref.parameters(), new.parameters()):
            close(b, a)
            close(new_opt.state[b]["exp_avg"], ref_opt.state[a]["exp_avg"])
            close(new_opt.state[b]["exp_avg_sq"], ref_opt.state[a]["exp_avg_sq"])
            assert float(new_opt.state[b]["step"]) == float(ref_opt.state[a]["step"]) == step
            if step != 4:
                truncated = (b.detach().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
                assert torch.equal(copies.copy_for(b), truncated)


def test_optimizer_step_takes_the_one_pass_and_falls_back_where_a_copy_is_missing(interpreted_kernel):
    """``rayft.train.step.optimizer_step`` with ``model.copying_adamw`` (through Triton's interpreter):
    the same weights as the default step (the clip, AdamW, the copies' cast) within a few ulps, the
    copies recorded as cast; where a stepped master has no copy, the default step's arithmetic
    exactly, and its cast."""
    from rayft.train.step import optimizer_step

    copying_adamw = interpreted_kernel

    def build(one_pass: bool):
        torch.manual_seed(3)
        module = torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
        model = ShardedModel(module, loss=None, compute_copies=ComputeCopies(module, torch.bfloat16))
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)
        if one_pass:
            model.copying_adamw = copying_adamw.CopyingAdamW(opt, model.compute_copies)
        return model, opt

    def backward(model, step):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step)) * 50
        with model.computing():
            model.module(x.to(torch.bfloat16)).float().pow(2).sum().backward()

    (ref, ref_opt), (new, new_opt) = build(False), build(True)
    for step in range(3):
        for model, opt in ((ref, ref_opt), (new, new_opt)):
            backward(model, step)
            norm, one_pass = optimizer_step(model, opt, 1.0)
            assert one_pass is (model is new)
        assert float(norm) > 1.0  # clipped
        for a, b in zip(ref.module.parameters(), new.module.parameters()):
            torch.testing.assert_close(b, a, rtol=4e-6, atol=1e-6 * float(a.abs().max()))
            assert b.grad is None
            truncated = (b.detach().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
            kept = new.compute_copies.copy_for(b)
            assert torch.equal(kept, truncated)  # the interpreter's cast (a GPU's rounds to nearest even)
            kept.data.copy_(b.detach().to(torch.bfloat16))  # the GPU's cast, for the next step's forward
        assert new.compute_copies.synced is not None
    # a stepped master without a copy: the default step for all of them (its foreach clip, AdamW, the cast)
    backward(new, 9)
    first = new.module[0].weight
    del new.compute_copies.copy_of[id(first)]
    before = {k: v.detach().clone() for k, v in new.module.state_dict().items()}
    grads = {n: p.grad.clone() for n, p in new.module.named_parameters()}
    twin = torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))
    twin.load_state_dict(before)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    twin_opt.load_state_dict(copy.deepcopy(new_opt.state_dict()))
    for n, p in twin.named_parameters():
        p.grad = grads[n]
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
    twin_opt.step()
    assert optimizer_step(new, new_opt, 1.0)[1] is False  # declined: torch's step ran
    for (n, a), b in zip(twin.named_parameters(), new.module.parameters()):
        assert torch.equal(b, a), n
    with new.computing():  # the missing copy made, every copy cast from its master
        assert torch.equal(new.module[0].weight, first.detach().to(torch.bfloat16))


@pytest.mark.parametrize("betas", [(0.9, 0.95), (0.9, 0.999)])
def test_the_one_pass_rounds_its_bias_corrections_as_torchs_fused_kernel(betas):
    """``1 − β^t`` and its square root in fp32 from the fp32 β, the step size the fp32 of ``lr`` over
    that (fused_adam_utils.cuh's adam_math): numpy's fp32 arithmetic is the reference. At β2 = 0.999
    the fp64 corrections differ (one H100: weights 5.2e-9 apart from fused AdamW's, NOTES §45)."""
    import math

    import numpy as np

    from rayft.train.copying_adamw import _fp32, bias_corrections

    f = np.float32
    b1, b2 = (_fp32(b) for b in betas)
    differs = []
    for step in (1, 2, 3, 10, 1000):
        lr = 2e-3
        step_size, bc2_sqrt = bias_corrections(lr, b1, b2, step)
        bc1 = f(1) - f(b1) ** f(step)
        bc2 = f(1) - f(b2) ** f(step)
        assert step_size == float(f(lr / float(bc1)))
        assert bc2_sqrt == float(np.sqrt(bc2))
        differs.append(bc2_sqrt != _fp32(math.sqrt(1.0 - b2**step)))  # the fp64 correction, as the kernel got it before
    assert differs[0] is False  # β^1 is exact: no rounding to differ by
    assert any(differs)

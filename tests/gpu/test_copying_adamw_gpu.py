"""GPU-only: :class:`rayft.train.copying_adamw.CopyingAdamW` against what it replaces (the clip,
torch's fused AdamW, the compute copies' cast) on the same weights and gradients: the weights and
moments agree to a few ulps, the step counts exactly, each copy is its master cast to bf16 bit for
bit, and the state resumes in torch's AdamW. Runs on the GPU host: ``python3 -m pytest tests/gpu``."""

import copy

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda:0")


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """A few ulps apart, where the ulps are the tensor's scale's: a moment that is a difference of two
    nearly equal terms (b1·m against (1-b1)·g) keeps their rounding, large relative to itself."""
    torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6 * float(want.detach().abs().max()))


def _module(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # sizes around the kernel's block (4096), one not a multiple of 4, 1-D parameters (no weight decay)
    m = torch.nn.Sequential(torch.nn.Linear(97, 4096 + 3), torch.nn.LayerNorm(4096 + 3), torch.nn.Linear(4096 + 3, 7, bias=False))
    return m.to(CUDA)


def _optimizer(m: torch.nn.Module, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    decay = [p for p in m.parameters() if p.ndim >= 2]
    rest = [p for p in m.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-3, betas=betas, eps=1e-8, fused=True)


def _grads(m: torch.nn.Module, step: int) -> None:
    g = torch.Generator(device=CUDA).manual_seed(100 + step)
    scale = 10.0 if step == 1 else 1e-3  # step 1 clipped (norm ≫ 1), the others not
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g, device=CUDA) * scale


@pytest.mark.parametrize("betas", [(0.9, 0.95), (0.9, 0.999)])  # rayft's; torch's and transformers' default
def test_copying_adamw_matches_clip_fused_adamw_and_the_cast(betas):
    from rayft.train.compute_copy import ComputeCopies
    from rayft.train.copying_adamw import CopyingAdamW, unsupported_reason

    ref, new = _module(0), _module(0)
    ref_opt, new_opt = _optimizer(ref, betas), _optimizer(new, betas)
    assert unsupported_reason(new_opt) is None
    copies = ComputeCopies(new, torch.bfloat16)
    with copies.computing():  # makes the copies
        pass
    update = CopyingAdamW(new_opt, copies)
    for step, lr in ((1, 1e-3), (2, 5e-4), (3, 2e-3)):
        for opt in (ref_opt, new_opt):
            for group in opt.param_groups:
                group["lr"] = lr
        _grads(ref, step)
        _grads(new, step)
        norm_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        grads = [p.grad for p in new.parameters()]
        norm = torch.nn.utils.get_total_norm(grads)
        assert torch.equal(norm, norm_ref)
        assert update.step(torch.clamp(1.0 / (norm + 1e-6), max=1.0))
        copies.copies_written()
        for (name, a), b in zip(ref.named_parameters(), new.parameters()):
            close(b, a)
            sa, sb = ref_opt.state[a], new_opt.state[b]
            assert sb["step"].dtype == torch.float32 and sb["step"].device == b.device and float(sb["step"]) == float(sa["step"]) == step
            close(sb["exp_avg"], sa["exp_avg"])
            close(sb["exp_avg_sq"], sa["exp_avg_sq"])
            assert torch.equal(copies.copy_for(b), b.detach().to(torch.bfloat16)), f"step {step}: {name}'s copy"
        assert copies.synced is not None  # the next block does not cast again
    # the state is torch's AdamW's: it resumes there (a copy of it: load_state_dict keeps the tensors it is given)
    again = _module(1)
    again.load_state_dict(new.state_dict())
    again_opt = _optimizer(again)
    again_opt.load_state_dict(copy.deepcopy(new_opt.state_dict()))
    again_copies = ComputeCopies(again, torch.bfloat16)
    with again_copies.computing():
        pass
    for m in (new, again):
        _grads(m, 4)
    new_opt.step()  # torch's own step 4 on CopyingAdamW's state; `update` must read the count again
    assert CopyingAdamW(again_opt, again_copies).step(None)  # a loaded state: its counts read from the device
    for a, b in zip(new.parameters(), again.parameters()):
        close(b, a)
        assert float(again_opt.state[b]["step"]) == float(new_opt.state[a]["step"]) == 4.0
    for m in (new, again):
        _grads(m, 5)
    assert update.step(None)  # step 5 after torch's step 4 on the same tensors
    again_opt.step()
    for a, b in zip(new.parameters(), again.parameters()):
        close(a, b)
        assert float(new_opt.state[a]["step"]) == 5.0

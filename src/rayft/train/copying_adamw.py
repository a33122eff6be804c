"""AdamW for one worker's compute copies: the clip, the update and the copies' cast in one pass.

With compute copies (:mod:`rayft.train.compute_copy`) an optimizer step is three passes over the
fp32 state after the gradient norm: the clip multiplies every gradient (read and write, 4 + 4 bytes
per parameter), torch's fused AdamW reads the weight, gradient and both moments and writes three of
them back (16 + 12), and the copies' cast reads the weights again and writes the bf16 copies (4 + 2).
That is 42 bytes per parameter where one pass needs 30: read weight, gradient and moments, write
weight, moments and the copy. On the 1.5B preset that is 18.5 GB a step, ~5 ms of a ~560 ms step on
one H200 (predicted in bench/NOTES.md §39).

:class:`CopyingAdamW` runs that one pass, a Triton kernel per parameter, on the same
``torch.optim.AdamW`` object and its state: ``state["step"]`` (fp32, on the device, as fused
AdamW keeps it), ``exp_avg`` and ``exp_avg_sq``, made as AdamW makes them. Checkpoints, the
learning-rate schedule and a resume see the optimizer they always saw. The arithmetic is AdamW's
(decoupled weight decay, bias-corrected moments), in fp32 with correctly rounded square root and
division; from the betas as fp32, as torch's fused kernel reads them, with the bias corrections
rounded as that kernel rounds them (:func:`bias_corrections`, made on the host), and the compilers
contract the products differently, so the two agree to a few ulps, not bit for bit (tests/gpu/test_copying_adamw_gpu.py). The gradient times the clip coefficient is the
clip's own fp32 product, and each copy is its new master cast to the copy's dtype (round to nearest
even), as ``Tensor.copy_`` casts it.

Used with ``train.one_pass_adamw: true`` (the default since bench/NOTES.md §43 measured it on a GPU) where
:func:`unsupported_reason` finds nothing in the way: CUDA, Triton, a fused AdamW without amsgrad,
maximize, capturable or differentiable, hyperparameters that are numbers, contiguous fp32 masters;
elsewhere the step is the clip, ``optimizer.step()`` and the copies' cast as before. Its arithmetic
is checked on the CPU through Triton's interpreter (tests/unit/test_compute_copy.py) and on a GPU
by tests/gpu/test_copying_adamw_gpu.py.
"""

from __future__ import annotations

import math
import struct

import torch

from rayft.train.compute_copy import ComputeCopies

#: elements per Triton program (8 warps: 16 per thread, in 16-byte loads of fp32)
BLOCK = 4096


def _kernel():
    """The Triton kernel, built on first use (Triton is imported only where a GPU step needs it)."""
    global _KERNEL
    if _KERNEL is None:
        import triton
        import triton.language as tl

        @triton.jit
        def adamw_copy(
            p_ptr,
            g_ptr,
            m_ptr,
            v_ptr,
            c_ptr,
            coef_ptr,
            n,
            decay,
            beta1,
            beta2,
            one_minus_beta1,
            one_minus_beta2,
            eps,
            step_size,
            bc2_sqrt,
            HAS_COEF: tl.constexpr,
            BLOCK: tl.constexpr,
        ):
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            p = tl.load(p_ptr + offs, mask=mask)
            g = tl.load(g_ptr + offs, mask=mask)
            if HAS_COEF:
                g = g * tl.load(coef_ptr)
            m = tl.load(m_ptr + offs, mask=mask)
            v = tl.load(v_ptr + offs, mask=mask)
            p = p - decay * p
            m = beta1 * m + one_minus_beta1 * g
            v = beta2 * v + one_minus_beta2 * g * g
            denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
            p = p - step_size * tl.div_rn(m, denom)
            tl.store(p_ptr + offs, p, mask=mask)
            tl.store(m_ptr + offs, m, mask=mask)
            tl.store(v_ptr + offs, v, mask=mask)
            tl.store(c_ptr + offs, p.to(c_ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)

        _KERNEL = adamw_copy
    return _KERNEL


_KERNEL = None


def _fp32(x: float) -> float:
    """``x`` rounded to the nearest fp32 value, as a Python float (exactly representable)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def bias_corrections(lr: float, beta1: float, beta2: float, step: int) -> tuple[float, float]:
    """AdamW's step size ``lr / (1 − β1^t)`` and ``sqrt(1 − β2^t)`` for step ``t``, rounded as torch's
    fused CUDA AdamW rounds them (adam_math, fused_adam_utils.cuh): ``β^t`` as fp32 (``powf`` of the
    fp32 β), ``1 − β^t`` and its square root in fp32, the step size the fp32 of ``lr`` (double) over
    that fp32 correction. In fp64 instead, at β2 = 0.999 and step 2 (one fp32 ulp of β2² is 3e-5 of
    ``1 − β2²``), the weights came out up to 5.2e-9 apart from fused AdamW's (one H100, bench/NOTES.md
    §45). ``beta1``, ``beta2``: already fp32 (:func:`_fp32`). Returns ``(step_size, bc2_sqrt)``, each an
    fp32 value as a Python float."""
    bc1 = _fp32(1.0 - _fp32(beta1**step))
    bc2 = _fp32(1.0 - _fp32(beta2**step))
    return _fp32(lr / bc1), _fp32(math.sqrt(bc2))


def _flat_like(t: torch.Tensor | None, p: torch.Tensor) -> bool:
    """``t`` can be read as ``p``'s elements in ``p``'s order: a contiguous fp32 tensor of its shape on its device."""
    return t is not None and t.shape == p.shape and t.dtype == torch.float32 and t.device == p.device and t.is_contiguous()


def unsupported_reason(optimizer: torch.optim.Optimizer) -> str | None:
    """Why :class:`CopyingAdamW` cannot run this optimizer's steps (None: it can)."""
    if not isinstance(optimizer, torch.optim.AdamW):
        return f"the optimizer is {type(optimizer).__name__}, not AdamW"
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "capturable", "differentiable"):
            if group.get(flag):
                return f"AdamW's {flag}=True"
        if not group.get("fused"):
            return "AdamW is not fused (its parameters are not all on the GPU)"
        if any(isinstance(group[k], torch.Tensor) for k in ("lr", "weight_decay", "eps")) or any(
            isinstance(b, torch.Tensor) for b in group["betas"]
        ):
            return "a hyperparameter is a tensor"
        for p in group["params"]:
            if p.device.type != "cuda" or p.dtype != torch.float32 or not p.is_contiguous():
                return f"a parameter is {p.dtype} on {p.device}{'' if p.is_contiguous() else ', not contiguous'}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None


class CopyingAdamW:
    """One AdamW step of ``optimizer`` (a fused ``torch.optim.AdamW``) over the parameters that have
    a gradient, which also writes each one's compute copy in ``copies``: see the module's docstring.

    The step counts are kept on the host, per parameter, so that the bias corrections are host
    numbers: read from ``state["step"]`` (one read for every parameter not counted yet) whenever
    that tensor is not the one this object last counted, or was written since (its version counter:
    torch's own ``optimizer.step()``, a load in place); ``state["step"]`` is still counted up on the
    device, for checkpoints. Hooks registered on the optimizer's ``step`` do not run.
    """

    def __init__(self, optimizer: torch.optim.AdamW, copies: ComputeCopies):
        self.optimizer, self.copies = optimizer, copies
        # id(parameter) -> (its state's step tensor, held so that its id is not reused; that tensor's
        # version after this object's last count; the count it holds)
        self._counts: dict[int, tuple[torch.Tensor, int, int]] = {}

    def step(self, clip_coef: torch.Tensor | None) -> bool:
        """Queue one step; ``clip_coef``: fp32 0-d on the device (each gradient's factor: the
        clip's, at most 1) or None. Returns False, having done nothing, when a parameter with a
        gradient has no compute copy of its shape (the caller then steps as before)."""
        work = []
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                copy = self.copies.copy_for(p)
                if copy is None or copy.shape != p.shape or not copy.is_contiguous() or not _flat_like(p.grad, p):
                    return False
                state = self.optimizer.state[p]
                if state and not all(_flat_like(state.get(k), p) for k in ("exp_avg", "exp_avg_sq")):
                    return False  # a loaded state of another layout: AdamW's own step reads it
                work.append((group, p, copy))
        if not work:
            return True
        for _group, p, _copy in work:
            state = self.optimizer.state[p]
            if not state:  # as AdamW's _init_group makes them for a fused step
                state["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                self._counts[id(p)] = (state["step"], state["step"]._version, 0)
        counts = self._host_counts([p for _g, p, _c in work])
        steps = [self.optimizer.state[p]["step"] for _g, p, _c in work]
        torch._foreach_add_(steps, 1.0)
        kernel = _kernel()
        coef = clip_coef if clip_coef is not None else steps[0]  # an unread pointer without a coefficient
        for (group, p, copy), t, count in zip(work, steps, counts):
            step = count + 1
            self._counts[id(p)] = (t, t._version, step)
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            # torch's fused CUDA AdamW, which this step stands in for, reads its betas as fp32 and makes 1 − β and
            # the bias corrections from those (adam_math, fused_adam_utils.cuh): so do the moments and corrections
            # here. 1 − fp32(β) is exact in fp64. From the double betas instead, exp_avg_sq at β2 = 0.999 came out
            # 1.3e-5 apart from fused AdamW's (one H200, bench/NOTES.md §44)
            beta1, beta2 = (_fp32(b) for b in group["betas"])
            state = self.optimizer.state[p]
            n = p.numel()
            kernel[((n + BLOCK - 1) // BLOCK,)](
                p,
                p.grad,
                state["exp_avg"],
                state["exp_avg_sq"],
                copy,
                coef,
                n,
                lr * wd,
                beta1,
                beta2,
                1.0 - beta1,
                1.0 - beta2,
                eps,
                *bias_corrections(lr, beta1, beta2, step),
                HAS_COEF=clip_coef is not None,
                BLOCK=BLOCK,
                num_warps=8,
            )
        return True

    def _host_counts(self, params: list[torch.Tensor]) -> list[int]:
        """Each parameter's step count before this step: the host's, where the state's step tensor
        is the one it counted and unwritten since; the others read from the device in one copy (a
        fresh state is counted when made, so only a loaded or otherwise stepped one is read)."""
        out: list[int | None] = []
        unknown = []
        for p in params:
            t = self.optimizer.state[p]["step"]
            held = self._counts.get(id(p))
            out.append(held[2] if held is not None and held[0] is t and held[1] == t._version else None)
            if out[-1] is None:
                unknown.append(len(out) - 1)
        if unknown:
            read = torch.stack([self.optimizer.state[params[i]]["step"].reshape(()) for i in unknown]).tolist()
            for i, v in zip(unknown, read):
                out[i] = int(v)
        return out  # type: ignore[return-value]

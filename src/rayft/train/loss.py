"""The training loss: summed next-token cross-entropy, without materialising fp32 logits.

A micro-batch of 8 × 2048 tokens over Qwen2.5's 151,936-token vocabulary has 2.5 G logits: 10 GB
in fp32 before the backward pass doubles it. The ``fused`` implementation (liger-kernel's fused
linear cross-entropy) computes the LM head and the loss chunk by chunk and never holds them all;
``torch`` is the plain reference (one matmul, fp32 log-softmax) and the CPU path.

:class:`TokenLoss` is the loss as a typed value; on the FSDP2 root it runs as a method registered
with ``register_fsdp_forward_method`` (:func:`enable_sharded_token_loss`), so the root's
parameters (embedding, final norm, LM head) are gathered around it exactly as around ``forward``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rayft.data.packing import IGNORE_INDEX


def fused_available(device: torch.device) -> bool:
    """True when liger-kernel's fused linear cross-entropy can run on ``device`` (CUDA + liger_kernel)."""
    if device.type != "cuda":
        return False
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except ImportError:
        return False
    return True


# Output-layer transforms some architectures apply to the logits (Gemma soft-capping, Cohere and
# Granite scaling): the plain head-matmul loss would be wrong for them.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def logit_transforms(model_config) -> list[str]:
    """The logit transforms ``model_config`` uses (see ``_LOGIT_TRANSFORMS``)."""
    return [f"{f}={getattr(model_config, f)}" for f in _LOGIT_TRANSFORMS if getattr(model_config, f, None) not in (None, 1, 1.0)]


def resolve_cross_entropy(name: str, device: torch.device, model_config=None) -> str:
    """``auto`` → ``fused`` where :func:`fused_available`, else ``torch``; either becomes ``hf``
    (the model's own forward computes the logits, then plain cross-entropy) for a model with a
    logit transform (:func:`logit_transforms`).

    Raises:
        ValueError: ``fused`` asked for where it cannot run or for a model it would get wrong.
    """
    transforms = logit_transforms(model_config) if model_config is not None else []
    if name == "fused" and transforms:
        raise ValueError(f"train.cross_entropy=fused does not apply this model's {', '.join(transforms)}; use torch")
    if name == "fused" and not fused_available(device):
        raise ValueError("train.cross_entropy=fused needs a CUDA device and the liger-kernel package (pip install liger-kernel)")
    if transforms:
        return "hf"
    if name == "auto":
        return "fused" if fused_available(device) else "torch"
    return name


def fused_options(chunk_mem: int) -> dict:
    """Keyword arguments for liger's fused loss: ``chunk_mem_const=chunk_mem`` where the installed
    liger-kernel has that parameter (0.8 and later), else nothing (its fixed chunking), with a
    warning when ``chunk_mem`` asked for more than liger's default of 1.

    liger splits the ``BT`` tokens into chunks of ``next_pow2(ceil(BT / ceil(V / (chunk_mem · H))))``
    rows (``V`` vocabulary, ``H`` hidden size) and, per chunk, adds the chunk's LM-head gradient
    into one fp32 ``V × H`` accumulator; fewer, larger chunks read and write that accumulator
    fewer times. Qwen2.5-1.5B, 32,768 tokens: chunks of 512 rows at 1, 4,096 at 8.
    """
    import inspect

    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    if "chunk_mem_const" in inspect.signature(liger_fused_linear_cross_entropy).parameters:
        return {"chunk_mem_const": int(chunk_mem)}
    if chunk_mem != 1:
        import warnings

        warnings.warn(
            f"train.fused_loss_chunk_mem={chunk_mem}: this liger-kernel has no chunk_mem_const; its default chunking runs", stacklevel=2
        )
    return {}


@dataclass(frozen=True)
class TokenLoss:
    """The training loss as a value: which implementation runs and liger's options.

    ``impl``: ``fused`` (liger's fused linear cross-entropy, chunked by ``fused_options``:
    :func:`fused_options`), ``torch`` (head matmul + fp32 cross-entropy) or ``hf`` (the model's own
    logits, for models with a logit transform). ``fused_options``: extra keyword arguments for
    liger's function (``{"chunk_mem_const": n}`` or empty).
    """

    impl: str
    fused_options: dict = field(default_factory=dict)

    @classmethod
    def create(cls, impl: str, chunk_mem: int = 1) -> TokenLoss:
        """``impl`` with liger's chunking ``chunk_mem`` (used by ``fused`` only; warns as
        :func:`fused_options` does)."""
        return cls(impl, fused_options(chunk_mem) if impl == "fused" else {})

    @property
    def chunk_mem(self) -> int | None:
        """liger's ``chunk_mem_const`` as passed (None: not the fused loss, or a liger without it)."""
        return self.fused_options.get("chunk_mem_const")

    def compute(self, model: torch.nn.Module, input_ids, position_ids, labels, trained_positions=None, **attn_kwargs) -> torch.Tensor:
        """The fp32 sum of cross-entropies over targets ≠ −100 (a 0-d tensor) of the causal LM
        ``model`` (an unsharded one, or called through :func:`enable_sharded_token_loss`'s method).

        Shapes: ``input_ids``, ``position_ids``, ``labels`` int64 [B, L], labels already shifted;
        ``trained_positions`` (optional) int64 [T]: the flat indices into ``B·L`` of the targets
        ≠ −100, ascending (:func:`rayft.data.packing.collate` builds them on the host, so their count
        is known without a device sync); ``attn_kwargs`` (e.g. ``cu_seq_lens``) reach the attention layers.

        With ``trained_positions``, the ``fused`` and ``torch`` losses run the LM head over those
        ``T`` positions only: prompt and padding positions, whose targets are −100, add nothing to the
        sum and cost the head's ``2·H·V`` FLOPs (×3 with backward) each; the sum is the same.
        """
        target = labels.flatten()
        if self.impl == "hf":  # the model's forward applies its own logit transform
            logits = model.forward(input_ids=input_ids, position_ids=position_ids, **attn_kwargs).logits
            return F.cross_entropy(logits.flatten(0, 1).float(), target, ignore_index=IGNORE_INDEX, reduction="sum")
        hidden = model.model(input_ids=input_ids, position_ids=position_ids, **attn_kwargs).last_hidden_state.flatten(0, 1)
        if trained_positions is not None and trained_positions.numel() < target.numel():
            hidden, target = hidden.index_select(0, trained_positions), target.index_select(0, trained_positions)
        weight = model.get_output_embeddings().weight
        # (under no_grad liger would still build gradients; with no row it would divide by zero)
        if self.impl == "fused" and torch.is_grad_enabled() and target.numel():
            from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

            return liger_fused_linear_cross_entropy(
                hidden, weight, target, ignore_index=IGNORE_INDEX, reduction="sum", accum_dtype=torch.float32, **self.fused_options
            ).float()
        logits = F.linear(hidden, weight).float()
        return F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum")


SHARDED_LOSS_METHOD = "token_loss_sum"


def _token_loss_sum(self, loss: TokenLoss, input_ids, position_ids, labels, trained_positions=None, **attn_kwargs):
    return loss.compute(self, input_ids, position_ids, labels, trained_positions, **attn_kwargs)


def enable_sharded_token_loss(model: torch.nn.Module) -> None:
    """Make ``model.token_loss_sum(loss, input_ids, position_ids, labels, trained_positions, **kw)`` run ``loss`` on the
    FSDP2 root ``model`` with its parameters gathered.

    Why a method on the module: FSDP2 gathers the root's parameters (embedding, final norm, LM head)
    only around ``forward`` and around methods registered with ``register_fsdp_forward_method``,
    and the loss reads the LM head outside ``forward`` (the fused loss never materialises the
    logits). The method holds no state: the :class:`TokenLoss` is passed in at each call (see
    :class:`rayft.train.model.ShardedModel`, which does that).
    """
    from torch.distributed.fsdp import register_fsdp_forward_method

    setattr(model, SHARDED_LOSS_METHOD, types.MethodType(_token_loss_sum, model))
    register_fsdp_forward_method(model, SHARDED_LOSS_METHOD)

"""Per-GPU memory of a training config, predicted before anything starts (``rayft fit``).

What it predicts is the peak of ``torch.cuda.max_memory_allocated`` on one GPU (what the run's
metrics report as ``peak_mem_gib``), as the sum of the tensors alive at the step's three high-water
marks, from the model's config alone (parameter counts come from the model built on the meta device):

* **sharded state**: fp32 parameters and AdamW's two fp32 moments, 12 bytes × P ÷ GPUs, and the fp32
  gradients, 4 bytes × P ÷ GPUs, which exist from the step's reduce-scatter until the optimizer step
  sets them to None: never at the forward's peak, all of them at the end of the backward pass. With
  ``train.grad_accum_steps`` > 1 the micro-batches before the last run without gradient sync, and
  FSDP2 keeps every layer's whole gradient in fp32 on each GPU meanwhile: 4 bytes × P, not ÷ GPUs
  (in host memory with ``parallel.cpu_offload``: then 0 on the GPU, and the host's share is
  :func:`offload_host_bytes`, the pinned shards rounded up as PyTorch's host allocator does, plus
  the plain copy an async checkpoint save stages, 12 bytes × P ÷ GPUs; not measured yet).
* **weights for compute**: bf16 copies FSDP2 all-gathers: the root's (embedding, LM head, final norm)
  for the whole step, and two decoder layers (the one computing and the one prefetched); every
  layer's with ``parallel.reshard_after_forward: false``; on one GPU without FSDP2
  (``parallel.single_worker``) a compute copy of every weight, kept (:mod:`rayft.train.compute_copy`).
* **activations** kept for the backward pass, bytes per token per decoder layer, counted tensor by
  tensor for a Llama-style layer (bf16; flash/varlen attention saves q, k, v and its output):
  ``n_norms × 4H + 4Q + 4KV + 6I`` with ``torch.compile`` or liger kernels (each norm keeps its input
  and output, SwiGLU its gate, up and product), ``n_norms × 8H + 4Q + 4KV + 8I`` eager (transformers'
  RMSNorm keeps an fp32 copy of its input, the MLP also keeps ``silu(gate)``); ``+ 2Q + 2KV`` for
  Qwen3's q/k norms. H: hidden size, Q: heads × head_dim, KV: key/value heads × head_dim, I: MLP
  width. A checkpointed layer keeps only its input (2H), and the backward pass recomputes one
  layer's activations at a time.
* **loss**: liger's fused loss holds a chunk of logits (``C × V`` bf16, C = liger's chunk of the
  micro-batch's tokens × ``train.fused_loss_chunk_mem``), the fp32 gradient of its input (4H per token)
  and of the LM head (4 × V × H); the plain loss holds the whole logits: 10 bytes × tokens × V
  (bf16 logits, the fp32 log-softmax and its gradient). Counted over every token of the
  micro-batch: the loss runs over its trained positions only (:mod:`rayft.train.loss`), so these
  bound it.

The peak is the largest of three moments: the end of the forward pass (all activations and the
loss), the backward pass of the last layer (activations, one layer recomputed with checkpointing,
that layer's unsharded bf16 gradient and its fp32 copy for the reduce-scatter, the hidden-state
gradient), and the end of the backward pass (every other unit's gradient shard, and the root's
gradients — embedding, LM head, final norm — in the compute dtype and their fp32 reduce-scatter
input, the root's gathered weights freed first; on one GPU the input and its reduced copy; without
FSDP2, the compute copies' last group of gradients, moved into fp32 when the backward ends).
Beyond the allocated peak a GPU needs the CUDA context and NCCL's buffers, and the caching
allocator keeps freed blocks: :data:`RUNTIME_BYTES` and :data:`ALLOCATOR_SLACK` go on top for the
verdict.

Not modelled: float8 (activations are counted as bf16: an upper bound; measured 27% lower on the
1.5B at 32,768 tokens per GPU), Gemma 2's full logits (counted as the plain loss), padding mode (a
micro-batch is counted as ``micro_batch_size × seq_len`` tokens: the most it holds).
Validated against every measured peak in bench/results: ``bench/fit_check.py``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

#: the CUDA context, cuBLAS workspaces and NCCL's buffers: outside PyTorch's allocator, bytes
RUNTIME_BYTES = int(1.5 * 2**30)
#: the caching allocator's free blocks at the peak, as a fraction of the allocated peak (measured
#: reserved ÷ allocated on the L4 emulation: 1.03–1.45, 1.12 at the fitting points)
ALLOCATOR_SLACK = 0.10
#: the share of an instance's memory that offloaded shards may take (the rest: the OS, Ray, the
#: workers' processes, pinned staging buffers)
HOST_USABLE = 0.8


@dataclass(frozen=True)
class ModelDims:
    """A decoder-only model's sizes: counts of parameters (P: unique; per layer; root: outside the
    decoder layers), widths (H, Q, KV, I as above), vocabulary V, layer count L, norms per layer."""

    params: int
    params_layer: int
    params_root: int
    hidden: int
    q_dim: int
    kv_dim: int
    intermediate: int
    vocab: int
    layers: int
    norms_per_layer: int = 2
    qk_norm: bool = False
    model_type: str = ""
    #: each unique parameter's (rows, elements per row): the shard sizes for CPU offload's host memory
    param_shapes: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class TrainShape:
    """The settings that set memory: GPUs sharing the model, tokens per micro-batch, and the switches."""

    gpus: int
    micro_batch_size: int
    seq_len: int
    activation_checkpointing: bool | int = False
    compiled: bool = False
    liger: bool = False
    fused_loss: bool = True
    fused_loss_chunk_mem: int = 8
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    float8: bool = False
    compute_bytes: int = 2  # parallel.param_dtype: 2 (bfloat16) or 4 (float32)
    #: checkpoint.async_save with CPU offload: each save stages a plain host copy of the rank's state
    async_save_copy: bool = False
    #: train.grad_accum_steps: above 1, every layer's whole fp32 gradient is held between micro-batches
    grad_accum_steps: int = 1
    #: one GPU without FSDP2 (parallel.single_worker; never with cpu_offload): the module computes with
    #: a bf16 copy of every weight, kept allocated (with fp32 compute, with the fp32 weights themselves)
    without_fsdp2: bool = False

    @property
    def copy_bytes(self) -> int:
        """Bytes per parameter of the compute copies one GPU without FSDP2 keeps (0: none)."""
        return self.compute_bytes if self.without_fsdp2 and not self.cpu_offload and self.compute_bytes < 4 else 0

    @property
    def tokens(self) -> int:
        return self.micro_batch_size * self.seq_len


@dataclass
class MemoryPlan:
    """A prediction for one GPU: ``parts`` (name → bytes, at the peak phase), ``peak`` (allocated
    bytes), ``phase`` (where the peak is), ``host_per_gpu`` (bytes of host memory each GPU's shards
    take with CPU offload, else 0)."""

    parts: dict[str, int]
    phase: str
    host_per_gpu: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    def needed(self) -> int:
        """Bytes of GPU memory the run needs: the allocated peak, the allocator's slack, the runtime."""
        return int(self.peak * (1 + ALLOCATOR_SLACK)) + RUNTIME_BYTES


def activation_bytes_per_token_layer(m: ModelDims, s: TrainShape) -> int:
    """Bytes one decoder layer keeps per token for its backward pass (no checkpointing)."""
    lean = s.compiled or s.liger
    norms = m.norms_per_layer * (4 if lean else 8) * m.hidden
    mlp = (6 if lean else 8) * m.intermediate
    qk = 2 * m.q_dim + 2 * m.kv_dim if m.qk_norm else 0
    return (norms + 4 * m.q_dim + 4 * m.kv_dim + mlp + qk) * s.compute_bytes // 2


def checkpointed_layer_count(layers: int, setting: bool | int) -> int:
    """How many of ``layers`` a ``train.activation_checkpointing`` setting checkpoints (0, k, 2k, ...)."""
    if setting is False:
        return 0
    every = 1 if setting is True else int(setting)
    return math.ceil(layers / every)


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int, chunk_mem: int) -> int:
    """Tokens per chunk of liger's fused linear cross-entropy with ``chunk_mem_const=chunk_mem``: the
    next power of two of ``⌈tokens ÷ ⌈V ÷ (chunk_mem · H)⌉⌉`` (:func:`rayft.train.loss.fused_options`),
    at most ``tokens``."""
    inc = math.ceil(vocab / (chunk_mem * hidden))
    return min(tokens, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(tokens / inc))))))


def offload_host_bytes(m: ModelDims, gpus: int) -> int:
    """Host memory one GPU's shards take with ``parallel.cpu_offload``, bytes: the fp32 parameter
    shards and the fp32 gradient shards (each in pinned memory, which PyTorch's caching host
    allocator hands out in blocks rounded up to a power of two), and AdamW's two fp32 moments
    (ordinary memory). A shard holds ⌈rows ÷ gpus⌉ rows (``torch.chunk``, as FSDP2 shards).
    Without :attr:`ModelDims.param_shapes`: 16 bytes × P ÷ gpus (no rounding)."""
    if not m.param_shapes:
        return 16 * m.params // gpus
    pinned = plain = 0
    for rows, per_row in m.param_shapes:
        shard = 4 * math.ceil(rows / gpus) * per_row
        pinned += 1 << max(0, math.ceil(math.log2(shard))) if shard else 0
        plain += shard
    return 2 * pinned + 2 * plain


def plan_memory(m: ModelDims, s: TrainShape) -> MemoryPlan:
    """The predicted per-GPU allocated peak of one training step (see the module docstring)."""
    t, n = s.tokens, s.gpus
    parts_common: dict[str, int] = {}
    host = 0
    # the sharded fp32 gradients exist from the step's reduce-scatter (its last micro-batch's
    # backward) until the optimizer step sets them to None: never at the forward's peak
    if s.cpu_offload:
        # an async save stages a copy of the offloaded fp32 weights and AdamW moments (12 bytes per
        # parameter ÷ GPUs) in plain host memory while it writes
        host = offload_host_bytes(m, n) + (12 * m.params // n if s.async_save_copy else 0)
    else:
        parts_common["sharded fp32 weights and AdamW moments"] = 12 * m.params // n
    if s.grad_accum_steps > 1:
        # micro-batches before the last run without gradient sync: FSDP2 keeps each layer's whole
        # gradient in fp32 (the reduce dtype) on the GPU, added to by the next, until the last reduces
        parts_common["unsharded fp32 gradients accumulated between micro-batches"] = 4 * m.params
    plain = s.without_fsdp2 and not s.cpu_offload  # CPU offload always runs under FSDP2
    if plain:
        parts_common["compute copies of every weight (rayft.train.compute_copy)"] = s.copy_bytes * m.params
    else:
        gathered = m.params if not s.reshard_after_forward else m.params_root + 2 * m.params_layer
        parts_common["bf16 weights gathered for compute" if s.compute_bytes == 2 else "fp32 weights gathered for compute"] = (
            s.compute_bytes * gathered
        )
    a = activation_bytes_per_token_layer(m, s)
    n_ckpt = checkpointed_layer_count(m.layers, s.activation_checkpointing)
    saved = t * ((m.layers - n_ckpt) * a + n_ckpt * 2 * m.hidden)
    parts_common["activations kept for backward"] = saved

    if s.fused_loss:
        chunk = liger_chunk_tokens(t, m.hidden, m.vocab, s.fused_loss_chunk_mem)
        loss = {"loss: logits chunk": s.compute_bytes * chunk * m.vocab, "loss: input gradient (fp32)": 4 * t * m.hidden}
        head_grad = 4 * m.vocab * m.hidden
    else:
        loss = {"loss: whole logits (logits + fp32 log-softmax + gradient)": (s.compute_bytes + 8) * t * m.vocab}
        head_grad = s.compute_bytes * m.vocab * m.hidden
    forward_end = {**parts_common, **loss, "LM head gradient": head_grad}

    recompute = a * t if n_ckpt else 0
    backward = {
        **parts_common,
        "LM head gradient": s.compute_bytes * m.vocab * m.hidden,
        "one layer recomputed (checkpointing)": recompute,
        "one layer's gradient (compute dtype + fp32 to reduce)": (s.compute_bytes + 4) * m.params_layer,
        "hidden-state gradient": (s.compute_bytes + 4) * t * m.hidden,
    }
    # the root (embedding, LM head, final norm) reduces last, after autograd finished: FSDP2 frees its
    # gathered weights, then copies its gradients (compute dtype) into one fp32 reduce-scatter input,
    # every other unit's gradient shard already there; on one GPU the reduced output is a copy made
    # while that input lives, and the compute-dtype gradients are freed first
    rest = m.params - m.params_root
    if plain:
        from rayft.train.compute_copy import GRAD_GROUP_BYTES

        # the copies' gradients are handed to their fp32 masters in groups of GRAD_GROUP_BYTES, the last
        # when the backward ends: the LM head's (the embedding's, tied), made last, waits in it
        group = GRAD_GROUP_BYTES if s.copy_bytes else 0
        if s.copy_bytes and s.grad_accum_steps > 1:  # a later micro-batch's group is cast into an fp32 scratch before its add
            group += GRAD_GROUP_BYTES * 4 // s.copy_bytes
        root = {
            "compute copies of every weight (rayft.train.compute_copy)": s.copy_bytes * m.params,
            "the root's fp32 gradients and the LM head's in the compute dtype": 4 * m.params_root + s.copy_bytes * m.vocab * m.hidden,
            "the compute copies' last group of gradients (and its fp32 scratch)": group,
        }
    elif n == 1:
        root = {"the root's fp32 reduce-scatter input and its reduced copy": 8 * m.params_root}
    else:
        root = {"the root's gradients (compute dtype) and their fp32 reduce-scatter input": (s.compute_bytes + 4) * m.params_root}
    backward_end = {
        "sharded fp32 weights and AdamW moments": 0 if s.cpu_offload else 12 * m.params // n,
        "every other unit's fp32 gradient shard": 0 if s.cpu_offload else 4 * rest // n,
        **root,
    }
    phases = [
        (forward_end, "end of the forward pass (all activations, the loss)"),
        (backward, "backward pass of the last layer"),
        (backward_end, "end of the backward pass (every sharded gradient)"),
    ]
    parts, phase = max(phases, key=lambda p: sum(p[0].values()))
    plan = MemoryPlan(parts, phase, host)
    plan.parts = {k: v for k, v in plan.parts.items() if v}
    if s.float8:
        plan.notes.append("train.float8: activations counted as bf16 (an upper bound)")
    if m.model_type == "gemma2" and s.fused_loss:
        plan.notes.append("Gemma 2 soft-caps its logits: the fused loss does not apply, whole logits counted")
    return plan


def largest_micro_batch(m: ModelDims, s: TrainShape, target: GpuTarget, limit: int = 4096) -> int:
    """The largest ``micro_batch_size`` (rows of ``seq_len``) whose plan fits ``target``
    (:meth:`GpuTarget.room`); 0 when not even one row fits."""
    from dataclasses import replace

    def fits(mb: int) -> bool:
        return target.room(plan_memory(m, replace(s, micro_batch_size=mb)))

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def model_dims(conf) -> ModelDims:
    """:class:`ModelDims` of a transformers config: the model built on the meta device for its
    parameter counts (unique parameters: a tied LM head counts once), or the sizes this host
    counted before for the same config (:mod:`rayft.train.dims_memo`: the build imports the model's
    modules, seconds of a run's start)."""
    from rayft.train import dims_memo
    from rayft.train.model_config import decoder_layers

    key = dims_memo.memo_key(conf, ModelDims, counted_by=(count_model_dims, decoder_layers))
    if key is not None and (dims := dims_memo.recall(key, ModelDims)) is not None:
        return dims
    dims = count_model_dims(conf)
    if key is not None:
        dims_memo.remember(key, dims)
    return dims


def count_model_dims(conf) -> ModelDims:
    """:func:`model_dims` counted: the model built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from rayft.train.model_config import decoder_layers

    with torch.device("meta"):  # a copy: from_config writes its dtype into the config it is given
        model = AutoModelForCausalLM.from_config(copy.deepcopy(conf), dtype=torch.float32)
    total = sum(p.numel() for p in model.parameters())
    shapes = tuple((p.shape[0], p.numel() // p.shape[0]) if p.dim() else (1, 1) for p in model.parameters())
    layers = decoder_layers(model)
    per_layer = sum(p.numel() for p in layers[0].parameters())
    text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv = getattr(text, "num_key_value_heads", None) or heads
    norms = sum(1 for name, _ in layers[0].named_children() if "layernorm" in name)
    return ModelDims(
        params=total,
        params_layer=per_layer,
        params_root=total - per_layer * len(layers),
        hidden=text.hidden_size,
        q_dim=heads * head_dim,
        kv_dim=kv * head_dim,
        intermediate=text.intermediate_size,
        vocab=text.vocab_size,
        layers=len(layers),
        norms_per_layer=max(2, norms),
        qk_norm=hasattr(getattr(layers[0], "self_attn", None), "q_norm"),
        model_type=text.model_type,
        param_shapes=shapes,
    )


@dataclass(frozen=True)
class GpuTarget:
    """Where a plan is judged: ``count`` GPUs of ``model`` (the catalog's name, e.g. ``L4``) with
    ``memory`` bytes each; ``source`` says where the figures came from."""

    count: int
    model: str
    memory: int
    source: str
    host_memory_per_gpu: int | None = None  # the instance's memory ÷ its GPUs, bytes (for CPU offload)

    def room(self, plan: MemoryPlan) -> bool:
        """The plan fits: its GPU need within ``memory``, and with CPU offload its host share within
        :data:`HOST_USABLE` of ``host_memory_per_gpu`` (when known)."""
        if plan.needed() > self.memory:
            return False
        return not (plan.host_per_gpu and self.host_memory_per_gpu and plan.host_per_gpu > HOST_USABLE * self.host_memory_per_gpu)


def parse_gpus(spec: str) -> GpuTarget:
    """``8xL4``, ``16xH100``, ``1xH200`` → a :class:`GpuTarget`, the GPU's memory from rayft's
    instance catalog (:func:`rayft.cluster.instances.catalog`).

    Raises:
        ValueError: not ``<count>x<GPU>``, or a GPU the catalog does not list (the message lists them).
    """
    import re

    from rayft.cluster.instances import catalog

    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*([A-Za-z0-9-]+)\s*", spec)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"--gpus {spec!r}: expected <count>x<GPU>, e.g. 8xL4 or 16xH100")
    known: dict = {}
    for t in catalog().values():  # per GPU model, the instance with the most of them (8-GPU boxes)
        if t.gpu_model and t.gpu_count > getattr(known.get(t.gpu_model.lower()), "gpu_count", 0):
            known[t.gpu_model.lower()] = t
    t = known.get(m.group(2).lower())
    if t is None:
        raise ValueError(
            f"--gpus {spec!r}: rayft's catalog has no GPU {m.group(2)!r}; known: {', '.join(sorted(x.gpu_model for x in known.values()))}"
        )
    return GpuTarget(int(m.group(1)), t.gpu_model, t.gpu_memory_mib * 2**20, f"the instance catalog ({t.name})", host_share(t))


def host_share(t) -> int:
    """An instance type's memory per GPU, bytes."""
    return t.memory_mib * 2**20 // t.gpu_count


def gpu_of_accelerator_type(resource: str):
    """The catalog's instance type (:class:`rayft.cluster.instances.InstanceType`) for a Ray resource
    ``accelerator_type:<GPU>`` (``L4``, ``H100``, ``A100-80G``), None for another resource or an
    unknown GPU. When the name leaves the memory open (``A100``: 40 or 80 GB), the larger: a check
    that refuses must never refuse wrongly."""
    from rayft.cluster.instances import catalog

    if not resource.startswith("accelerator_type:"):
        return None
    base, _, size = resource.split(":", 1)[1].partition("-")
    kinds = [t for t in catalog().values() if t.gpu_model and t.gpu_model.lower() == base.lower()]
    if size.upper().endswith("G") and size[:-1].isdigit():
        kinds = [t for t in kinds if abs(t.gpu_memory_mib / 1024 - int(size[:-1])) < 4] or kinds
    return max(kinds, key=lambda t: t.gpu_memory_mib) if kinds else None


def cluster_gpus(cfg) -> GpuTarget | None:
    """The GPUs of the config's ``cluster:`` section (``num_nodes`` × the instance type's GPUs), or None."""
    if cfg.cluster is None:
        return None
    from rayft.cluster.instances import catalog

    t = catalog().get(cfg.cluster.instance_type)
    if t is None or not t.gpu_model:
        return None
    return GpuTarget(
        cfg.cluster.num_nodes * t.gpu_count, t.gpu_model, t.gpu_memory_mib * 2**20, f"cluster.instance_type {t.name}", host_share(t)
    )


def train_shape(cfg, gpus: int, model_conf) -> TrainShape:
    """The :class:`TrainShape` of a :class:`~rayft.config.RayftConfig` on ``gpus`` GPUs; the loss
    is fused when ``train.cross_entropy`` says ``fused``, or ``auto`` and the model transforms no logits."""
    import importlib.util

    from rayft.train.loss import logit_transforms

    tc = cfg.train
    # auto resolves to the fused loss where liger-kernel is installed (the driver's environment stands for the workers')
    auto_fused = tc.cross_entropy == "auto" and not logit_transforms(model_conf) and importlib.util.find_spec("liger_kernel") is not None
    fused = tc.cross_entropy == "fused" or auto_fused
    return TrainShape(
        gpus=gpus,
        micro_batch_size=tc.micro_batch_size,
        seq_len=cfg.data.seq_len,
        activation_checkpointing=tc.activation_checkpointing,
        compiled=tc.compile,
        liger=tc.liger_kernels,
        fused_loss=fused,
        fused_loss_chunk_mem=tc.fused_loss_chunk_mem,
        reshard_after_forward=cfg.parallel.reshard_after_forward,
        cpu_offload=cfg.parallel.cpu_offload,
        float8=tc.float8,
        compute_bytes=2 if cfg.parallel.param_dtype == "bfloat16" else 4,
        async_save_copy=cfg.parallel.cpu_offload and cfg.checkpoint.async_save,
        grad_accum_steps=tc.grad_accum_steps,
        without_fsdp2=not cfg.parallel.uses_fsdp2(gpus, "cuda"),
    )


@dataclass
class Verdict:
    """A plan judged against a GPU: ``fits``; ``largest_micro_batch`` (0: not even one row);
    ``advice``: the first of FSDP2 instead of one GPU's compute copies, activation checkpointing, then
    CPU offload, that makes it fit, with its largest micro-batch (None when it fits, or when nothing does)."""

    plan: MemoryPlan
    target: GpuTarget
    fits: bool
    largest_micro_batch: int
    advice: str | None

    def line(self) -> str:
        g = 2**30
        need, have = self.plan.needed() / g, self.target.memory / g
        head = f"needs {need:.1f} GiB per GPU of {self.target.count}× {self.target.model}'s {have:.1f} GiB"
        if self.plan.host_per_gpu and self.target.host_memory_per_gpu:
            head += f", and {self.plan.host_per_gpu / g:.1f} GiB of host memory per GPU (of {self.target.host_memory_per_gpu / g:.0f})"
        if self.fits:
            return f"fits: {head}; the largest micro-batch that fits is {self.largest_micro_batch}"
        return f"does not fit: {head}" + (
            f"; {self.advice}" if self.advice else "; no micro-batch fits, even with checkpointing and CPU offload"
        )


def judge(m: ModelDims, s: TrainShape, target: GpuTarget) -> Verdict:
    """Judge ``s`` on ``target`` (:class:`Verdict`)."""
    from dataclasses import replace

    plan = plan_memory(m, s)
    fits = target.room(plan)
    advice = None
    if not fits:
        # one GPU's compute copies hold 2 bytes per parameter more than FSDP2, which costs ~1.6% of the
        # speed (bench/NOTES.md §30); activation checkpointing costs a forward's recompute
        fsdp2 = [({"without_fsdp2": False}, "parallel.single_worker: fsdp2")] if s.copy_bytes else []
        for change, label in (
            *fsdp2,
            ({"activation_checkpointing": True}, "train.activation_checkpointing: true"),
            (
                {"activation_checkpointing": True, "cpu_offload": True},
                "train.activation_checkpointing: true and parallel.cpu_offload: true",
            ),
        ):
            alt = replace(s, **change)
            mb = largest_micro_batch(m, alt, target)
            if mb >= 1:
                fit_now = target.room(plan_memory(m, alt))
                advice = f"fits with {label}" + ("" if fit_now else f" and train.micro_batch_size ≤ {mb}") + f" (largest micro-batch {mb})"
                break
        else:
            mb = largest_micro_batch(m, s, target)
            if mb >= 1:
                advice = f"fits with train.micro_batch_size ≤ {mb}"
    return Verdict(plan, target, fits, largest_micro_batch(m, s, target), advice)


def copies_do_not_fit(cfg, target: GpuTarget, dims: ModelDims | None = None, shape: TrainShape | None = None) -> str | None:
    """Why one GPU worker with ``parallel.single_worker: auto`` should shard with FSDP2 on ``target``
    instead of keeping compute copies (its default): the copies' plan does not fit the GPU and
    FSDP2's needs less (2 bytes per parameter: the 7B and 8B presets on one H200). None when the
    copies fit, when the setting is not ``auto`` on one GPU, or when the model cannot be read here.
    ``dims`` and ``shape``: the caller's, when it has them (else read from ``cfg``'s model)."""
    from dataclasses import replace

    from rayft.train.model_config import load_model_config

    if target.count != 1 or cfg.parallel.single_worker != "auto" or cfg.parallel.cpu_offload:
        return None
    if dims is None or shape is None:
        try:
            conf = load_model_config(cfg.model)
            dims, shape = model_dims(conf), train_shape(cfg, 1, conf)
        except Exception:  # noqa: BLE001 - not judged here: the run's own loading reports a bad model properly
            return None
    copies, fsdp2 = plan_memory(dims, shape), plan_memory(dims, replace(shape, without_fsdp2=False))
    if not shape.copy_bytes or target.room(copies) or fsdp2.needed() >= copies.needed():
        return None
    g = 2**30
    return (
        f"compute copies need {copies.needed() / g:.1f} GiB of {target.model}'s {target.memory / g:.1f}, FSDP2 {fsdp2.needed() / g:.1f} GiB"
    )


def choose_single_worker(cfg, target: GpuTarget, say) -> None:
    """Turn ``parallel.single_worker: auto`` into ``fsdp2`` in ``cfg`` where :func:`copies_do_not_fit`
    says so for ``target``, and ``say`` it (one line). The driver does it before the worker starts
    (:func:`rayft.train.ray_cluster.choose_single_worker`) and ``rayft fit`` before it judges."""
    why = copies_do_not_fit(cfg, target)
    if why is not None:
        cfg.parallel.single_worker = "fsdp2"
        say(f"parallel.single_worker: auto takes fsdp2 on this GPU: {why} ({target.source})")


def fit_problem(cfg, target: GpuTarget) -> tuple[str, str] | None:
    """How ``cfg`` stands on ``target`` for ``train.fit_check``: None when it fits (or cannot be
    judged here: a hub id offline, a config the planner cannot read); else ``("refuse", why)`` when
    the allocated peak alone exceeds a GPU's memory (the planner's largest error on measured peaks
    is 14%, over), or ``("warn", why)`` when only the margins do, or when the count is an upper bound
    (float8, padding mode)."""
    from dataclasses import replace

    from rayft.train.model_config import load_model_config

    try:
        conf = load_model_config(cfg.model)
        dims = model_dims(conf)
        shape = train_shape(cfg, target.count, conf)
    except Exception:  # noqa: BLE001 - not judged: the run's own loading reports a bad model properly
        return None
    if copies_do_not_fit(cfg, target, dims, shape) is not None:  # what the driver's choice runs (choose_single_worker)
        shape = replace(shape, without_fsdp2=False)
    verdict = judge(dims, shape, target)
    if verdict.fits:
        return None
    why = f"{cfg.model.name_or_path} with train.micro_batch_size={cfg.train.micro_batch_size} × data.seq_len={cfg.data.seq_len} {verdict.line()}"
    upper_bound = shape.float8 or not cfg.data.packing
    over = verdict.plan.peak > target.memory or (
        verdict.plan.host_per_gpu and target.host_memory_per_gpu and verdict.plan.host_per_gpu > target.host_memory_per_gpu
    )
    if over and not upper_bound:
        return "refuse", why
    note = " (float8 / padding mode: the count is an upper bound)" if upper_bound else " (within the allocator and runtime margins)"
    return "warn", why + note


def capped(target: GpuTarget, cfg) -> GpuTarget:
    """``target`` with ``train.gpu_memory_limit_gib`` applied (the smaller of the two) and
    ``train.num_workers`` as the GPU count when it is a number."""
    from dataclasses import replace

    if cfg.train.gpu_memory_limit_gib is not None:
        target = replace(target, memory=min(target.memory, int(cfg.train.gpu_memory_limit_gib * 2**30)))
    if isinstance(cfg.train.num_workers, int):
        target = replace(target, count=cfg.train.num_workers)
    return target

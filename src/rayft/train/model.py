"""The model on every worker: build on the meta device, shard with FSDP2, fill the shards.

From the hub or a directory of safetensors, each rank reads only its own shards' rows
(:mod:`rayft.train.hf_weights`), so a host holds its ranks' share of the model, not the model.
A checkpoint without safetensors, or whose tensor names transformers converts while loading, is
loaded whole by rank 0 (in CPU memory) and broadcast through
``set_model_state_dict(..., broadcast_from_rank0=True)``. A preset is randomly initialised by rank 0
one decoder layer at a time (:mod:`rayft.train.preset_init`) with a fixed seed where
``model.init_device`` says (:func:`preset_init_device`), so the same seed gives the same initial
weights at any world size on the CPU, and on the same GPU model on a GPU (random kernels differ
between devices). Every rank builds the model on the meta device,
applies ``fully_shard`` per decoder layer and at the root, then allocates its shards and fills them.
One worker on a GPU skips FSDP2 by default (``parallel.single_worker``): its plain module keeps the
fp32 weights and computes with a bf16 copy of them (:mod:`rayft.train.compute_copy`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from transformers import AutoModelForCausalLM, PretrainedConfig

from rayft.config import ModelConfig, ParallelConfig
from rayft.train.compute_copy import ComputeCopies
from rayft.train.copying_adamw import CopyingAdamW, unsupported_reason
from rayft.train.hf_weights import agree_on_source, load_sharded_weights, sharded_io_available
from rayft.train.loss import SHARDED_LOSS_METHOD, TokenLoss, enable_sharded_token_loss
from rayft.train.model_config import decoder_layers, default_tokenizer, load_model_config  # noqa: F401 -- also this module's names (callers import them from here)
from rayft.train.preset_init import fill_sharded_preset, largest_unit_params, preset_states
from rayft.train.presets import is_preset


def load_full_model(cfg: ModelConfig, conf: PretrainedConfig, seed: int, init_device: str | torch.device = "cpu") -> torch.nn.Module:
    """The full fp32 model: from the checkpoint (on CPU), or a preset's seeded random init on
    ``init_device``, built unit by unit (:mod:`rayft.train.preset_init`): the weights the sharded
    model gets for the same seed and device. A random init on a GPU takes seconds where the CPU
    takes tens of seconds on one thread for Qwen2.5-1.5B; its values differ from the CPU init of
    the same seed."""
    if is_preset(cfg.name_or_path):
        device = torch.device(init_device)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
        model.to_empty(device=device)
        model.tie_weights()
        for _names, tensors in preset_states(conf, seed, device):
            model.load_state_dict(tensors, strict=False)
        _reset_rotary_buffers(model, device)
        return model
    return AutoModelForCausalLM.from_pretrained(
        cfg.name_or_path,
        config=conf,
        revision=cfg.revision,
        dtype=torch.float32,
        trust_remote_code=cfg.trust_remote_code,
    )


def load_full_state_dict(
    cfg: ModelConfig, conf: PretrainedConfig, seed: int, init_device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Full fp32 weights (rank 0 only): from the checkpoint, or a seeded random init on ``init_device``."""
    return load_full_model(cfg, conf, seed, init_device).state_dict()


def preset_init_device(device: torch.device, n_params: int, choice: str = "auto") -> torch.device:
    """Where rank 0 randomly initialises a preset (``model.init_device``: ``choice``).

    ``cpu`` → the CPU; ``gpu`` → ``device`` (the CPU when ``device`` is not a GPU); ``auto`` →
    ``device`` when it is a GPU whose free memory is at least twice ``n_params`` fp32 values (the
    largest init unit's: :func:`rayft.train.preset_init.largest_unit_params`, the most rank 0
    holds at once), else the CPU.
    """
    if device.type != "cuda" or choice == "cpu":
        return torch.device("cpu")
    if choice == "gpu":
        return device
    free, _total = torch.cuda.mem_get_info(device)
    return device if 2 * 4 * n_params <= free else torch.device("cpu")


def checkpoint_layers(model: torch.nn.Module, every: int = 1) -> list[int]:
    """Activation checkpointing (non-reentrant ``torch.utils.checkpoint``) on decoder layers 0,
    ``every``, 2·``every``, ...; the others keep their activations. Returns the checkpointed layers'
    indices. Through transformers' per-layer switch (``GradientCheckpointingLayer.gradient_checkpointing``),
    so parameter names (and checkpoints) stay the model's own.

    Raises:
        ValueError: ``every`` < 1, or a model whose decoder layers have no such switch.
    """
    if every < 1:
        raise ValueError(f"activation checkpointing every {every} layers: must be at least 1")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x: the new name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    layers = decoder_layers(model)
    if not all(hasattr(layer, "gradient_checkpointing") for layer in layers):
        raise ValueError(f"{type(model).__name__}: its decoder layers have no per-layer activation checkpointing switch")
    chosen = []
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i % every == 0
        if layer.gradient_checkpointing:
            chosen.append(i)
    return chosen


def tied_embeddings(model: torch.nn.Module) -> bool:
    """True when the LM head and the input embedding are one tensor."""
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def _reset_rotary_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Recompute non-persistent buffers, which the state dict does not carry.

    Known: RoPE frequencies (modules with ``inv_freq`` and a ``config``) and the embedding scale
    of Gemma's scaled embedding (``embed_scale``, from its ``scalar_embed_scale``: √hidden_size);
    any other non-persistent buffer would be left as uninitialised memory by ``to_empty``, so it is
    an error.

    Raises:
        NotImplementedError: a non-persistent buffer this function cannot recompute.
    """
    for mname, mod in model.named_modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            with torch.device(device):
                fresh = type(mod)(config=mod.config)
            for name, buf in fresh.named_buffers(recurse=False):
                setattr(mod, name, buf)
        elif mod._non_persistent_buffers_set == {"embed_scale"} and hasattr(mod, "scalar_embed_scale"):
            mod.embed_scale = torch.tensor(mod.scalar_embed_scale, device=device)
        elif mod._non_persistent_buffers_set:
            raise NotImplementedError(
                f"{type(model).__name__}: non-persistent buffer(s) {sorted(mod._non_persistent_buffers_set)} in {mname or 'the root'} "
                "cannot be initialised after meta-device sharding"
            )


@dataclass
class ShardedModel:
    """The causal LM as trained (FSDP2-sharded, or one worker's with compute copies) and the
    features it was built with.

    ``module``: the FSDP2 root, or without FSDP2 the plain module (a transformers causal LM; its
    state dict keys are the model's own; its registered parameters are the fp32 master weights
    either way). ``loss``: the training loss (:class:`~rayft.train.loss.TokenLoss`); ``float8``:
    the decoder layers' linear layers train in float8 (:func:`apply_float8`); ``float8_all_gather``:
    FSDP2 all-gathers those weights in float8 (with more than one rank); ``export_gathered``: the
    export goes through transformers (the checkpoint's tensor names were converted while loading);
    ``compute_copies``: one worker without FSDP2 computing in bf16 (:mod:`rayft.train.compute_copy`;
    None with FSDP2, or when compute is fp32); ``copying_adamw``: with compute copies, the optimizer's
    step that also writes them (:meth:`use_copying_adamw`; None: the clip, ``optimizer.step()`` and
    :meth:`after_optimizer_step`'s cast). Every forward and backward runs inside
    :meth:`computing` (:meth:`token_loss_sum` opens it for its forward; a backward outside it is right
    only without activation checkpointing, whose recompute would read the fp32 masters and fail
    torch's checkpoint check): calling ``module`` directly outside it computes in fp32.
    """

    module: torch.nn.Module
    loss: TokenLoss
    float8: bool = False
    float8_all_gather: bool = False
    export_gathered: bool = False
    compute_copies: ComputeCopies | None = None
    copying_adamw: CopyingAdamW | None = None

    @property
    def fsdp(self) -> bool:
        """The module is sharded by FSDP2 (else: one worker's plain module)."""
        return isinstance(self.module, FSDPModule)

    def computing(self) -> contextlib.AbstractContextManager:
        """The block in which the module computes (every forward, and a backward): with compute
        copies, their parameters stand in the module's slots (:meth:`ComputeCopies.computing`);
        else nothing changes (FSDP2 gathers around each forward itself)."""
        return self.compute_copies.computing() if self.compute_copies is not None else contextlib.nullcontext()

    @property
    def weights_mode(self) -> str:
        """How the weights are held: ``fsdp2``; ``compute_copy`` (one worker, bf16 copies of fp32
        masters); ``plain`` (one worker computing with its fp32 weights: no FSDP2, no copies)."""
        return "fsdp2" if self.fsdp else "compute_copy" if self.compute_copies is not None else "plain"

    def release_compute_copies(self) -> None:
        """Free the compute copies when training is over (the export's logit check wants the room);
        nothing to do without them."""
        if self.compute_copies is not None:
            self.compute_copies.release()

    def set_gradient_sync(self, sync: bool) -> None:
        """FSDP2: reduce the gradients after this backward (the last micro-batch) or keep
        accumulating them unsharded; without FSDP2 there is nothing to reduce."""
        if self.fsdp:
            self.module.set_requires_gradient_sync(sync)

    @property
    def attn_implementation(self) -> str:
        """The transformers attention implementation that runs (e.g. ``rayft_varlen``, ``sdpa``)."""
        return self.module.config._attn_implementation

    def token_loss_sum(self, input_ids, position_ids, labels, trained_positions=None, **attn_kwargs) -> torch.Tensor:
        """Sum of token cross-entropies (fp32, 0-d) over ``labels`` ≠ −100, the root's parameters
        gathered by FSDP2 around it. Shapes: int64 [B, L] each; ``trained_positions`` int64 [T] or None
        (:meth:`rayft.train.loss.TokenLoss.compute`); ``attn_kwargs`` reach attention."""
        with self.computing():
            return getattr(self.module, SHARDED_LOSS_METHOD)(self.loss, input_ids, position_ids, labels, trained_positions, **attn_kwargs)

    def use_copying_adamw(self, optimizer: torch.optim.Optimizer) -> str | None:
        """With compute copies, step ``optimizer`` with :class:`~rayft.train.copying_adamw.CopyingAdamW`
        from now on, where it can; returns the reason it cannot (None: it will)."""
        if self.compute_copies is None:
            return f"no compute copies: the weights are {self.weights_mode} (FSDP2, or fp32 compute)"
        why = unsupported_reason(optimizer)
        self.copying_adamw = CopyingAdamW(optimizer, self.compute_copies) if why is None else None
        return why

    def after_optimizer_step(self) -> None:
        """Work due after each ``optimizer.step()``: with compute copies, cast them again now, queued
        behind the optimizer (:meth:`ComputeCopies.refresh`); with float8 weights all-gathered by
        FSDP2, compute every weight's float8 scale for the next step in one all-reduce (torchao's
        ``precompute_float8_dynamic_scale_for_fsdp``) instead of one per weight at all-gather time."""
        if self.compute_copies is not None:
            self.compute_copies.refresh()
        if self.float8_all_gather:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(self.module)


def build_sharded_model(
    model_cfg: ModelConfig,
    par: ParallelConfig,
    *,
    device: torch.device,
    activation_checkpointing: bool | int,
    compile_layers: bool,
    seed: int,
    liger_kernels: bool = False,
    cross_entropy: str = "auto",
    float8: bool = False,
    fused_loss_chunk_mem: int = 8,
) -> ShardedModel:
    """The FSDP2-sharded causal LM with fp32 master weights, ready to train, with its features
    (one worker: as ``par.single_worker`` says, :meth:`rayft.config.ParallelConfig.uses_fsdp2`;
    without FSDP2 the plain module, with compute copies when compute is not fp32).

    Compute runs in ``par.param_dtype`` on GPU and fp32 on CPU; gradients reduce in
    ``par.reduce_dtype`` (without FSDP2 they accumulate in fp32). Call on every rank of an initialised process group. The loss
    (:class:`~rayft.train.loss.TokenLoss`; ``cross_entropy``: auto|fused|torch;
    ``fused_loss_chunk_mem``: the fused loss's chunk size, liger's ``chunk_mem_const``) runs through
    :meth:`ShardedModel.token_loss_sum`;
    ``liger_kernels`` swaps in liger-kernel's RMSNorm, SwiGLU/GeGLU and RoPE (the family's patch:
    :func:`rayft.train.families.liger_call`);
    ``float8`` converts the decoder layers' linear layers to float8 training (:func:`apply_float8`).

    Raises:
        AssertionError: if tied embeddings were untied by sharding.
        ValueError: an attention, loss or float8 mode that cannot run on ``device``.
    """
    from rayft.train.attention import resolve_attn_implementation
    from rayft.train.loss import resolve_cross_entropy

    conf = load_model_config(model_cfg)
    conf._attn_implementation = resolve_attn_implementation(model_cfg.attn_implementation, device, conf)
    ce_impl = resolve_cross_entropy(cross_entropy, device, conf)
    if float8:
        check_float8(device)  # before rank 0 spends time loading the weights
    rank = dist.get_rank()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    init_device = torch.device("cpu")
    if is_preset(model_cfg.name_or_path):
        init_device = preset_init_device(device, largest_unit_params(model), model_cfg.init_device)
        if rank == 0:
            print(f"[rayft] model: seeded random init of preset {model_cfg.name_or_path} (seed {seed}) on {init_device}", flush=True)
    weights_dir, why = None, ""
    if not is_preset(model_cfg.name_or_path):
        if sharded_io_available():
            weights_dir, why = agree_on_source(model_cfg.name_or_path, model_cfg.revision, model, conf, device)
        else:
            why = f"torch {torch.__version__} lacks DCP's Hugging Face reader/writer (2.9 and later)"
        if weights_dir is None and rank == 0:
            print(f"[rayft] model: {model_cfg.name_or_path}: rank 0 loads the whole model and broadcasts it: {why}", flush=True)
    if weights_dir is None and not is_preset(model_cfg.name_or_path):
        full_sd = load_full_state_dict(model_cfg, conf, seed, init_device) if rank == 0 else {}
    if liger_kernels:
        _apply_liger(model, device, checkpointed_compiled=bool(activation_checkpointing) and compile_layers)
    # float8 all-gathers pay off where there is an all-gather: on one rank the weight's cast to
    # float8 then runs eagerly in FSDP2's hooks (and once more in backward when resharded) instead
    # of fused into the compiled layer (bench/NOTES.md §20: 45,109 → 51,275 tokens/s on one H200)
    float8_all_gather = float8 and dist.get_world_size() > 1
    if float8:
        apply_float8(model, device, all_gather=float8_all_gather)
    tied = bool(getattr(conf, "tie_word_embeddings", False))
    if activation_checkpointing:
        checkpoint_layers(model, every=int(activation_checkpointing))
    on_gpu = device.type == "cuda"
    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    compute_dtype = dtypes[par.param_dtype] if on_gpu else torch.float32
    reduce_dtype = dtypes[par.reduce_dtype] if on_gpu else torch.float32
    fsdp = par.uses_fsdp2(dist.get_world_size(), device.type)
    if par.single_worker == "compute_copy" and dist.get_world_size() > 1 and rank == 0:
        print(f"[rayft] parallel.single_worker: compute_copy applies to one worker; {dist.get_world_size()} shard with FSDP2", flush=True)
    shard = _fsdp2_options(par, device, compute_dtype, reduce_dtype) if fsdp else None
    for layer in decoder_layers(model):
        if compile_layers:
            layer.compile()
        if shard:
            fully_shard(layer, **shard)
    if shard:
        fully_shard(model, **shard)
    model.to_empty(device="cpu" if par.cpu_offload else device)
    if tied and not tied_embeddings(model):
        model.tie_weights()
    if weights_dir is not None:
        load_sharded_weights(model, weights_dir)  # each rank reads its own rows of the files
        if rank == 0:
            print(f"[rayft] model: {model_cfg.name_or_path}: each rank read its shards from {weights_dir}", flush=True)
    elif is_preset(model_cfg.name_or_path):
        fill_sharded_preset(model, conf, seed, init_device)  # one decoder layer at a time
    else:
        set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        del full_sd
    if rank == 0 and init_device.type == "cuda":
        torch.cuda.empty_cache()  # the init's blocks go back to the device
    _reset_rotary_buffers(model, device)
    assert tied_embeddings(model) == tied, "tied input/output embeddings must stay one tensor after sharding"
    enable_sharded_token_loss(model)
    model.train()
    # the checkpoint's own tensor names differ from the model's (transformers converts them while loading):
    # export through transformers' save_pretrained, which converts them back
    renamed = "tensor name" in why
    return ShardedModel(
        model,
        TokenLoss.create(ce_impl, chunk_mem=fused_loss_chunk_mem),
        float8=float8,
        float8_all_gather=float8_all_gather,
        export_gathered=renamed,
        compute_copies=ComputeCopies(model, compute_dtype) if not fsdp and compute_dtype != torch.float32 else None,
    )


def _fsdp2_options(par: ParallelConfig, device: torch.device, compute_dtype: torch.dtype, reduce_dtype: torch.dtype) -> dict:
    """``fully_shard``'s keyword arguments: the mesh over every rank, mixed precision (``compute_dtype``
    for compute, ``reduce_dtype`` for the gradients' reduction), CPU offload."""
    mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=reduce_dtype)
    # The mesh is named for the device we train on: FSDP2's default takes the host's accelerator,
    # so CPU workers (use_gpu: false) on a GPU host would get CUDA gradients on CPU parameters.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # CPU offload: the shards live in host memory (pinned when the copies go to a GPU), FSDP2 copies
    # each layer's to the device for its all-gather and the optimizer steps on the CPU
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if par.cpu_offload else OffloadPolicy()
    return {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": par.reshard_after_forward, "offload_policy": offload}


def _apply_liger(model: torch.nn.Module, device: torch.device, checkpointed_compiled: bool = False) -> None:
    """liger-kernel's Triton RMSNorm, SwiGLU/GeGLU MLP and RoPE on this model instance, through the
    family's patch function (:func:`rayft.train.families.liger_call`; ``checkpointed_compiled``:
    activation checkpointing and compiled layers both on, which leaves some kernels off for some families).

    Raises:
        ValueError: a family liger-kernel does not patch, no CUDA device, or liger-kernel missing.
    """
    from rayft.train.families import liger_call

    name, kwargs = liger_call(getattr(model.config, "model_type", ""), checkpointed_compiled)
    if device.type != "cuda":
        raise ValueError(f"train.liger_kernels needs a CUDA device (have {device.type})")
    try:
        import liger_kernel.transformers as liger
    except ImportError as e:
        raise ValueError("train.liger_kernels needs the liger-kernel package (pip install liger-kernel)") from e
    getattr(liger, name)(**kwargs, model=model)


def check_float8(device: torch.device) -> None:
    """Raise ``ValueError`` unless float8 training can run on ``device``: torchao importable, and on
    CUDA a compute capability of at least 8.9 (the CPU runs float8 matmuls too, slowly: for tests)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise ValueError(
            f"train.float8 needs a GPU with float8 matmuls (compute capability >= 8.9: L4, H100, H200); "
            f"{torch.cuda.get_device_name(device)} has {cap}"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        raise ValueError("train.float8 needs the torchao package (in a clone: pip install -e '.[fp8]')") from e


def apply_float8(model: torch.nn.Module, device: torch.device, all_gather: bool = True) -> int:
    """Convert the decoder layers' ``nn.Linear`` modules to torchao's ``Float8Linear`` (before
    ``fully_shard``): the three matmuls of each linear layer (forward, input and weight gradients)
    run in float8 with tensorwise dynamic scaling (e4m3 for inputs and weights, e5m2 for output
    gradients), and with ``all_gather`` FSDP2 all-gathers the weights in float8 (else each layer
    casts its bf16 weights when it runs). Weights, gradients and optimizer
    states stay fp32; the embedding and the LM head (whose 151,936-wide logits drive the loss) stay
    bf16. Only layers whose two dimensions are multiples of 16 (what the float8 GEMM needs) convert;
    the third dimension, the micro-batch's tokens, is kept a multiple of 16 by the config's check
    on ``data.seq_len``. On CPU, PyTorch's CPU float8 matmul runs (correct, slow: for tests).
    Source of the recipe: torchao's float8 training README (``convert_to_float8_training``,
    ``enable_fsdp_float8_all_gather``).

    Returns:
        the number of linear layers converted (at least one).
    Raises:
        ValueError: float8 cannot run on ``device`` (:func:`check_float8`), or no linear layer of
            the decoder layers qualifies.
    """
    check_float8(device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    in_layers = {id(m) for layer in decoder_layers(model) for m in layer.modules()}

    def convert(mod: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(mod, torch.nn.Linear):
            return True  # recurse into containers; only the leaves below are decided
        return id(mod) in in_layers and mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather), module_filter_fn=convert)
    n = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    if n == 0:
        raise ValueError(
            "train.float8: no linear layer of the decoder layers has both dimensions a multiple of 16; nothing to run in float8"
        )
    return n


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matrix products: all unique parameters, minus the input
    embedding (a lookup), plus the LM head (counted even when tied). See :mod:`rayft.train.metrics` (MFU)."""
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return total - emb.numel() + (head.numel() if head is emb else 0)


def use_compile_cache_dir(path: str, say=None) -> str:
    """Point torch.compile's on-disk caches (Inductor's FX graphs, AOTAutograd's, Triton's kernels:
    ``TORCHINDUCTOR_CACHE_DIR``, which Inductor reads at every use) at ``path``, unless this process
    was started with a directory of its own there (importing Inductor sets torch's default,
    ``/tmp/torchinductor_<user>``, when none was). A ``path`` that cannot be created or written
    leaves torch's choice, with a line to ``say``. Returns the directory in use."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current and os.path.abspath(current) != os.path.abspath(default_cache_dir()):
        return current  # the user's own
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as e:
        if say:
            say(f"[rayft] train.compile_cache_dir: {e}; compiling with torch's cache directory instead")
        return current or default_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path

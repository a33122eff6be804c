"""One typed config for the whole lifecycle, loaded from YAML and validated with pydantic.

Every section forbids unknown keys, so a typo is an error rather than a silently ignored
setting. Errors name the file and the dotted key path (``train.micro_batch_size``) and, where
the YAML parser knows it, the line.

Loading a file with ``--set`` overrides into a :class:`RayftConfig`:
:func:`rayft.config_load.load_config`; every error is a :class:`ConfigError`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_serializer, model_validator

from rayft.cluster.spec import ClusterConfig
from rayft.config_base import ConfigModel, path_field
from rayft.config_tracking import TrackingConfig


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate. The message names file and key."""


class _Section(ConfigModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_ModelPath = path_field("give a hub id (Qwen/Qwen2.5-1.5B), a model directory or a preset (qwen2-tiny)")
_TokenizerPath = path_field("give a hub id or a directory, or leave model.tokenizer out for the model's own")
_DataFile = path_field("give a file, glob, directory or s3:// URI, or remove the entry")
_CacheDir = path_field("give a directory, or null to disable the cache")
_StoragePath = path_field("give a directory (./runs), a shared file system path or an s3:// URI")

#: a run name: the last part of the run directory, of Ray Train's storage path and of the metrics files
RUN_NAME_MAX = 128


def check_run_name(name: str) -> str:
    """``name`` when it is a safe run name (ASCII letters, digits, ``.``, ``_``, ``-``; not starting with
    ``.``; 1 to :data:`RUN_NAME_MAX` characters).

    Raises:
        ValueError: naming the first refused character and its position.
    """
    if not name:
        raise ValueError("a run name cannot be empty (leave checkpoint.name out for rayft-<date>-<time>)")
    for i, c in enumerate(name):
        if not (c.isascii() and (c.isalnum() or c in "._-")):
            raise ValueError(
                f"{c!r} (U+{ord(c):04X}, character {i + 1}) is not allowed in a run name: use ASCII letters, digits, '.', '_' and '-'"
            )
    if name.startswith("."):
        raise ValueError("a run name cannot start with '.' (a hidden directory)")
    if len(name) > RUN_NAME_MAX:
        raise ValueError(f"{len(name)} characters; a run name has at most {RUN_NAME_MAX}")
    return name


class ModelConfig(_Section):
    """What to fine-tune.

    ``name_or_path`` is a Hugging Face hub id (``Qwen/Qwen2.5-1.5B``), a local directory with
    ``config.json`` and weights, or an architecture preset (``qwen2.5-0.5b``, ``qwen2.5-1.5b``,
    ``qwen2.5-3b``, ``qwen2.5-7b``, ``qwen2-tiny``) built from its published config with random
    initialisation. ``config_overrides`` edits the model config (e.g. fewer layers for a smoke test).
    """

    name_or_path: _ModelPath = "qwen2-tiny"
    revision: str | None = None
    tokenizer: _TokenizerPath | None = Field(
        default=None,
        description="Tokenizer hub id or directory; default: the model's, or the offline Qwen2.5 tokenizer for presets.",
    )
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    attn_implementation: Literal["auto", "varlen", "sdpa", "eager", "flash_attention_2", "flex_attention"] = Field(
        default="auto",
        description="auto: varlen (variable-length FlashAttention over packed documents, CUDA) where it runs, else sdpa.",
    )
    trust_remote_code: bool = False
    init_device: Literal["auto", "cpu", "gpu"] = Field(
        default="auto",
        description="Where rank 0 randomly initialises a preset: gpu (fast; the same seed gives the same weights on the "
        "same GPU model), cpu (the same weights everywhere, ~25 s for 1.5B), auto: the GPU when twice the largest init unit "
        "(a decoder layer or the embedding, fp32) fits in its free memory, else the CPU. Checkpoints and hub models always load on the CPU.",
    )


_Column = Annotated[str, Field(min_length=1)] | None


class ColumnsConfig(_Section):
    """``data.columns``: the dataset's names for the fields, turn keys and role names the reader
    uses (``{key: name in the data}``, e.g. ``{instruction: prompt, output: response}``); unset keys
    keep their usual names. Keys are those of ``rayft.data.records.COLUMN_KEYS``."""

    model_config = ConfigDict(serialize_by_alias=True, validate_by_alias=True, validate_by_name=True)

    messages: _Column = None
    conversations: _Column = None
    system: _Column = None
    tools: _Column = None
    instruction: _Column = None
    input: _Column = None
    output: _Column = None
    history: _Column = None
    text: _Column = None
    role: _Column = None
    content: _Column = None
    tool_calls: _Column = None
    from_: _Column = Field(default=None, alias="from")
    value: _Column = None
    user: _Column = None
    assistant: _Column = None
    tool: _Column = None
    function_call: _Column = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}

    def mapping(self) -> dict[str, str]:
        """The keys that are set, ``{key: name in the data}``."""
        return self.model_dump()


class SyntheticConfig(_Section):
    """``data.synthetic``: train on random tokens instead of files (throughput benchmarks).

    ``rows`` examples of exactly ``data.seq_len`` token ids drawn uniformly from the model's
    vocabulary with ``seed`` (:func:`rayft.data.synthetic.random_dataset`), every token trainable.
    """

    rows: int = Field(ge=1)
    seed: int = 0


class DataConfig(_Section):
    """Training data: chat records rendered with the tokenizer's chat template, or raw text.

    ``format``: ``messages`` ({"messages": [{"role", "content"}]}), ``sharegpt`` ({"conversations":
    [{"from": "system"|"human"|"gpt", "value"}]}), ``alpaca`` ({instruction, input, output}),
    ``text`` ({"text"}: continued pre-training, no chat template, loss on every token) or ``auto``
    (decided per record by its keys); ``messages``/``sharegpt`` records may hold tool calls, tool
    results and a ``tools`` list (rendered by the chat template, loss on the calls, never on results).
    ``columns``: other names for fields, turn keys and roles (:class:`ColumnsConfig`).
    ``train_files``: files, globs, directories and ``s3://bucket/prefix`` URIs of .json, .jsonl,
    .parquet files, the JSON ones optionally gzip (.gz) or zstd (.zst) compressed.
    ``on_bad_record``: ``error`` stops at the first bad record (``file:line: reason``); ``skip``
    skips bad records and reports their counts per reason at the start of training.
    ``preprocess``: where ingest (read, validate, tokenize) runs: ``local`` (the driver process),
    ``ray`` (Ray Data over every CPU of the cluster, :mod:`rayft.data.ingest`) or ``auto`` (Ray from
    32 MiB of input on a cluster of 2+ CPUs). Both write the same examples.
    ``placeholders``: values for template placeholders left in the data (``{name: Rayft, author:
    ACME}``), such as LLaMA-Factory's identity set's ``{{name}}`` and ``{{author}}``: a key fills
    the placeholder spelled exactly so, outside code: ``name`` fills ``{{name}}``; an upper-case key
    (``NAME``) fills ``{{NAME}}`` and ``<NAME>``; a lower-case ``<name>`` is never a placeholder (it
    cannot be told from an XML tag) (:func:`rayft.data.placeholders.fill_placeholders`; a record the
    values empty is a bad record). Placeholders left unfilled are counted and
    warned about at load, with their first locations (upper-case ``<NAME>`` markers may also be
    a PII-scrubbed dataset's redactions: fill those only when they are placeholders).
    ``cache_dir``: where the token store goes (:mod:`rayft.data.token_store`: a local path or an
    ``s3://`` URI), under a content hash of the inputs, the tokenizer and these settings
    (:mod:`rayft.data.cache`); ``null``: in the run directory (``<run>/tokenized``).
    Validation (for ``eval_loss``): ``validation_files`` (read like ``train_files``) or
    ``validation_fraction`` (that share of the training records, at least one, chosen by ``seed``
    and held out of training), not both.
    """

    train_files: list[_DataFile] = Field(default_factory=list, description="Required unless data.synthetic is set.")
    synthetic: SyntheticConfig | None = Field(
        default=None, description="Random full-length token rows instead of train_files (benchmarks)."
    )
    format: Literal["auto", "messages", "sharegpt", "alpaca", "text"] = "auto"
    on_bad_record: Literal["error", "skip"] = "error"
    columns: ColumnsConfig = Field(default_factory=ColumnsConfig)
    placeholders: dict[str, str] = Field(
        default_factory=dict,
        description="Values for template placeholders left in the data: {name: ...} fills {{name}}; an upper-case key "
        "{NAME: ...} fills {{NAME}} and <NAME> (lower-case <name> is never a placeholder).",
    )
    seq_len: int = Field(
        default=2048, ge=8, description="Maximum tokens per example (longer conversations are truncated, longer text documents split)."
    )
    packing: bool = Field(default=True, description="Pack several examples per row (no cross-document attention); else one per row.")
    shuffle: bool = Field(
        default=True,
        description="Shuffle the examples, and the packed rows, every epoch (seeded by data.seed); false: file order "
        "(packed rows ordered by their first example).",
    )
    seed: int = 0
    max_examples: int | None = Field(default=None, ge=1)
    preprocess: Literal["auto", "local", "ray"] = "auto"
    cache_dir: _CacheDir | None = "~/.cache/rayft/tokenized"  # null: the run directory's tokenized/
    validation_files: list[_DataFile] | None = Field(default=None, min_length=1)
    validation_fraction: float | None = Field(default=None, gt=0, lt=0.5)

    @field_validator("train_files", "validation_files", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("placeholders")
    @classmethod
    def _placeholder_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(
                    f"{k!r}: a placeholder's name is letters, digits and '_', not starting with a digit ({{{{name}}}}, <NAME>)"
                )
        return v

    @model_validator(mode="after")
    def _one_validation_source(self) -> "DataConfig":
        if self.validation_files and self.validation_fraction is not None:
            raise ValueError("give data.validation_files or data.validation_fraction, not both")
        if self.synthetic is None and not self.train_files:
            raise ValueError("data.train_files is required (or data.synthetic for random tokens)")
        if self.synthetic is not None and (self.train_files or self.validation_files or self.validation_fraction):
            raise ValueError("data.synthetic replaces data.train_files and validation data: give one or the other")
        return self


class TrainConfig(_Section):
    """The optimisation: batch geometry, schedule, optimizer, step budget.

    Global batch (examples) = ``num_workers`` × ``micro_batch_size`` × ``grad_accum_steps``.
    """

    num_workers: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    use_gpu: bool | Literal["auto"] = "auto"
    cpus_per_worker: float = Field(default=1, gt=0)
    micro_batch_size: int = Field(default=8, ge=1)
    grad_accum_steps: int = Field(default=1, ge=1)
    epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many optimizer steps (overrides epochs).")
    lr: float = Field(default=1e-5, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup_steps: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    one_pass_adamw: bool = Field(
        default=True,
        description="One GPU with compute copies (parallel.single_worker): the gradient clip, AdamW's update and the bf16 "
        "copies' cast in one Triton pass per parameter (rayft.train.copying_adamw; 30 bytes a parameter where the three "
        "passes move 42; +2.2% tokens/s on one H100, bench/NOTES.md §43). Its weights agree with torch's AdamW step to a "
        "few fp32 ulps, not bit for bit; false: torch's step. Elsewhere it changes nothing. Each step's record says "
        "whether it ran (copying_adamw in rayft_metrics.jsonl); where compute copies run without it, rank 0 prints why.",
    )
    activation_checkpointing: bool | Annotated[int, Field(ge=1)] = Field(
        default=False,
        description="Recompute decoder layers' activations in the backward pass instead of keeping them: true (every "
        "layer), an integer k (every k-th layer: layers 0, k, 2k, ...; 1 is the same as true), false (none).",
    )
    compile: bool = Field(default=False, description="torch.compile each decoder layer.")
    compile_cache_dir: _CacheDir | None = Field(
        default="~/.cache/rayft/compile",
        description="compile only: torch.compile's on-disk caches (Inductor's FX graphs, AOTAutograd's, Triton's kernels; "
        "TORCHINDUCTOR_CACHE_DIR), on each worker's node (~ is the worker's home): a later run of the same model and "
        "shapes reuses them and compiles in seconds. null: torch's default, /tmp/torchinductor_<user>, lost with /tmp.",
    )
    cross_entropy: Literal["auto", "fused", "torch"] = Field(
        default="auto",
        description="fused: liger-kernel fused linear cross-entropy (no full fp32 logits; CUDA); torch: plain; auto: fused where it runs.",
    )
    fused_loss_chunk_mem: int = Field(
        default=8,
        ge=1,
        description="fused loss only: liger-kernel's chunk_mem_const. Each chunk of the LM head's logits holds about this "
        "many × (the micro-batch's trained tokens × hidden size) values (the loss runs over the trained positions "
        "only): larger chunks, fewer passes over the fp32 weight gradient. "
        "1 is liger's default and the least memory; 8 was the fastest of 1, 4 and 8 in the step on H200 (bench/NOTES.md §8).",
    )
    liger_kernels: bool = Field(
        default=False,
        description="liger-kernel RMSNorm, SwiGLU/GeGLU and RoPE (CUDA; Qwen2, Qwen3, Llama, Mistral, Gemma 2, Phi-3: rayft.train.families).",
    )
    float8: bool = Field(
        default=False,
        description="float8 matmuls in the decoder layers' linear layers (torchao, tensorwise dynamic scaling, float8 FSDP2 "
        "all-gather); needs torchao, and on CUDA compute capability >= 8.9 (L4, H100, H200). The LM head stays bf16.",
    )
    gpu_memory_limit_gib: float | None = Field(
        default=None,
        ge=1,
        description="Cap each GPU worker's PyTorch allocations at this many GiB "
        "(torch.cuda.set_per_process_memory_fraction): emulates a smaller card on a larger one, e.g. 22.5 for an "
        "L4's usable memory. A step that needs more fails with CUDA out-of-memory, as on that card (the CUDA context "
        "and NCCL buffers are outside the cap, so slightly more fits than on the real card). GPU workers only.",
    )
    seed: int = 0
    fit_check: Literal["refuse", "warn", "off"] = Field(
        default="refuse",
        description="Before GPU workers start, predict one GPU's memory (`rayft fit`): refuse a run whose allocated "
        "peak alone exceeds a GPU's memory (warn when only the margins do, or for float8 and padding mode, whose "
        "counts are upper bounds); warn: only say so; off: skip. `rayft train --force` is off for that run.",
    )
    nccl_flight_recorder: bool = Field(
        default=False,
        description="PyTorch's NCCL flight recorder in every worker: each rank keeps its last 2000 collectives and, when "
        "c10d's watchdog times one out, dumps them to RUN_DIR/flight_recorder/rank_<N> (read them with "
        "`rayft doctor --flight-recorder RUN_DIR/flight_recorder`: the collective and the ranks that never entered it). "
        "Needs a run directory every node sees (not s3://).",
    )
    log_every: int = Field(default=1, ge=1)
    profile_steps: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = Field(
        default=None,
        description="torch.profiler (CPU and GPU activity, with shapes) over the optimizer steps [FIRST, LAST] (1-based, "
        "inclusive; e.g. [10, 11]: after compile and warm-up). Each rank writes RUN_DIR/profile/rank<N>.trace.json.gz (a "
        "Chrome/Perfetto trace) and rank<N>.ops.txt (its operators by self GPU time, or CPU time on CPU workers). The "
        "traced steps run slower and are marked `profiled` in the metrics. At most 10 steps: traces grow fast.",
    )
    eval_every: int | None = Field(
        default=None,
        ge=1,
        description="Validation loss every N steps (and before the first and after the last); default: after the last step only.",
    )

    @field_validator("profile_steps")
    @classmethod
    def _profile_window(cls, v: tuple[int, int] | None) -> tuple[int, int] | None:
        if v is not None and not 0 <= v[1] - v[0] < 10:
            raise ValueError("give [FIRST, LAST] with FIRST <= LAST and at most 10 steps")  # the loader adds the value
        return v


class ParallelConfig(_Section):
    """FSDP2 (``fully_shard``) settings, and how one worker holds its weights (``single_worker``).

    Parameters are kept in fp32 (master weights) and cast to ``param_dtype`` for compute;
    gradients are reduced in ``reduce_dtype``. On CPU workers compute stays fp32.
    """

    param_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    reduce_dtype: Literal["bfloat16", "float32"] = "float32"
    reshard_after_forward: bool = True
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    single_worker: Literal["auto", "fsdp2", "compute_copy"] = Field(
        default="auto",
        description="How a run of one worker holds its weights. fsdp2: FSDP2 over the one rank, as with more workers "
        "(it shards nothing but copies and casts each layer's weights in and out of its buffers every step). compute_copy: "
        "no FSDP2; the fp32 master weights and one param_dtype copy of them for compute, cast again after each optimizer "
        "step (rayft.train.compute_copy; same values, 2 bytes per parameter more memory; gradients accumulate in fp32 "
        "whatever reduce_dtype says). auto: compute_copy on a GPU without cpu_offload where the memory plan says the copies "
        "fit the GPU, else fsdp2 (the driver decides and says so before the worker starts; compute_copy where it cannot "
        "tell the GPU's memory). More than one worker always shards with FSDP2.",
    )
    cpu_offload: bool = Field(
        default=False,
        description="FSDP2's CPU offload: sharded parameters, gradients and optimizer states live in host memory and the "
        "optimizer step runs on the CPU; each layer's parameters are copied to the GPU for its forward and backward. "
        "GPU memory drops by about 16 bytes per parameter ÷ GPUs, at the cost of host memory and speed.",
    )

    def uses_fsdp2(self, world_size: int, device_type: str) -> bool:
        """Whether FSDP2 shards the model: with more than one worker and with ``cpu_offload``
        always; with one worker as ``single_worker`` says (auto: on a CPU, not on a GPU; the driver turns auto into
        fsdp2 first where the copies do not fit the GPU: :func:`rayft.train.ray_cluster.choose_single_worker`)."""
        if world_size > 1 or self.cpu_offload or self.single_worker == "fsdp2":
            return True
        return self.single_worker == "auto" and device_type != "cuda"

    @model_validator(mode="after")
    def _offload_needs_fsdp2(self) -> "ParallelConfig":
        if self.single_worker == "compute_copy" and self.cpu_offload:
            raise ValueError("single_worker: compute_copy keeps every weight on the GPU; cpu_offload needs fsdp2 (or auto)")
        return self


class CheckpointConfig(_Section):
    """Where a run lives and how often it is checkpointed.

    The run directory is ``storage_path/name``. ``storage_path`` must be reachable from every node
    (a shared file system or ``s3://``) when the cluster has more than one node. ``name`` (default
    ``rayft-<date>-<time>``) is ASCII letters, digits, ``.``, ``_`` and ``-``, not starting with ``.``,
    at most 128 characters (:func:`check_run_name`).
    """

    storage_path: _StoragePath = "./runs"
    name: str | None = None
    every_steps: int | None = Field(default=None, ge=1, description="Checkpoint every N optimizer steps.")
    every_minutes: float | None = Field(default=None, gt=0, description="Checkpoint when M minutes passed since the last one.")
    keep_last: int = Field(default=2, ge=1)
    async_save: bool = Field(
        default=True, description="Write shards in the background; the step loop waits only for the copy to CPU memory."
    )
    write_threads: int = Field(
        default=8, ge=1, le=64, description="Threads (and files) per rank writing a checkpoint (DCP FileSystemWriter thread_count)."
    )
    save_final: bool = Field(
        default=True,
        description="Checkpoint at the last step; off only for benchmarks (the run can then be neither resumed nor exported later).",
    )
    final_model_only: bool = Field(
        default=False,
        description="The last step's checkpoint holds the model's weights only, not the optimizer's state (with AdamW, "
        "not its two moments: 8 of every 12 bytes per parameter): it can be exported and verified, but no run can "
        "resume training from it.",
    )
    export_hf: bool = True
    on_signal: bool = Field(
        default=True,
        description="On SIGTERM/SIGINT to the driver (or `rayft stop`): checkpoint the last finished step before stopping (then --resume).",
    )
    signal_grace_s: float = Field(
        default=25.0,
        gt=0,
        le=3600,
        description="Seconds a stop on SIGTERM/SIGINT may take (checkpoint, metrics, summary): under Kubernetes' 30 s grace by default.",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        return None if v is None else check_run_name(v)

    @property
    def periodic_async(self) -> bool:
        """Async saves every N steps and/or M minutes: each stages into the same reused host buffers
        (pinned on a GPU: rayft.train.staging_buffers); a run that saves once or never does not."""
        return self.async_save and bool(self.every_steps or self.every_minutes)


class RayConfig(_Section):
    """How the driver reaches Ray: ``address`` (or RAY_ADDRESS) for a running cluster, else embedded."""

    address: str | None = None
    max_failures: int = Field(default=0, ge=-1, description="Worker-group restarts allowed (-1: unlimited).")
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of the embedded local Ray (default: all).")
    log_to_driver: bool = False
    verify_transport: Literal["efa", "nvlink", "socket", "any"] | None = Field(
        default=None,
        description="At the end of the run, read every Ray Train worker's NCCL log through Ray's log API (`rayft doctor`) "
        "and fail the run (exit 1) unless every rank used this transport (any: only failures and environment faults "
        "fail it); sets NCCL_DEBUG=INFO in the workers. The Ray job is recorded in the run directory either way, "
        "for `rayft doctor --run RUN_DIR`.",
    )


class RayftConfig(_Section):
    """The whole job: one YAML file with these sections."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    cluster: ClusterConfig | None = Field(default=None, description="Where the job runs on EKS (rayft.cluster.spec).")
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="TensorBoard, MLflow, W&B (rayft.config_tracking; secrets from the environment)."
    )

    @model_validator(mode="after")
    def _check(self) -> "RayftConfig":
        if self.model.attn_implementation == "flash_attention_2" and self.data.packing and self.train.micro_batch_size > 1:
            raise ValueError(
                "model.attn_implementation=flash_attention_2 with data.packing needs train.micro_batch_size: 1 "
                "(transformers finds packed documents for FlashAttention only in a batch of one row); "
                "use sdpa or flex_attention for larger micro-batches"
            )
        if self.train.warmup_steps and self.train.max_steps and self.train.warmup_steps > self.train.max_steps:
            raise ValueError(f"train.warmup_steps ({self.train.warmup_steps}) exceeds train.max_steps ({self.train.max_steps})")
        if self.train.eval_every and not (self.data.validation_files or self.data.validation_fraction):
            raise ValueError("train.eval_every needs a validation set: data.validation_files or data.validation_fraction")
        if self.train.gpu_memory_limit_gib is not None and self.train.use_gpu is False:
            raise ValueError(
                f"train.gpu_memory_limit_gib={self.train.gpu_memory_limit_gib:g} caps GPU workers' memory, but train.use_gpu is false"
            )
        if self.train.liger_kernels and self.train.use_gpu is False:
            raise ValueError("train.liger_kernels are CUDA (Triton) kernels, but train.use_gpu is false")
        if self.train.float8 and self.data.seq_len % 16:
            raise ValueError(
                f"train.float8 needs data.seq_len to be a multiple of 16 (the float8 matmul's dimensions; a micro-batch "
                f"has rows × row length tokens), got {self.data.seq_len}"
            )
        return self

"""The architecture presets: published model configurations, as plain data (no torch, no transformers).

The config loader reads them (:mod:`rayft.train.memory_check`) as well as the workers
(:mod:`rayft.train.model`, which builds a randomly initialised model from one). Every full-size
preset copies the architecture fields of the model's published ``config.json`` (the URL is in the
comment above it); a ``*-tiny`` preset keeps its family's architecture and real vocabulary with 2
layers and hidden size 64, for CPU tests. :mod:`rayft.train.families` says which tokenizer, chat
template and kernels go with each ``model_type``.
"""

from __future__ import annotations

from typing import Any

# https://huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json (and the other sizes)
_QWEN2_5_COMMON = dict(
    model_type="qwen2", vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
    attention_dropout=0.0, use_sliding_window=False,
)  # fmt: skip
# https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json (1.7B, 4B, 8B: the same fields)
_QWEN3_COMMON = dict(
    model_type="qwen3", vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=151643, eos_token_id=151645, head_dim=128,
    attention_bias=False, attention_dropout=0.0, use_sliding_window=False, sliding_window=None,
)  # fmt: skip
# https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json (3.2-3B and 3.1-8B: the
# same fields but the RoPE scaling factor, 8 for 3.1)
_LLAMA3_COMMON = dict(
    model_type="llama", vocab_size=128256, max_position_embeddings=131072, rope_theta=500_000.0,
    rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=128000, eos_token_id=128001,
    attention_bias=False, mlp_bias=False, attention_dropout=0.0,
)  # fmt: skip


def _llama3_rope(factor: float) -> dict:
    return dict(rope_type="llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


# https://huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json
_MISTRAL_V03 = dict(
    model_type="mistral", vocab_size=32768, max_position_embeddings=32768, rope_theta=1_000_000.0,
    rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=1, eos_token_id=2, sliding_window=None,
    attention_dropout=0.0, tie_word_embeddings=False,
)  # fmt: skip
# https://huggingface.co/google/gemma-2-2b/blob/main/config.json: attention-logit soft-capping 50,
# final-logit soft-capping 30, a 4096-token sliding window on every other layer.
_GEMMA2_COMMON = dict(
    model_type="gemma2", vocab_size=256000, max_position_embeddings=8192, rope_theta=10_000.0,
    rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=1, pad_token_id=0,
    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256, sliding_window=4096,
    attention_bias=False, attention_dropout=0.0, tie_word_embeddings=True,
)  # fmt: skip
# https://huggingface.co/microsoft/Phi-3.5-mini-instruct/blob/main/config.json, without its
# LongRoPE scaling (rope_scaling: 48 short and 48 long per-frequency factors for the 128K context,
# not reproduced here): this preset is the architecture at its original 4,096-token context
# (original_max_position_embeddings). Load the hub id for the published long-context RoPE.
_PHI3_COMMON = dict(
    model_type="phi3", vocab_size=32064, max_position_embeddings=4096, rope_theta=10_000.0,
    rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
    sliding_window=None, attention_dropout=0.0, resid_pdrop=0.0, embd_pdrop=0.0, tie_word_embeddings=False,
)  # fmt: skip
# The tiny variants: 2 layers, hidden 64, 4 query heads of 16 (2 key/value heads), the real vocabulary.
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(_QWEN2_5_COMMON, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN2_5_COMMON, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-3b": dict(_QWEN2_5_COMMON, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN2_5_COMMON, vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       tie_word_embeddings=False, rms_norm_eps=1e-6),
    # https://huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json (and -32B, -72B): for `rayft fit` and the bigger-model runs
    "qwen2.5-14b": dict(_QWEN2_5_COMMON, vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                        tie_word_embeddings=False, rms_norm_eps=1e-5),
    "qwen2.5-32b": dict(_QWEN2_5_COMMON, vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                        num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                        tie_word_embeddings=False, rms_norm_eps=1e-5),
    "qwen2.5-72b": dict(_QWEN2_5_COMMON, vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        tie_word_embeddings=False, rms_norm_eps=1e-5),
    "qwen3-0.6b": dict(_QWEN3_COMMON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(_QWEN3_COMMON, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(_QWEN3_COMMON, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(_QWEN3_COMMON, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "llama-3.2-1b": dict(_LLAMA3_COMMON, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         rope_scaling=_llama3_rope(32.0)),
    # https://huggingface.co/meta-llama/Llama-3.2-3B/blob/main/config.json
    "llama-3.2-3b": dict(_LLAMA3_COMMON, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                         rope_scaling=_llama3_rope(32.0)),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama-3.1-8b": dict(_LLAMA3_COMMON, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                         rope_scaling=_llama3_rope(8.0)),
    "mistral-7b-v0.3": dict(_MISTRAL_V03, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128),
    "gemma-2-2b": dict(_GEMMA2_COMMON, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256),
    "phi-3.5-mini": dict(_PHI3_COMMON, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32),
    # Tiny models of each architecture with the real vocabulary, for CPU smoke tests and CI.
    "qwen2-tiny": dict(_QWEN2_5_COMMON, **_TINY, tie_word_embeddings=True),
    "qwen3-tiny": dict(_QWEN3_COMMON, **dict(_TINY, head_dim=16), tie_word_embeddings=True),
    "llama3-tiny": dict(_LLAMA3_COMMON, **_TINY, head_dim=16, tie_word_embeddings=True, rope_scaling=_llama3_rope(32.0)),
    "mistral-tiny": dict(_MISTRAL_V03, **_TINY, head_dim=16),
    # sliding window 16 and query_pre_attn_scalar 16 (the head size): both act on the tests' short rows
    "gemma2-tiny": dict(_GEMMA2_COMMON, **dict(_TINY, head_dim=16), sliding_window=16, query_pre_attn_scalar=16),
    "phi3-tiny": dict(_PHI3_COMMON, **_TINY),
}  # fmt: skip


def is_preset(name: str) -> bool:
    """True when ``name`` is one of :data:`PRESETS` (case-insensitive)."""
    return name.lower() in PRESETS

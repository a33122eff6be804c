"""The architecture presets: published model configurations, as plain data (no torch, no transformers).

The config loader reads them (:mod:`rayft.train.memory_check`) as well as the workers
(:mod:`rayft.train.model`, which builds a randomly initialised model from one).
"""

from __future__ import annotations

from typing import Any

# Published configurations (config.json of Qwen/Qwen2.5-*B on the Hugging Face hub).
_QWEN2_5_COMMON = dict(
    model_type="qwen2", vocab_size=151936, max_position_embeddings=32768, rope_theta=1_000_000.0,
    rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
    attention_dropout=0.0, use_sliding_window=False,
)  # fmt: skip
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
    # A tiny Qwen2-architecture model with the real vocabulary, for CPU smoke tests and CI.
    "qwen2-tiny": dict(_QWEN2_5_COMMON, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}  # fmt: skip


def is_preset(name: str) -> bool:
    """True when ``name`` is one of :data:`PRESETS` (case-insensitive)."""
    return name.lower() in PRESETS

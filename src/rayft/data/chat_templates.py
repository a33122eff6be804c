"""Chat templates of the model families that rayft's offline tokenizers carry (rayft's own Jinja,
written to render the same text as each family's published template; the render is checked token by
token in tests/unit/test_families.py and tests/unit/test_family_tools.py).

Each template renders ``messages`` (``role`` system|user|assistant|tool, ``content`` str,
``tool_calls`` on assistant turns, ``tool_call_id`` on tool results) with ``tools`` and
``add_generation_prompt`` as transformers' ``apply_chat_template`` passes them. Tool use (the tool
list, assistant tool calls, tool results) is rendered by the Llama 3, Mistral v3 and Qwen3
templates, each in its family's own format (described above each template); Gemma 2 and Phi-3 have
none. A template that cannot render something (tools for Gemma 2 or Phi-3, a system turn for
Gemma 2, two tool calls in one Llama 3 turn, a Mistral v3 tool call without its id) calls
``raise_exception`` with the reason; :func:`rayft.data.tokenize.tokenize_conversation` reports it as
a ``DataError`` naming the record.

Sources of the formats (the published ``tokenizer_config.json`` ``chat_template`` of each):
meta-llama/Llama-3.1-8B-Instruct (its defaults: tools in the first user turn, no builtin tools);
mistralai/Mistral-7B-Instruct-v0.3 and mistral-common's v3 instruct tokenizer, whose token ids the
Mistral template reproduces (the system prompt and the tools go with the last user turn, as
mistral-common encodes them); google/gemma-2-2b-it; Qwen/Qwen3-8B; microsoft/Phi-3.5-mini-instruct.
"""

from __future__ import annotations


def _lit(s: str) -> str:
    """``s`` as a Jinja string literal."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _raise(message: str) -> str:
    """A Jinja statement raising ``message`` (a Jinja string expression)."""
    return "{{- raise_exception(" + message + ") -}}"


def _refuse(family: str, what: str) -> str:
    return _raise(_lit(f"the {family} chat template renders no {what}"))


def _no_tools(family: str) -> str:
    return "{%- if tools -%}" + _refuse(family, "tools") + "{%- endif -%}"


# Llama 3.1 / 3.2 (text; meta-llama/Llama-3.1-8B-Instruct's published template with its defaults:
# tools in the first user turn, no builtin tools): a system header always (its knowledge-cutoff
# lines; the date is Llama 3.1's fixed default, so the same record always gives the same tokens),
# every turn trimmed, ``<|eot_id|>`` ends each turn. With tools, the system header starts with
# ``Environment: ipython`` and the first user turn holds :data:`LLAMA3_TOOLS_GUIDANCE`, then each
# tool as JSON indented by 4 and a blank line, then that turn's text. An assistant tool call renders
# as ``{"name": NAME, "parameters": ARGS}``, one per turn (more are refused, as published; text next
# to a call too: the published template drops it); a tool result as an ``ipython`` turn holding the
# content JSON-encoded: the published template tests ``is mapping or is iterable``, which a string
# passes too, so a string result renders as a JSON string (quoted, escaped), exactly as there. A
# system turn after the first renders as a turn of its own, as published.
LLAMA3_TOOLS_GUIDANCE = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers "
    'the given prompt.\n\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] | trim -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}"
    "{%- if tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' + sys + '<|eot_id|>' -}}"
    "{%- if tools -%}"
    "{%- if not rest or rest[0]['role'] != 'user' -%}" + _refuse("Llama 3", "tools without a first user turn to hold them") + "{%- endif -%}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' + " + _lit(LLAMA3_TOOLS_GUIDANCE) + " -}}"
    "{%- for t in tools -%}{{- (t | tojson(indent=4)) + '\\n\\n' -}}{%- endfor -%}"
    "{{- (rest[0]['content'] | trim) + '<|eot_id|>' -}}"
    "{%- set rest = rest[1:] -%}"
    "{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m['role'] in ['tool', 'ipython'] -%}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' -}}"
    "{{- (m['content'] | tojson) if m['content'] is iterable else m['content'] -}}{{- '<|eot_id|>' -}}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] -%}"
    "{%- if m['tool_calls'] | length != 1 -%}"
    + _raise(_lit("the Llama 3 chat template renders one tool call per assistant turn, as published; this turn has ")
             + " + (m['tool_calls'] | length | string)")
    + "{%- endif -%}"
    "{%- if m['content'] | trim -%}" + _refuse("Llama 3", "text next to a tool call (the published template drops it)") + "{%- endif -%}"
    "{%- set c = m['tool_calls'][0] -%}{%- set f = c['function'] if c['function'] is defined else c -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{\"name\": \"' + f['name'] + '\", \"parameters\": ' -}}"
    "{{- (f['arguments'] | tojson) + '}<|eot_id|>' -}}"
    "{%- else -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)  # fmt: skip

# A tool call id as mistral-common's v3 validator wants it: 9 ASCII letters or digits.
_MISTRAL_ID_OK = "({v} is string and {v} | length == 9 and {v}.isascii() and {v}.isalnum())"

# Mistral v3 (7B-Instruct-v0.3), as mistral-common's v3 instruct encoder: ``[INST] user[/INST]``,
# `` assistant</s>`` (trailing spaces of a reply dropped); the system prompt prefixes the last user
# turn. With tools, ``[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]`` comes just before that last user
# turn: each tool as ``{"type": "function", "function": {"name", "description", "parameters"}}``
# (mistral-common's key order; a missing description is "", missing parameters {}; other keys of the
# schema are left out). An assistant turn's tool calls: ``[TOOL_CALLS] [{"name": ..., "arguments":
# {...}, "id": ...}, ...]</s>`` (several calls in one list); text next to tool calls is refused, as
# mistral-common's v3 encoder refuses it. A tool result: ``[TOOL_RESULTS] {"content": C, "call_id":
# ID}[/TOOL_RESULTS]``, where C is the result's JSON when the text is JSON (mistral-common parses and
# re-serializes it; a template cannot parse, so JSON objects, arrays, strings, numbers and literals
# are put in as written, trimmed: the same text when they were written as Python's json.dumps writes
# them), else the text as a JSON string, and an empty result ``{}``.
# Tool call ids: as mistral-common's v3 validator in fine-tuning mode, every tool result needs the
# 9-letter-or-digit id of its call, and every tool call needs such an id except in the conversation's
# last turn (there a call without id renders without the "id" key); a missing or malformed id is
# refused naming what is missing, never invented.
MISTRAL_V3_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in rest -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- if tools and ns.last_user < 0 -%}" + _refuse("Mistral v3", "tools without a user turn to hold them") + "{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for m in rest -%}"
    "{%- set last_turn = loop.last -%}"
    "{%- if m['role'] == 'user' -%}"
    "{%- if loop.index0 == ns.last_user and tools -%}"
    "{{- '[AVAILABLE_TOOLS] [' -}}"
    "{%- for t in tools -%}"
    "{%- set f = t['function'] if t['function'] is defined else t -%}"
    "{{- '{\"type\": \"function\", \"function\": {\"name\": ' + (f['name'] | tojson) + ', \"description\": ' -}}"
    "{{- ((f['description'] or '') | tojson) + ', \"parameters\": ' + ((f['parameters'] or {}) | tojson) + '}}' -}}"
    "{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '][/AVAILABLE_TOOLS]' -}}"
    "{%- endif -%}"
    "{%- if loop.index0 == ns.last_user and sys -%}{{- '[INST] ' + sys + '\\n\\n' + m['content'] + '[/INST]' -}}"
    "{%- else -%}{{- '[INST] ' + m['content'] + '[/INST]' -}}{%- endif -%}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] -%}"
    "{%- if m['content'] -%}" + _refuse("Mistral v3", "text next to tool calls (mistral-common's v3 encoder refuses it)") + "{%- endif -%}"
    "{{- '[TOOL_CALLS] [' -}}"
    "{%- for c in m['tool_calls'] -%}"
    "{%- set f = c['function'] if c['function'] is defined else c -%}"
    "{{- '{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' -}}"
    "{{- f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -}}"
    "{%- if c['id'] is defined and c['id'] is not none and c['id'] != 'null' -%}"
    "{%- if not " + _MISTRAL_ID_OK.format(v="c['id']") + " -%}"
    + _raise(_lit("the Mistral v3 chat template needs tool call ids of 9 letters or digits (as mistral-common's v3), got ")
             + " + (c['id'] | tojson)")
    + "{%- endif -%}"
    "{{- ', \"id\": ' + (c['id'] | tojson) -}}"
    "{%- elif not last_turn -%}"
    + _raise(_lit("the Mistral v3 chat template needs an id (9 letters or digits) on every tool call but those of the last turn, "
                  "as mistral-common's v3; this call of ") + " + (f['name'] | tojson) + " + _lit(" has none"))
    + "{%- endif -%}"
    "{{- '}' -}}{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- ']' + eos_token -}}"
    "{%- elif m['role'] == 'assistant' -%}{{- ' ' + m['content'].rstrip(' ') + eos_token -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{%- set id = m['tool_call_id'] -%}"
    "{%- if id is not defined or id is none -%}"
    + _refuse("Mistral v3", "tool result without the tool_call_id of its call (mistral-common's v3 needs it)")
    + "{%- elif not " + _MISTRAL_ID_OK.format(v="id") + " -%}"
    + _raise(_lit("the Mistral v3 chat template needs tool call ids of 9 letters or digits (as mistral-common's v3), got ")
             + " + (id | tojson)")
    + "{%- endif -%}"
    "{%- set c = m['content'] -%}{%- set t = c | trim -%}"
    "{%- if c == '' -%}{%- set c = '{}' -%}"
    "{%- elif t in ['true', 'false', 'null'] or (t[:1] == '{' and t[-1:] == '}') or (t[:1] == '[' and t[-1:] == ']')"
    " or (t | length > 1 and t[:1] == '\"' and t[-1:] == '\"')"
    " or (t[:1] in ['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'] and ((t | int | string) == t or (t | float | string) == t)) -%}"
    "{%- set c = t -%}"
    "{%- else -%}{%- set c = c | tojson -%}{%- endif -%}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + c + ', \"call_id\": ' + (id | tojson) + '}[/TOOL_RESULTS]' -}}"
    "{%- else -%}" + _refuse("Mistral v3", "later system turns") + "{%- endif -%}"
    "{%- endfor -%}"
)  # fmt: skip

# Gemma 2: ``<start_of_turn>user|model\n...<end_of_turn>\n``, content trimmed; no system role, no
# tool use (the published template has neither).
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
# prompt the conversation ends with the EOS token (``<|endoftext|>``). No tool use (the published
# template has none).
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

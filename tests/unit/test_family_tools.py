"""Tool use in the Llama 3 and Mistral v3 chat templates (issue 22): Mistral's token ids equal those
of mistral-common's own v3 encoder (fine-tuning mode, the request built from the same OpenAI-format
record by mistral-common's ``from_openai``); Llama's render equals the published format written out
here and tokenizes as Meta's own tokenizer does; the loss mask trains the tool calls, their
end-of-turn token and the replies, never the tool list, the tool results or the user's text; what a
family's format cannot hold is refused with a ``DataError`` naming the record."""

import copy
import importlib.util
import json
from functools import cache
from pathlib import Path

import pytest

from rayft.data.examples import DataError
from rayft.data.records import to_conversation
from rayft.data.tokenize import tokenize_conversation
from rayft.data.tokenizer import build_standin_tokenizer, load_tokenizer


def _package_dir(name: str) -> Path:
    return Path(list(importlib.util.find_spec(name).submodule_search_locations)[0])


@cache
def tokenizer(name: str):
    """The offline tokenizers by name, and the Gemma and Phi stand-ins (as in test_families.py)."""
    standin = {"gemma-standin": "gemma2", "phi-standin": "phi3"}
    return build_standin_tokenizer(standin[name]) if name in standin else load_tokenizer(name)


WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOLS = [{"type": "function", "function": WEATHER}]


def call(city: str, call_id: str | None = None) -> dict:
    """An OpenAI-format tool call of get_weather (arguments as a JSON string, as the API writes them)."""
    c = {"type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
    return {"id": call_id, **c} if call_id else c


# system, tools, user, one tool call (with a 9-character id, as Mistral v3 wants), its result, a reply
ONE_CALL = {
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call("Paris", "Kq7bT2xZp")]},
        {"role": "tool", "tool_call_id": "Kq7bT2xZp", "content": '{"temp": 22}'},
        {"role": "assistant", "content": "22 °C."},
    ],
}
# two calls in one turn, two results (a JSON object and plain text), a later user turn (the system
# prompt and the tools move to it), a reply with a trailing space (mistral-common drops it), and a
# last turn calling without an id (mistral-common's fine-tuning mode allows it there only)
TWO_CALLS = {
    "tools": TOOLS + [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}],
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [call("Paris", "Kq7bT2xZp"), call("Rome", "R8mN3vWy1")]},
        {"role": "tool", "tool_call_id": "Kq7bT2xZp", "content": '{"temp": 22, "sky": "clair"}'},
        {"role": "tool", "tool_call_id": "R8mN3vWy1", "content": "25 degrees, très chaud"},
        {"role": "assistant", "content": "22 and 25. "},
        {"role": "user", "content": "And Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call("Oslo")]},
    ],
}


def _mistral_common():
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = _package_dir("mistral_common") / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    return MistralTokenizer.from_file(str(path), mode=ValidationMode.finetuning)


@pytest.mark.parametrize("record", [ONE_CALL, TWO_CALLS], ids=["one_call", "two_calls"])
def test_mistral_v3_tool_use_gives_mistral_commons_ids(record):
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    want = (
        _mistral_common()
        .encode_chat_completion(ChatCompletionRequest.from_openai(copy.deepcopy(record["messages"]), tools=record["tools"]))
        .tokens
    )
    conv = to_conversation(copy.deepcopy(record), "t:1", "messages")
    ex = tokenize_conversation(tokenizer("mistral-v3"), conv)
    assert ex.input_ids.tolist() == want
    assert (
        list(tokenizer("mistral-v3").apply_chat_template(list(conv.messages), tools=list(conv.tools), tokenize=True, return_dict=False))
        == want
    )
    # the control tokens are single ids: [AVAILABLE_TOOLS] 6, [/AVAILABLE_TOOLS] 7, [TOOL_CALLS] 5, [TOOL_RESULTS] 8, [/TOOL_RESULTS] 9
    assert [i for i in want if 5 <= i <= 9] == ([6, 7, 5, 8, 9] if record is ONE_CALL else [5, 8, 9, 8, 9, 6, 7, 5])


def test_mistral_v3_mask_trains_the_calls_and_replies_only():
    mt = _mistral_common().instruct_tokenizer.tokenizer
    tok = tokenizer("mistral-v3")
    ex = tokenize_conversation(tok, to_conversation(copy.deepcopy(ONE_CALL), "t:1", "messages"))
    trained = ex.input_ids[ex.trainable].tolist()
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Kq7bT2xZp"}]'
    # [TOOL_CALLS] + the call list + </s>, then the reply + </s>, each piece as mistral-common encodes it
    assert trained == [5, *mt.encode(calls, bos=False, eos=False), 2, *mt.encode("22 °C.", bos=False, eos=False), 2]
    assert tok.decode(trained) == '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Kq7bT2xZp"}]</s> 22 °C.</s>'
    # a later user turn, two calls in a turn and a last turn of calls: still the calls and replies only
    ex = tokenize_conversation(tok, to_conversation(copy.deepcopy(TWO_CALLS), "t:2", "messages"))
    assert tok.decode(ex.input_ids[ex.trainable]) == (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Kq7bT2xZp"}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}, "id": "R8mN3vWy1"}]</s>22 and 25.</s>'
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]</s>'
    )


# The conversation of ONE_CALL as Llama 3.1's published template renders it (tools in the first user
# turn; a string tool result goes through ``tojson``, as the published template does with strings).
LLAMA3_ONE_CALL = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
    "{\n"
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "get_weather",\n'
    '        "description": "Weather of a city",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "city": {\n'
    '                    "type": "string"\n'
    "                }\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}\n\n"
    "Weather in Paris?<|eot_id|>"
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>'
    '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 22}"<|eot_id|>'
    "<|start_header_id|>assistant<|end_header_id|>\n\n22 °C.<|eot_id|>"
)


def test_llama3_tool_use_renders_the_published_text():
    from llama_models.llama3.tokenizer import Tokenizer

    tok = tokenizer("llama3")
    conv = to_conversation(copy.deepcopy(ONE_CALL), "t:1", "messages")
    assert tok.apply_chat_template(list(conv.messages), tools=list(conv.tools), tokenize=False) == LLAMA3_ONE_CALL
    ex = tokenize_conversation(tok, conv)
    # the same ids as Meta's own tokenizer gives the text, the turn markers single special ids
    meta = Tokenizer(_package_dir("llama_models") / "llama3" / "tokenizer.model")
    assert ex.input_ids.tolist() == meta.encode(LLAMA3_ONE_CALL, bos=False, eos=False, allowed_special="all")
    turn = [128006, 128007, 128009]  # <|start_header_id|>, <|end_header_id|>, <|eot_id|>
    assert [i for i in ex.input_ids.tolist() if i >= 128000] == [128000, *turn * 5]
    # the ShareGPT form of the same conversation (no call ids: Llama has none) gives the same tokens
    sharegpt = {
        "system": "Be brief.",
        "tools": json.dumps([WEATHER]),
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
            {"from": "observation", "value": '{"temp": 22}'},
            {"from": "gpt", "value": "22 °C."},
        ],
    }
    sg = tokenize_conversation(tok, to_conversation(sharegpt, "s:1", "sharegpt"))
    assert sg.input_ids.tolist() == ex.input_ids.tolist() and sg.trainable.tolist() == ex.trainable.tolist()


def test_llama3_mask_trains_the_call_and_reply_only():
    tok = tokenizer("llama3")
    ex = tokenize_conversation(tok, to_conversation(copy.deepcopy(ONE_CALL), "t:1", "messages"))
    assert tok.decode(ex.input_ids[ex.trainable]) == '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>22 °C.<|eot_id|>'
    # a later user turn: its text and the tool result stay untrained
    rec = copy.deepcopy(ONE_CALL)
    rec["messages"] += [{"role": "user", "content": "Tomorrow?"}, {"role": "assistant", "content": None, "tool_calls": [call("Paris")]},
                        {"role": "tool", "content": "21"}, {"role": "assistant", "content": "21 °C."}]  # fmt: skip
    ex = tokenize_conversation(tok, to_conversation(rec, "t:2", "messages"))
    assert tok.decode(ex.input_ids[ex.trainable]) == (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>22 °C.<|eot_id|>'
        '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>21 °C.<|eot_id|>'
    )


def _with(messages_edit) -> dict:
    rec = copy.deepcopy(ONE_CALL)
    messages_edit(rec["messages"])
    return rec


@pytest.mark.parametrize(
    "name,record,message",
    [
        (
            "llama3",
            _with(lambda m: m[2].update(tool_calls=[call("Paris"), call("Rome")])),
            "the Llama 3 chat template renders one tool call per assistant turn, as published; this turn has 2",
        ),
        (
            "llama3",
            _with(lambda m: m[2].update(content="Let me look.")),
            "the Llama 3 chat template renders no text next to a tool call (the published template drops it)",
        ),
        (
            "mistral-v3",
            _with(lambda m: m[2].update(content="Let me look.")),
            "the Mistral v3 chat template renders no text next to tool calls (mistral-common's v3 encoder refuses it)",
        ),
        (
            "mistral-v3",
            _with(lambda m: m[2].update(tool_calls=[call("Paris")])),
            "the Mistral v3 chat template needs an id (9 letters or digits) on every tool call but those of the last turn, "
            'as mistral-common\'s v3; this call of "get_weather" has none',
        ),
        (
            "mistral-v3",
            _with(lambda m: m[3].pop("tool_call_id")),
            "the Mistral v3 chat template renders no tool result without the tool_call_id of its call (mistral-common's v3 needs it)",
        ),
        (
            "mistral-v3",
            _with(lambda m: (m[2].update(tool_calls=[call("Paris", "call_1")]), m[3].update(tool_call_id="call_1"))),
            'the Mistral v3 chat template needs tool call ids of 9 letters or digits (as mistral-common\'s v3), got "call_1"',
        ),
        (
            "mistral-v3",
            {"tools": TOOLS, "messages": [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi."}]},
            "the Mistral v3 chat template renders no tools without a user turn to hold them",
        ),
        ("gemma-standin", ONE_CALL, "the Gemma chat template renders no tools"),
        ("phi-standin", ONE_CALL, "the Phi-3 chat template renders no tools"),
    ],
    ids=[
        "llama3-two_calls",
        "llama3-text_and_call",
        "mistral-text_and_call",
        "mistral-call_without_id",
        "mistral-result_without_id",
        "mistral-id_not_9_characters",
        "mistral-tools_without_user",
        "gemma-tools",
        "phi-tools",
    ],
)
def test_tool_use_a_format_cannot_hold_is_refused_naming_the_record(name, record, message):
    with pytest.raises(DataError) as e:
        tokenize_conversation(tokenizer(name), to_conversation(copy.deepcopy(record), "data.jsonl:5", "messages"))
    assert str(e.value) == f"data.jsonl:5: {message}"


def test_a_template_that_leaves_tool_call_turns_out_is_refused_not_guessed():
    """A chat template of the user's (not rayft's) that renders no text for an assistant turn of tool
    calls: the turn cannot be located, so the record is refused, instead of a span running on into
    the tool result after it."""
    tok = tokenizer("llama3")
    tok.chat_template = (
        "{{- bos_token -}}{%- for m in messages -%}{%- if not (m['role'] == 'assistant' and m['tool_calls']) -%}"
        "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] or '') + '<|eot_id|>' -}}"
        "{%- endif -%}{%- endfor -%}"
    )  # fmt: skip
    rec = copy.deepcopy(ONE_CALL)
    rec["messages"][3]["content"] = "SECRET TOOL RESULT"
    with pytest.raises(DataError, match=r"^t:9: cannot locate assistant turn 2 in the chat template's rendering$"):
        tokenize_conversation(tok, to_conversation(rec, "t:9", "messages"))

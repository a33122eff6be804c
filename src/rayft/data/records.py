"""One record ─► one training example: the ``messages``, ``sharegpt``, ``alpaca`` and ``text``
record formats (described in :mod:`rayft.data.formats`), their validation, and ``data.columns``
renaming (:data:`COLUMN_KEYS`)."""

from __future__ import annotations

import json
from typing import Literal

from rayft.data.examples import Conversation, Example, TextDocument, bad_record

Format = Literal["auto", "messages", "sharegpt", "alpaca", "text"]
ROLES = ("system", "user", "assistant", "tool")
#: ShareGPT ``from`` values → roles; a ``function_call`` turn becomes an assistant turn with ``tool_calls``.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "function_call",
    "observation": "tool",
}
#: Per-turn training weight keys: ``weight`` (OpenAI's fine-tuning format) and ``loss_weight``
#: (LLaMA-Factory's). 0: the turn is rendered but not trained; 1: trained (the default). See
#: :func:`_turn_trained`.
WEIGHT_KEYS = ("weight", "loss_weight")
#: Per-turn training flags: ``training`` and ``train`` (axolotl's ``message_field_training``, as its
#: docs and tests name it). false: the turn is rendered but not trained (weight 0); true: trained
#: (weight 1).
FLAG_KEYS = ("training", "train")
#: Every key that says whether a turn is trained (:func:`_turn_trained`).
TRAINED_KEYS = WEIGHT_KEYS + FLAG_KEYS
#: Keys a message may have, per role (``messages`` format), besides :data:`TRAINED_KEYS`.
MESSAGE_KEYS = {
    "system": {"role", "content"},
    "user": {"role", "content"},
    "assistant": {"role", "content", "tool_calls"},
    "tool": {"role", "content", "name", "tool_call_id"},
}

#: The hint of a refused loss-mask key.
_WHOLE_TURN = "rayft trains or skips whole turns: mark the turn with 'weight' (0: not trained, 1: trained) or 'training' (false/true)"

#: Keys of a message or turn that change what it means and that rayft cannot honour: refused (when
#: not null), never ignored like other unknown keys. ``tool_calls`` is honoured on assistant
#: messages and refused on any other (see :func:`_other_keys`).
MEANINGFUL_KEYS = {
    "function_call": "the legacy OpenAI function call is not read: write it as 'tool_calls'",
    "reasoning_content": "reasoning traces are not rendered: move the reasoning into the content, or remove the key",
    "reasoning": "reasoning traces are not rendered: move the reasoning into the content, or remove the key",
    "thinking": "reasoning traces are not rendered: move the reasoning into the content, or remove the key",
    # loss masks rayft cannot honour, or whose sense differs between tools
    "train_detail": f"per-span training (axolotl's message_field_training_detail) is not supported; {_WHOLE_TURN}",
    "training_detail": f"per-span training (axolotl's message_field_training_detail) is not supported; {_WHOLE_TURN}",
    "mask": f"a loss mask whose sense (true: trained, or true: masked out?) differs between tools; {_WHOLE_TURN}",
    "masked": f"a loss mask whose sense (true: trained, or true: masked out?) differs between tools; {_WHOLE_TURN}",
    "loss_mask": f"a loss mask whose sense (true: trained, or true: masked out?) differs between tools; {_WHOLE_TURN}",
    "trainable": f"a training flag rayft does not read under this name; {_WHOLE_TURN}",
    "loss": f"a per-turn loss flag (XTuner's) is not read, and true on a prompt turn would train it; {_WHOLE_TURN}",
}

#: ``data.columns`` keys: the names this reader uses, which a dataset may spell otherwise. Record
#: fields, then keys of a turn, then role names (values of ``role`` / ``from``).
COLUMN_KEYS = (
    "messages",
    "conversations",
    "system",
    "tools",
    "instruction",
    "input",
    "output",
    "history",
    "text",
    "role",
    "content",
    "tool_calls",
    "from",
    "value",
    "user",
    "assistant",
    "tool",
    "function_call",
)
_ROLE_KEYS = ("user", "assistant", "tool", "function_call")


class _Names:
    """Names under a ``data.columns`` mapping (``{key: the dataset's name}``): ``names("output")`` is
    the dataset's name for ``output``; ``names.hint("output")`` is `` (data.columns.output)`` when
    mapped, for error messages."""

    def __init__(self, columns: dict[str, str] | None = None):
        self.columns = dict(columns or {})

    def __call__(self, key: str) -> str:
        return self.columns.get(key, key)

    def hint(self, key: str) -> str:
        return f" (data.columns.{key})" if key in self.columns else ""

    def roles(self, defaults: dict[str, str]) -> dict[str, str]:
        """``{name in the data: role}``: ``defaults`` with each mapped role's name(s) replaced."""
        out = {name: role for name, role in defaults.items() if role not in self.columns}
        out.update({self.columns[k]: k for k in _ROLE_KEYS if k in self.columns and k in defaults.values()})
        return out


def check_columns(columns: dict[str, str] | None) -> dict[str, str]:
    """Validate a ``data.columns`` mapping (keys from :data:`COLUMN_KEYS`, values non-empty strings).

    Raises:
        ValueError: an unknown key or a bad value, naming ``data.columns.<key>``.
    """
    for k, v in (columns or {}).items():
        if k not in COLUMN_KEYS:
            raise ValueError(f"data.columns.{k}: unknown key (known: {', '.join(COLUMN_KEYS)})")
        if not isinstance(v, str) or not v:
            raise ValueError(f"data.columns.{k}: must be a non-empty string, got {v!r}")
    return dict(columns or {})


_PLAIN = _Names()


def _str_field(rec: dict, key: str, where: str, required: bool, names: _Names = _PLAIN) -> str:
    name = names(key)
    v = rec.get(name)
    if v is None:
        if required:
            raise bad_record(where, "missing_field", f"missing field {name!r}{names.hint(key)}")
        return ""
    if not isinstance(v, str):
        raise bad_record(where, "wrong_type", f"field {name!r} must be a string, got {type(v).__name__}")
    return _valid_text(v, where, name)


def _valid_text(v: str, where: str, field: str) -> str:
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad_record(
            where, "invalid_unicode", f"{field} holds invalid Unicode ({e.reason}, e.g. a lone \\u{ord(v[e.start]):04x} escape)"
        ) from None
    return v


def detect_format(rec: dict, where: str, columns: dict[str, str] | None = None) -> Format:
    """The format of one record by its keys (as named by ``columns``, see :data:`COLUMN_KEYS`):
    ``messages``, ``conversations`` (sharegpt), ``instruction``/``output`` (alpaca), else ``text``.

    Raises:
        DataError: none of these keys (kind ``unknown_format``).
    """
    n = _Names(columns)
    if n("messages") in rec:
        return "messages"
    if n("conversations") in rec:
        return "sharegpt"
    if n("instruction") in rec or n("output") in rec:
        return "alpaca"
    if n("text") in rec:
        return "text"
    raise bad_record(
        where,
        "unknown_format",
        f"unknown record format (keys: {sorted(rec)}); expected {n('messages')!r}, sharegpt's {n('conversations')!r}, "
        f"alpaca's {n('instruction')}/{n('output')} or {n('text')!r}",
    )


def to_example(
    rec: object, where: str, fmt: Format = "auto", columns: dict[str, str] | None = None, *, ignored: set[str] | None = None
) -> Example:
    """Turn one record into a :class:`Conversation` (messages, sharegpt, alpaca) or a
    :class:`TextDocument` (text). ``columns`` renames fields, turn keys and roles (``{key: the
    dataset's name}``, keys from :data:`COLUMN_KEYS`, checked by the caller with :func:`check_columns`).

    Keys of a message or turn that rayft does not read (``name`` on a user turn, ids, timestamps,
    ``metadata``, ...) and keys of a text part other than ``type``/``text``/``value`` are ignored;
    when ``ignored`` is given their names are added to it (a text part's as ``content[].key``),
    for the caller's once-per-file note. Keys that change a turn's meaning are refused instead
    (:data:`MEANINGFUL_KEYS`, ``tool_calls`` on a turn that is not the assistant's).

    Raises:
        DataError: not an object, unknown format, missing/unknown role, malformed tool use, wrong
            types, empty conversation or text, no assistant turn (nothing to learn from), a bad
            per-turn weight, or a required mapped column missing (the message names
            ``data.columns.<key>``).
    """
    if not isinstance(rec, dict):
        raise bad_record(where, "not_an_object", f"a record must be a JSON object, got {type(rec).__name__}")
    n = _Names(columns)
    if fmt == "auto":
        fmt = detect_format(rec, where, columns)
    if fmt == "text":
        return _text_document(rec, where, n)
    if fmt == "alpaca":
        if n("tools") in rec:
            raise bad_record(where, "tool_use", f"{n('tools')!r} is read only in messages and sharegpt records (alpaca has no tool turns)")
        return _alpaca(rec, where, n)
    if fmt == "sharegpt":
        return _sharegpt(rec, where, n, ignored)
    return _messages(rec, where, n, ignored)


def to_conversation(rec: object, where: str, fmt: Format = "auto") -> Example:
    """Alias of :func:`to_example` (kept for callers of the chat-only reader)."""
    return to_example(rec, where, fmt)


def _text_document(rec: dict, where: str, n: _Names = _PLAIN) -> TextDocument:
    text = _str_field(rec, "text", where, True, n)
    if not text.strip():
        raise bad_record(where, "empty_text", f"field {n('text')!r} is empty (nothing to train on)")
    return TextDocument(text, where)


def _alpaca(rec: dict, where: str, n: _Names = _PLAIN) -> Conversation:
    instruction = _str_field(rec, "instruction", where, True, n)
    inp = _str_field(rec, "input", where, False, n)
    output = _str_field(rec, "output", where, True, n)
    system = _str_field(rec, "system", where, False, n)
    user = f"{instruction}\n{inp}" if inp else instruction
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    hname = n("history")
    history = rec.get(hname) or []
    if not isinstance(history, list):
        raise bad_record(where, "wrong_type", f"field {hname!r} must be a list of [user, assistant] pairs")
    for i, pair in enumerate(history):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise bad_record(where, "wrong_type", f"{hname}[{i}] must be a [user, assistant] pair of strings")
        msgs += [
            {"role": "user", "content": _valid_text(pair[0], where, f"{hname}[{i}][0]")},
            {"role": "assistant", "content": _valid_text(pair[1], where, f"{hname}[{i}][1]")},
        ]
    msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    return _checked(Conversation(tuple(msgs), where))


def _other_keys(turn: dict, extra: set[str], where: str, name: str, calls: tuple[str, str], ignored: set[str] | None) -> None:
    """Judge a turn's keys that the reader does not read (``extra``): refuse those that change its
    meaning (:data:`MEANINGFUL_KEYS`, and ``calls = (key, why)``: tool calls where they cannot be),
    add the others to ``ignored``. A null value counts as absent."""
    for k in sorted(extra):
        if turn[k] is None:
            continue
        if k == calls[0]:
            raise bad_record(where, "unsupported_key", f"{name} has {k!r}: {calls[1]}")
        if k in MEANINGFUL_KEYS:
            raise bad_record(where, "unsupported_key", f"{name} has {k!r}: {MEANINGFUL_KEYS[k]}")
    if ignored is not None:
        ignored.update(extra)


def _messages(rec: dict, where: str, n: _Names = _PLAIN, ignored: set[str] | None = None) -> Conversation:
    field, role_key, content_key, calls_key = n("messages"), n("role"), n("content"), n("tool_calls")
    messages = rec.get(field)
    if messages is None and field != "messages":
        raise bad_record(where, "missing_field", f"missing field {field!r}{n.hint('messages')}")
    if not isinstance(messages, list):
        raise bad_record(where, "wrong_type", f"field {field!r} must be a list, got {type(messages).__name__}")
    if not messages:
        raise bad_record(where, "empty_conversation", "empty conversation")
    tools = _tools(rec, where, n)
    roles = n.roles({r: r for r in ROLES})
    out: list[dict] = []
    untrained: list[int] = []
    for i, m in enumerate(messages):
        turn = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise bad_record(where, "wrong_type", f"{turn} must be an object, got {type(m).__name__}")
        name = m.get(role_key)
        if name is None:
            raise bad_record(where, "missing_role", f"{turn} has no {role_key!r}{n.hint('role')}")
        if not isinstance(name, str) or name not in roles:
            raise bad_record(where, "unknown_role", f"{turn} has unknown {role_key} {name!r} (expected one of {', '.join(roles)})")
        role = roles[name]
        extra = set(m) - {n(k) for k in MESSAGE_KEYS[role]} - set(TRAINED_KEYS)
        if extra:
            refused = (calls_key, f"only assistant messages call tools, not a {role} message (the calls would be lost)")
            _other_keys(m, extra, where, turn, refused, ignored)
        msg: dict = {"role": role}
        calls = m.get(calls_key)
        if calls is not None:
            cname = f"{turn}.{calls_key}"
            if not isinstance(calls, list):
                raise bad_record(where, "wrong_type", f"{cname} must be a list, got {type(calls).__name__}")
            msg["tool_calls"] = [_tool_call(c, where, f"{cname}[{j}]") for j, c in enumerate(calls)]
        content = m.get(content_key)
        if content_key not in m and content_key != "content" and not msg.get("tool_calls"):
            raise bad_record(where, "missing_field", f"{turn} has no {content_key!r}{n.hint('content')}")
        # an assistant message that calls tools may have no content (OpenAI writes null)
        msg["content"] = (
            "" if content is None and msg.get("tool_calls") else _content(content, where, f"{turn}.{content_key}", ignored, content_key)
        )
        for k in ("name", "tool_call_id"):  # a tool message's, kept for templates that show them (Qwen2.5's does not)
            if k in m and k in MESSAGE_KEYS[role]:
                if not isinstance(m[k], str):
                    raise bad_record(where, "wrong_type", f"{turn}.{k} must be a string, got {type(m[k]).__name__}")
                msg[k] = m[k]
        if not _turn_trained(m, role, where, turn) and role == "assistant":
            untrained.append(len(out))
        out.append(msg)
    return _checked(Conversation(tuple(out), where, tools, tuple(untrained)), field=field)


def _tools(rec: dict, where: str, n: _Names = _PLAIN) -> tuple[dict, ...]:
    """The record's ``tools``: a list of function schemas, or a JSON string of one (ShareGPT
    datasets store it so). A bare schema ``{"name", "description", "parameters"}`` is wrapped as
    ``{"type": "function", "function": schema}``; absent, null, ``""`` and ``[]`` mean no tools."""
    field = n("tools")
    v = rec.get(field)
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError as e:
            raise bad_record(where, "tool_use", f"field {field!r} is not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(v, list):
        raise bad_record(
            where, "wrong_type", f"field {field!r} must be a list of function schemas (or a JSON string of one), got {type(v).__name__}"
        )
    out = []
    for i, t in enumerate(v):
        if not isinstance(t, dict):
            raise bad_record(where, "wrong_type", f"{field}[{i}] must be an object, got {type(t).__name__}")
        if "function" in t:
            if t.get("type", "function") != "function":
                raise bad_record(where, "tool_use", f"{field}[{i}] has type {t.get('type')!r}: only function tools are supported")
            fn, name = t["function"], f"{field}[{i}].function"
            if not isinstance(fn, dict):
                raise bad_record(where, "wrong_type", f"{name} must be an object, got {type(fn).__name__}")
            tool = {**t, "type": "function"}
        else:
            fn, name, tool = t, f"{field}[{i}]", {"type": "function", "function": t}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_record(where, "tool_use", f"{name} has no 'name' (a function schema needs a non-empty string name)")
        _valid_text(json.dumps(tool, ensure_ascii=False), where, f"{field}[{i}]")
        out.append(tool)
    return tuple(out)


def _tool_call(call: object, where: str, name: str) -> dict:
    """One tool call ─► ``{"type": "function", "function": {"name": str, "arguments": dict}}`` (plus
    its ``id`` when given). Accepts that form (``arguments`` may be a JSON string of an object, as the
    OpenAI API writes it) and a bare ``{"name", "arguments"}`` (ShareGPT ``function_call`` values)."""
    if not isinstance(call, dict):
        raise bad_record(where, "wrong_type", f"{name} must be an object, got {type(call).__name__}")
    out: dict = {}
    if "function" in call:
        extra = set(call) - {"type", "function", "id"}
        if extra:
            raise bad_record(
                where, "unsupported_key", f"{name} has unsupported key(s) {sorted(extra)} (a tool call has 'type', 'function', 'id')"
            )
        if call.get("type", "function") != "function":
            raise bad_record(where, "tool_use", f"{name} has type {call.get('type')!r}: only function calls are supported")
        if "id" in call:
            if not isinstance(call["id"], str):
                raise bad_record(where, "wrong_type", f"{name}.id must be a string, got {type(call['id']).__name__}")
            out["id"] = call["id"]
        fn, name = call["function"], f"{name}.function"
        if not isinstance(fn, dict):
            raise bad_record(where, "wrong_type", f"{name} must be an object, got {type(fn).__name__}")
    else:
        fn = call
    extra = set(fn) - {"name", "arguments"}
    if extra:
        raise bad_record(
            where, "unsupported_key", f"{name} has unsupported key(s) {sorted(extra)} (a function call has 'name' and 'arguments')"
        )
    fname, args = fn.get("name"), fn.get("arguments")
    if not isinstance(fname, str) or not fname:
        raise bad_record(where, "tool_use", f"{name} has no 'name' (a non-empty string)")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise bad_record(where, "tool_use", f"{name}.arguments is not valid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(args, dict):
        raise bad_record(where, "tool_use", f"{name}.arguments must be an object (or a JSON string of one), got {type(args).__name__}")
    _valid_text(fname + json.dumps(args, ensure_ascii=False), where, name)
    out.update(type="function", function={"name": fname, "arguments": args})
    return out


def _content(content: object, where: str, name: str, ignored: set[str] | None = None, key: str = "content") -> str:
    """A message's text: a string, or a list of text parts ``{"type": "text", "text": str}`` (the
    OpenAI / Hugging Face chat format) or ``{"type": "text", "value": str}`` (LLaMA-Factory's),
    joined without a separator. Other keys of a part (``cache_control``, ...) are ignored and
    added to ``ignored`` as ``<key>[].<part key>`` (``key``: the message's content key)."""
    if isinstance(content, str):
        return _valid_text(content, where, name)
    if not isinstance(content, list):
        raise bad_record(where, "wrong_type", f"{name} must be a string or a list of text parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        pname = f"{name}[{j}]"
        if not isinstance(part, dict):
            raise bad_record(where, "wrong_type", f'{pname} must be an object {{"type": "text", "text": ...}}, got {type(part).__name__}')
        kind = part.get("type")
        if kind != "text":
            what = "has no 'type'" if kind is None else f"is a {kind!r} part"
            raise bad_record(where, "unsupported_content", f"{pname} {what}: only text parts are supported")
        extra = set(part) - {"type", "text", "value"}
        if extra and ignored is not None:
            ignored.update(f"{key}[].{k}" for k in extra)
        if part.get("text") is not None and part.get("value") is not None:
            raise bad_record(where, "unsupported_content", f"{pname} has both 'text' and 'value': give the part's text once")
        tkey = "value" if part.get("value") is not None else "text"  # LLaMA-Factory writes "value"
        text = part.get(tkey)
        if not isinstance(text, str):
            raise bad_record(where, "wrong_type", f"{pname}.{tkey} must be a string, got {type(text).__name__}")
        texts.append(_valid_text(text, where, f"{pname}.{tkey}"))
    return "".join(texts)


def _sharegpt(rec: dict, where: str, n: _Names = _PLAIN, ignored: set[str] | None = None) -> Conversation:
    field, from_key, value_key = n("conversations"), n("from"), n("value")
    turns = rec.get(field)
    if turns is None:
        raise bad_record(where, "missing_field", f"missing field {field!r}{n.hint('conversations')}")
    if not isinstance(turns, list):
        raise bad_record(where, "wrong_type", f"field {field!r} must be a list, got {type(turns).__name__}")
    if not turns:
        raise bad_record(where, "empty_conversation", "empty conversation")
    system = _str_field(rec, "system", where, False, n)
    tools = _tools(rec, where, n)
    roles = n.roles(SHAREGPT_ROLES)
    out: list[dict] = [{"role": "system", "content": system}] if system else []
    untrained: list[int] = []
    for i, t in enumerate(turns):
        turn = f"{field}[{i}]"
        if not isinstance(t, dict):
            raise bad_record(where, "wrong_type", f"{turn} must be an object, got {type(t).__name__}")
        extra = set(t) - {from_key, value_key} - set(TRAINED_KEYS)
        if extra:
            _other_keys(t, extra, where, turn, ("tool_calls", "ShareGPT records call tools in function_call turns"), ignored)
        frm = t.get(from_key)
        if frm is None:
            raise bad_record(where, "missing_role", f"{turn} has no {from_key!r}{n.hint('from')}")
        if not isinstance(frm, str):
            raise bad_record(where, "wrong_type", f"{turn}.{from_key} must be a string, got {type(frm).__name__}")
        if frm not in roles:
            raise bad_record(where, "unknown_role", f"{turn} has unknown {from_key!r} {frm!r} (expected one of {', '.join(roles)})")
        role = roles[frm]
        if role == "system" and system:
            raise bad_record(where, "misplaced_system", f"{turn} is a system turn and the record also has a {n('system')!r} field")
        if value_key not in t and value_key != "value":
            raise bad_record(where, "missing_field", f"{turn} has no {value_key!r}{n.hint('value')}")
        value = t.get(value_key)
        if not isinstance(value, str):
            raise bad_record(where, "wrong_type", f"{turn}.{value_key} must be a string, got {type(value).__name__}")
        replies = role in ("assistant", "function_call")
        if not _turn_trained(t, "assistant" if replies else role, where, turn) and replies:
            untrained.append(len(out))
        if role == "function_call":  # value: JSON of {"name", "arguments"}, or a list of them
            try:
                calls = json.loads(value)
            except json.JSONDecodeError as e:
                raise bad_record(
                    where, "tool_use", f"{turn} is a function_call turn whose value is not valid JSON: {e.msg} (column {e.colno})"
                ) from None
            name = f"{turn}.{value_key}"
            if isinstance(calls, list):
                if not calls:
                    raise bad_record(where, "tool_use", f"{name} is an empty list of function calls")
                tool_calls = [_tool_call(c, where, f"{name}[{j}]") for j, c in enumerate(calls)]
            else:
                tool_calls = [_tool_call(calls, where, name)]
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            out.append({"role": role, "content": _valid_text(value, where, f"{turn}.{value_key}")})
    return _checked(Conversation(tuple(out), where, tools, tuple(untrained)), field=field, shift=1 if system else 0, by_index=False)


def _turn_trained(turn: dict, role: str, where: str, name: str) -> bool:
    """Whether a turn is trained, by its per-turn weight (:data:`WEIGHT_KEYS`) or training flag
    (:data:`FLAG_KEYS`): none given (absent or null) → trained.

    A weight is 0 or 1 (``0.0``/``1.0`` too: LLaMA-Factory writes floats); fractional weights are
    not supported. A flag is ``false`` (as weight 0) or ``true`` (as weight 1). On a turn that is
    not the assistant's only 0 / false is accepted: LLaMA-Factory writes ``loss_weight: 0.0`` on
    every system and user turn, axolotl's examples ``training: false``, which is what rayft does
    anyway (OpenAI allows ``weight`` on assistant messages only); 1 / true there would ask to train
    a prompt, which rayft never does. Several keys on one turn must agree.

    Raises:
        DataError: any other value, or keys that disagree (kind ``bad_weight``), naming the turn.
    """
    given: dict[str, bool] = {}
    for k in TRAINED_KEYS:
        v = turn.get(k)
        if v is None:
            continue
        if k in FLAG_KEYS:
            if not isinstance(v, bool):
                raise bad_record(
                    where, "bad_weight", f"{name}.{k} is {v!r}: a turn's training flag must be true (trained) or false (not trained)"
                )
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v not in (0, 1):
            frac = " (fractional weights are not supported)" if isinstance(v, float) and 0 < v < 1 else ""
            raise bad_record(where, "bad_weight", f"{name}.{k} is {v!r}: a turn's weight must be 0 (not trained) or 1 (trained){frac}")
        given[k] = bool(v)
    if not given:
        return True
    if len(set(given.values())) > 1:
        keys = [f"{k!r} {turn[k]!r}" for k in given]
        raise bad_record(where, "bad_weight", f"{name} has {', '.join(keys[:-1])} and {keys[-1]}: they disagree, give one")
    trained = next(iter(given.values()))
    if trained and role != "assistant":
        k = next(iter(given))
        may = "a training flag on another turn may only be false" if k in FLAG_KEYS else "a weight on another turn may only be 0"
        raise bad_record(where, "bad_weight", f"{name}.{k} is {turn[k]!r} on a {role} turn: only assistant turns are trained ({may})")
    return trained


def _checked(conv: Conversation, field: str = "messages", shift: int = 0, by_index: bool = True) -> Conversation:
    """Reject conversations that would train on nothing, or on empty replies. ``field``/``shift``
    name turn *i* of ``conv.messages`` as ``field[i - shift]`` of the record; ``by_index``: an
    empty assistant turn is named ``assistant turn i`` instead. An assistant turn that is not
    trained (weight 0 or training false, in ``conv.untrained``) may be empty; when no assistant turn
    is trained the conversation has nothing to train on (kind ``no_trained_turn``)."""
    roles = [m["role"] for m in conv.messages]
    if "assistant" not in roles:
        raise bad_record(conv.source, "no_assistant_turn", "no assistant turn (nothing to train on)")
    for i, m in enumerate(conv.messages):
        trained = i not in conv.untrained
        if m["role"] == "assistant" and trained and not m["content"].strip() and not m.get("tool_calls"):
            name = f"assistant turn {i}" if by_index else f"assistant turn {field}[{i - shift}]"
            raise bad_record(conv.source, "empty_assistant_turn", f"{name} is empty (training on it teaches empty replies)")
        if m["role"] == "system" and i > 0:
            raise bad_record(conv.source, "misplaced_system", f"{field}[{i - shift}] is a system turn after the first message")
    if all(i in conv.untrained for i, r in enumerate(roles) if r == "assistant"):
        raise bad_record(conv.source, "no_trained_turn", "every assistant turn has weight 0 or training false (nothing to train on)")
    return conv

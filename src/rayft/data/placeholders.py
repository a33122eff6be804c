"""Template placeholders left in the data (``{{name}}``, ``<NAME>``): finding them outside code
(:func:`placeholders_in`), and filling them from ``data.placeholders`` (:func:`fill_placeholders`).
The rules are described in :mod:`rayft.data.formats`."""

from __future__ import annotations

import dataclasses
import re

from rayft.data.examples import Example, TextDocument, bad_record

#: A template placeholder left in the data: ``{{name}}`` (an identifier between double braces, not
#: inside triple braces), or ``<NAME>`` (2+ upper-case letters, digits or ``_``, starting with a
#: letter, not preceded by a letter, digit, ``_`` or ``<``, so that ``List<STRING>`` and ``<<EOF>>``
#: are not placeholders). Lower-case ``<name>`` is never one: it cannot be told from an XML tag.
_PLACEHOLDER = re.compile(r"(?<!\{)\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}(?!\})|(?<![A-Za-z0-9_<])<([A-Z][A-Z0-9_]*[A-Z0-9])>")
#: Code, where ``{{name}}`` and ``<NAME>`` are code (Jinja, Vue, Go templates, shell): Markdown
#: fenced blocks (an unclosed fence runs to the end) and inline code spans.
_CODE = re.compile(r"```.*?(?:```|\Z)|~~~.*?(?:~~~|\Z)|`[^`\n]+`", re.S)
#: Upper-case ``<NAME>`` words that are not placeholders: HTML elements (old HTML is written in
#: capitals), tokenizer special tokens, chat role and sequence markers, keyboard keys and control
#: characters (Vim's ``<CR>``, ``<F1>``).
NOT_PLACEHOLDERS = frozenset(
    """A ABBR ACRONYM ADDRESS AREA ARTICLE ASIDE AUDIO B BASE BDI BDO BIG BLOCKQUOTE BODY BR BUTTON CANVAS
    CAPTION CENTER CITE CODE COL COLGROUP DATA DATALIST DD DEL DETAILS DFN DIALOG DIR DIV DL DT EM EMBED
    FIELDSET FIGCAPTION FIGURE FONT FOOTER FORM FRAME FRAMESET H1 H2 H3 H4 H5 H6 HEAD HEADER HGROUP HR HTML I
    IFRAME IMG INPUT INS KBD LABEL LEGEND LI LINK MAIN MAP MARK MENU META METER NAV NOBR NOFRAMES NOSCRIPT
    OBJECT OL OPTGROUP OPTION OUTPUT P PARAM PICTURE PRE PROGRESS Q RP RT RUBY S SAMP SCRIPT SEARCH SECTION
    SELECT SLOT SMALL SOURCE SPAN STRIKE STRONG STYLE SUB SUMMARY SUP SVG TABLE TBODY TD TEMPLATE TEXTAREA
    TFOOT TH THEAD TIME TITLE TR TRACK TT U UL VAR VIDEO WBR XMP
    BOS EOS EOT PAD UNK SEP CLS MASK SOS EOF USER ASSISTANT SYSTEM START
    ENTER RETURN TAB ESC SPACE CTRL ALT SHIFT DEL BACKSPACE UP DOWN LEFT RIGHT HOME END PGUP PGDN INSERT
    CR LF BS NL""".split()
    + [f"F{i}" for i in range(1, 13)]
)


def _prose(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of ``text`` outside code (:data:`_CODE`)."""
    out, pos = [], 0
    for m in _CODE.finditer(text):
        out.append((pos, m.start()))
        pos = m.end()
    out.append((pos, len(text)))
    return out


#: A closing tag ``</name>`` (any case, blanks before the ``>``): its name.
_CLOSING = re.compile(r"</([A-Za-z][A-Za-z0-9_]*)\s*>")


def _closed_names(text: str) -> frozenset[str]:
    """The names of the closing tags anywhere in ``text`` (code included), upper-cased: one scan."""
    return frozenset(m.group(1).upper() for m in _CLOSING.finditer(text)) if "</" in text else frozenset()


def _placeholder_matches(text: str) -> list[re.Match]:
    """The placeholders of ``text`` (:data:`_PLACEHOLDER`) outside code, in order; an upper-case
    ``<NAME>`` is left out when it is in :data:`NOT_PLACEHOLDERS` or closed by ``</NAME>`` (any
    case) in the same text (an XML-style tag). Linear in ``text``: the closing tags are collected
    once (:func:`_closed_names`), not searched for per ``<NAME>``."""
    if "{{" not in text and "<" not in text:
        return []
    found = []
    closed: frozenset[str] | None = None
    for a, b in _prose(text):
        for m in _PLACEHOLDER.finditer(text, a, b):
            angle = m.group(2)
            if angle and angle in NOT_PLACEHOLDERS:
                continue
            if angle:
                closed = _closed_names(text) if closed is None else closed
                if angle in closed:
                    continue
            found.append(m)
    return found


def _texts(example: Example) -> list[str]:
    return [example.text] if isinstance(example, TextDocument) else [m["content"] for m in example.messages]


def placeholders_in(example: Example) -> list[str]:
    """The template placeholders left in an example's text (every message's content, or the
    document), as written (``{{name}}``, ``<NAME>``), each once, in order of first appearance.

    The patterns are narrow on purpose (:data:`_PLACEHOLDER`): text in Markdown code blocks and
    inline code is skipped, and ``<div>``, ``<br/>``, ``<TABLE>``, ``List<String>``, ``a < b > c``,
    ``<T>``, ``<UNK>`` are not placeholders."""
    return list(dict.fromkeys(m.group(0) for t in _texts(example) for m in _placeholder_matches(t)))


def placeholder_name(placeholder: str) -> str:
    """``{{name}}`` → ``name``, ``<NAME>`` → ``NAME``: its key in ``data.placeholders``."""
    return placeholder[2:-2] if placeholder.startswith("{{") else placeholder[1:-1]


def check_placeholders(mapping: dict[str, str] | None) -> dict[str, str]:
    """Validate a ``data.placeholders`` mapping: identifier keys (``[A-Za-z_][A-Za-z0-9_]*``),
    string values.

    Raises:
        ValueError: naming ``data.placeholders.<key>``.
    """
    for k, v in (mapping or {}).items():
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise ValueError(f"data.placeholders.{k}: a placeholder's name is letters, digits and '_', not starting with a digit")
        if not isinstance(v, str):
            raise ValueError(f"data.placeholders.{k}: must be a string, got {type(v).__name__}")
    return dict(mapping or {})


def fill_placeholders(example: Example, mapping: dict[str, str]) -> Example:
    """The example with each placeholder named in ``mapping`` (``data.placeholders``) replaced by
    its value, where :func:`placeholders_in` finds placeholders (not in code). A key fills the
    placeholder spelled exactly so: ``name`` fills ``{{name}}``; an upper-case key such as
    ``NAME`` fills ``{{NAME}}`` and ``<NAME>`` (lower-case ``<name>`` is never a placeholder, see
    :data:`_PLACEHOLDER`). Returns ``example`` itself when nothing was filled.

    The filled example is checked again, as the record was: a value may empty what must not be
    empty.

    Raises:
        DataError: a trained assistant turn (without tool calls) or a text document that is empty
            once filled (kinds ``empty_assistant_turn``, ``empty_text``), at the example's ``source``.
    """
    if not mapping:
        return example

    def fill(text: str) -> str:
        out, pos = [], 0
        for m in _placeholder_matches(text):
            value = mapping.get(m.group(1) or m.group(2))
            if value is not None:
                out += [text[pos : m.start()], value]
                pos = m.end()
        return "".join(out) + text[pos:] if out else text

    what = f"once data.placeholders filled it ({', '.join(sorted(mapping))})"
    if isinstance(example, TextDocument):
        text = fill(example.text)
        if text == example.text:
            return example
        if not text.strip():
            raise bad_record(example.source, "empty_text", f"the text is empty {what} (nothing to train on)")
        return dataclasses.replace(example, text=text)
    messages = tuple({**m, "content": fill(m["content"])} for m in example.messages)
    if messages == example.messages:
        return example
    for i, (m, before) in enumerate(zip(messages, example.messages)):
        emptied = m["content"] != before["content"] and not m["content"].strip() and not m.get("tool_calls")
        if emptied and m["role"] == "assistant" and i not in example.untrained:
            raise bad_record(
                example.source, "empty_assistant_turn", f"assistant turn {i} is empty {what} (training on it teaches empty replies)"
            )
    return dataclasses.replace(example, messages=messages)

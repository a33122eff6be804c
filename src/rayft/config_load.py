"""Loading the config: YAML (duplicate keys, unreadable values and oversized documents refused),
``--set`` overrides, then pydantic's validation of :class:`rayft.config.RayftConfig`, with every
error naming the file, the dotted key path and, where the YAML parser knows it, the line
(:func:`load_config`), and a micro-batch too large for any GPU refused there too (before any
worker starts); and the resolved config written back as YAML (:func:`dump_config`).
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rayft.config import ConfigError, RayftConfig
from rayft.config_suggest import did_you_mean
from rayft.config_tracking import secret_key_hint


class UnreadableValueError(yaml.constructor.ConstructorError):
    """A YAML value its tag's constructor cannot convert (``!!int abc``, ``0x_``)."""


MAX_YAML_DEPTH = 64  # nesting levels of a config document (pydantic's serialiser stops near a few hundred)
MAX_YAML_VALUES = 1_000_000  # values in a config document once its aliases are expanded


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently),
    a key that is not text (a list or mapping, or ``on``, ``5``, ``~``, which YAML reads as a
    boolean, number or null), a value its tag cannot hold (``!!int abc``, ``0x_``),
    aliases that refer to themselves or expand to more than :data:`MAX_YAML_VALUES` values, and
    nesting deeper than :data:`MAX_YAML_DEPTH`. Each refusal is a ``yaml.MarkedYAMLError`` with the
    line where YAML has one."""

    def construct_document(self, node):
        _check_node_graph(node)
        return super().construct_document(node)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError) as e:  # a scalar its tag's constructor cannot convert
            what = repr(node.value) if isinstance(node, yaml.ScalarNode) else "this value"
            raise UnreadableValueError(None, None, f"cannot read {what} as {node.tag.rsplit(':', 1)[-1]}: {e}", node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a plain value, not a {type(key).__name__} (line {line})", key_node.start_mark
                )
            if not isinstance(key, str):  # on/off/yes/no, numbers, ~: every config key is text
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key_node.value!r} reads as {type(key).__name__} {key!r} in YAML (line {line}); keys are text: quote it",
                    key_node.start_mark,
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (lines {seen[key]} and {line})", key_node.start_mark
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# A date-like scalar stays the text it is (a run name such as 2024-02-03 is a name, not a date).
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node))


def _check_node_graph(root: yaml.Node) -> None:
    """Refuse a composed YAML document that nests deeper than :data:`MAX_YAML_DEPTH`, holds an
    alias inside its own anchor, or expands (aliases counted at every use) to more than
    :data:`MAX_YAML_VALUES` values. Iterative, so a hostile document cannot exhaust the stack.

    Raises:
        yaml.constructor.ConstructorError: with the offending node's position.
    """
    size: dict[int, int] = {}  # expanded value count of each finished node
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        if done:
            on_path.discard(id(node))
            kids = _children(node)
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            if size[id(node)] > MAX_YAML_VALUES:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the document expands to more than {MAX_YAML_VALUES:,} values (YAML aliases repeating one another?)",
                    node.start_mark,
                )
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to the anchor it is inside (a recursive value)", node.start_mark
            )
        if depth > MAX_YAML_DEPTH:
            raise yaml.constructor.ConstructorError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", node.start_mark)
        on_path.add(id(node))
        stack.append((node, depth, True))
        stack.extend((k, depth + 1, False) for k in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def load_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`_UniqueKeyLoader`'s checks.

    Raises:
        yaml.YAMLError: a syntax error or a refused document (``problem_mark`` gives the line).
    """
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _line_of(path: Path, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the key at ``loc`` in the YAML file, or None when the file lacks that key."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError):
        return None
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            hit = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if hit is None:
                return None
            line, node = hit[0].start_mark.line + 1, hit[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


_UNION_TAG = re.compile(r"constrained-\w+|literal\[.*\]|bool|int|float|str|list\[.*\]|tuple\[.*\]|function-\w+\[.*\]")


def _where(dotted: str, loc: tuple[Any, ...], path: Path | None, overridden: set[str]) -> str:
    """`` (from --set)``, `` (line N)`` or ``""``: where the value at ``loc`` was given."""
    if any(dotted == o or dotted.startswith(o + ".") for o in overridden):
        return " (from --set)"  # the value itself came from --set
    if ln := _line_of(path, loc) if path is not None and loc else None:
        return f" (line {ln})"  # in the file (a section that --set only added keys to included)
    if any(o.startswith(dotted + ".") for o in overridden):
        return " (from --set)"  # a section that only --set created
    return ""


def where_given(path: str | os.PathLike[str], loc: tuple[Any, ...], overrides: list[str] | None = None) -> str:
    """`` (line N)``, `` (from --set)`` or ``""``: where the config file at ``path`` with ``--set``
    ``overrides`` gives the value at ``loc`` (``("data", "train_files", 0)``), as config errors say it."""
    overridden = {".".join(parse_override(o)[0]) for o in overrides or []}
    return _where(".".join(str(x) for x in loc if not isinstance(x, int)), loc, Path(path), overridden)


def _format_validation_error(err: ValidationError, source: str, path: Path | None, overridden: set[str]) -> str:
    # A value failing every member of a union (int | "auto") yields one error per member, each with the
    # member's tag in its location: report them as one error with the alternatives joined by "or".
    merged: dict[tuple, dict] = {}
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and _UNION_TAG.fullmatch(x)))
        if loc in merged:
            merged[loc]["msg"] += f", or {e['msg'][0].lower()}{e['msg'][1:]}"
        else:
            merged[loc] = {**e, "loc": loc}
    n = len(merged)
    lines = [f"{source}: invalid config ({n} error{'s' if n > 1 else ''})"]
    for e in merged.values():
        loc = e["loc"]
        dotted = ".".join(str(x) for x in loc) or "<top level>"
        where = _where(dotted, loc, path, overridden)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = secret_key_hint(loc) or "unknown key" + did_you_mean(RayftConfig, loc)
        elif e["type"] == "missing":
            msg = "required key is missing"
        given = e.get("input")
        tail = "" if e["type"] in ("extra_forbidden", "missing") or isinstance(given, dict) else f" (got {given!r})"
        lines.append(f"  {dotted}{where}: {msg}{tail}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into (["a","b","c"], parsed value). The value is parsed as YAML.

    A value that is not valid YAML, or that its tag cannot hold, stays the text given.

    Raises:
        ConfigError: when ``item`` has no ``=`` or an empty key, or its value nests too deeply or
            has aliases the loader refuses (:func:`load_yaml`).
    """
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. train.max_steps=100")
    key, _, raw = item.partition("=")
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: empty key segment in {key!r}")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except RecursionError:
        raise ConfigError(f"--set {key}: the value is nested too deeply") from None
    except UnreadableValueError:
        value = raw  # a value its tag cannot hold (!!int 0x): the text itself, for the field to judge
    except yaml.constructor.ConstructorError as e:
        raise ConfigError(f"--set {key}: {e.problem}") from None
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides in order to a raw (unvalidated) config mapping, in place."""
    for item in overrides:
        parts, value = parse_override(item)
        node = raw
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is not a section")
            node = nxt
        node[parts[-1]] = value
    return raw


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> RayftConfig:
    """Read, override and validate a config file.

    Relative paths in ``data.train_files`` and ``data.validation_files`` are resolved against the config file's directory
    when they exist there, else against the current directory.

    Raises:
        ConfigError: unreadable file, YAML syntax error (with line and column), a document the
            loader refuses (a value its tag cannot hold, a list or map as a key, a recursive alias,
            aliases expanding past 1,000,000 values, nesting past 64 levels), a top level that is
            not a mapping, unknown keys or wrong types (each with its dotted key path and line),
            an empty path, an unsafe run name, or a packed micro-batch whose activations alone exceed
            the largest GPU rayft knows (:mod:`rayft.train.memory_check`; ``train.micro_batch_size``'s line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read config: {e}") from None
    try:
        raw = load_yaml(text)
    except RecursionError:
        raise ConfigError(f"{p}: config nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None:
            where = f": line {mark.line + 1}, column {mark.column + 1}"
        elif isinstance(getattr(e, "position", None), int):  # a reader error (e.g. a NUL byte): a character offset
            before = text[: e.position]
            where = f": line {before.count(chr(10)) + 1}, column {len(before) - before.rfind(chr(10))}"
        else:
            where = ""
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or e
        raise ConfigError(f"{p}{where}: YAML syntax error: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(raw).__name__}")
    apply_overrides(raw, overrides or [])
    try:
        cfg = RayftConfig.model_validate(raw)
    except ValidationError as e:
        overridden = {".".join(parse_override(o)[0]) for o in overrides or []}
        raise ConfigError(_format_validation_error(e, str(p), p, overridden)) from None
    base = p.resolve().parent

    def resolve(files: list[str]) -> list[str]:
        resolved = []
        for f in files:
            local = base / f
            if "://" not in f and not os.path.isabs(f) and (local.exists() or glob.glob(str(local))):
                f = str(local.resolve()) if local.exists() else str(local)
            resolved.append(f)
        return resolved

    cfg.data.train_files = resolve(cfg.data.train_files)
    if cfg.data.validation_files:
        cfg.data.validation_files = resolve(cfg.data.validation_files)
    _check_memory(cfg, p, overridden={".".join(parse_override(o)[0]) for o in overrides or []})
    return cfg


def _check_memory(cfg: RayftConfig, path: Path, overridden: set[str]) -> None:
    """Refuse a micro-batch whose activations alone exceed every GPU (or machine) rayft knows
    (:mod:`rayft.train.memory_check`), naming ``train.micro_batch_size`` and where it was given."""
    from rayft.train.memory_check import micro_batch_problem

    problem = micro_batch_problem(
        name_or_path=cfg.model.name_or_path,
        config_overrides=cfg.model.config_overrides,
        micro_batch_size=cfg.train.micro_batch_size,
        seq_len=cfg.data.seq_len,
        packing=cfg.data.packing,
        use_gpu=cfg.train.use_gpu,
    )
    if problem is not None:
        loc = ("train", "micro_batch_size")
        where = _where("train.micro_batch_size", loc, path, overridden)
        raise ConfigError(f"{path}: invalid config (1 error)\n  train.micro_batch_size{where}: {problem}")


def dump_config(cfg: RayftConfig) -> str:
    """The resolved config as YAML (what `rayft config show` prints and each run stores)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True)

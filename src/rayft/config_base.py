"""The base of every config section: a number in a config is a real, finite, 64-bit number.

pydantic's lax mode reads ``true`` as 1 for an ``int`` field and 1.0 for a ``float`` one, so
``micro_batch_size: true`` would silently train with micro-batch 1. Fields whose type admits a
number but not a boolean refuse booleans here, and so do such elements of list, tuple and dict
fields (``betas: [true, 0.95]``); float fields refuse NaN and ±infinity (``lr: .inf``), and
numeric fields integers beyond 64 bits. Everything else keeps pydantic's lax conversions
(``lr: 1e-5``, which YAML 1.1 reads as a string, still becomes a float).

A path field typed :func:`path_field` refuses an empty (or all-blank) string, which would
otherwise mean the current directory, or nothing, depending on where it is used.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator


def _leaf_types(annotation: Any) -> set[Any]:
    """The plain types inside ``annotation`` (through Optional, unions and Annotated); the
    values' types for a ``Literal``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_leaf_types(a) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {type(v) for v in typing.get_args(annotation)}
    return {annotation}


def takes_number_not_bool(annotation: Any) -> bool:
    """True when a field of this type accepts an int or a float but not a bool."""
    leaves = _leaf_types(annotation)
    return bool(leaves & {int, float}) and bool not in leaves


def boolean_for_number(value: Any, annotation: Any) -> str | None:
    """Where ``value`` holds a boolean that ``annotation`` wants as a number: ``""`` for the value
    itself, ``"[i]"`` / ``"[key]"`` for an element of a list, tuple or dict; None when nowhere."""
    if isinstance(value, bool):
        return "" if takes_number_not_bool(annotation) else None
    for ann in _leaf_types(annotation):
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
            homogeneous = origin is not tuple or (len(args) == 2 and args[1] is Ellipsis)
            for i, item in enumerate(value):
                if homogeneous or i < len(args):
                    where = boolean_for_number(item, args[0] if homogeneous else args[i])
                    if where is not None:
                        return f"[{i}]{where}"
        elif origin is dict and isinstance(value, dict) and len(args) == 2:
            for k, item in value.items():
                where = boolean_for_number(item, args[1])
                if where is not None:
                    return f"[{k!r}]{where}"
    return None


INT64_MAX = 2**63 - 1


class ConfigModel(BaseModel):
    """A pydantic model whose numeric fields, and numeric elements of list, tuple and dict
    fields, refuse booleans (the error names the field and the element); whose float fields
    refuse NaN and ±infinity; and whose numeric fields refuse integers beyond 64 bits (a seed or
    a size that torch, numpy or Kubernetes could not hold). Subclasses' ``model_config`` merges
    with this one."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _check_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        ann = cls.model_fields[info.field_name].annotation if info.field_name else None
        where = boolean_for_number(v, ann) if ann is not None else None
        if where is not None:
            raise ValueError(f"expected a number{' at ' + where if where else ''}, not a boolean")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > INT64_MAX and takes_number_not_bool(ann):
            raise ValueError("a number beyond 64 bits (|value| > 2**63 - 1)")
        return v


def path_field(hint: str) -> Any:
    """A ``str`` type for a path or URI that refuses ``''`` and blanks; ``hint`` says what to give instead."""

    def not_blank(v: str) -> str:
        if not v.strip():
            raise ValueError(f"an empty path: {hint}")
        return v

    return Annotated[str, AfterValidator(not_blank)]

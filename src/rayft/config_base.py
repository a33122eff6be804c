"""The base of every config section: a YAML boolean is never taken for a number.

pydantic's lax mode reads ``true`` as 1 for an ``int`` field and 1.0 for a ``float`` one, so
``micro_batch_size: true`` would silently train with micro-batch 1. Fields whose type admits a
number but not a boolean refuse booleans here; everything else keeps pydantic's lax conversions
(``lr: 1e-5``, which YAML 1.1 reads as a string, still becomes a float).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


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


class ConfigModel(BaseModel):
    """A pydantic model whose numeric fields refuse booleans (the error names the field)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name and takes_number_not_bool(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, not a boolean")
        return v

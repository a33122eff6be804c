"""Did-you-mean for config keys: the keys a section of a pydantic config tree accepts, and the
closest to an unknown one (`` (did you mean 'train_files'?)``, in :mod:`rayft.config_load`'s errors)."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field of this type holds (through Optional, unions, Annotated, lists
    and dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        args = args[:1]
    elif origin is dict:
        args = args[1:]
    return [m for a in args if a is not Ellipsis for m in _models_in(a)]


def _keys_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys the section at ``loc`` (a dotted path's parts, list indices included) of the model
    ``root`` accepts: its fields' names (aliases where they have one); ``[]`` when ``loc`` leads to
    no section."""
    models: list[type[BaseModel]] = [root]
    for key in loc:
        if isinstance(key, int):
            continue  # a list element: the element's model, already in models
        found = []
        for model in models:
            for name, field in model.model_fields.items():
                if key in (name, field.alias):
                    found += _models_in(field.annotation)
        if not found:
            return []
        models = found
    return [field.alias or name for model in models for name, field in model.model_fields.items()]


def did_you_mean(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'train_files'?)`` for an unknown key at ``loc`` (in the model ``root``) whose
    name is close to one its section accepts (:func:`difflib.get_close_matches`), else ``""``."""
    if not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], _keys_at(root, loc[:-1]), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""

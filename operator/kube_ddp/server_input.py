"""A spec as the API server reads it, before the models validate it strictly.

For a custom resource the server (1) prunes `null` from fields that are not nullable — none of
ours is — and from the values of typed maps, then applies the fields' defaults, so a null
field counts as unset; it keeps nulls inside free-form objects (x-kubernetes-preserve-unknown-
fields) and refuses null list items; (2) accepts a whole JSON number such as `2.0` where the
schema says integer. Everything else is typed strictly: a string or a boolean is never a
number. `as_the_server_reads` applies (1) and (2); strict validation does the rest.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel


def as_the_server_reads(value: Any, model: type[BaseModel]) -> Any:
    """`value` (a mapping validated as `model`) with nulls pruned and whole floats as ints."""
    if not isinstance(value, dict):
        return _whole_numbers(value)
    fields = {field.alias or name: field for name, field in model.model_fields.items()}
    read: dict[Any, Any] = {}
    for key, item in value.items():
        if item is None:
            continue
        field = fields.get(key)
        read[key] = _read(item, field.annotation) if field else _whole_numbers(item)
    return read


def _read(value: Any, annotation: Any) -> Any:
    for choice in _choices(annotation):
        origin = typing.get_origin(choice)
        if isinstance(choice, type) and issubclass(choice, BaseModel) and isinstance(value, dict):
            return as_the_server_reads(value, choice)
        if origin is list and isinstance(value, list):
            (item_type,) = typing.get_args(choice)
            return [_read(item, item_type) for item in value]
        if origin is dict and isinstance(value, dict):
            _, value_type = typing.get_args(choice)
            if value_type is Any:  # free-form: the server keeps its nulls
                return _whole_numbers(value)
            return {k: _read(v, value_type) for k, v in value.items() if v is not None}
    return _whole_numbers(value)


def _choices(annotation: Any) -> list[Any]:
    """The types an annotation allows: `X | None` and Annotated[X, ...] unwrapped."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _choices(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(annotation) for c in _choices(arg)]
    return [annotation]


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value

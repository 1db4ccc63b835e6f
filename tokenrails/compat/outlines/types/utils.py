"""``outlines.types.utils``: classify Python output types and turn them into enums and schemas.

outlines 1.x code (and its users' adapters) ask these questions of an output type; the answers
follow outlines' documented semantics: ``Annotated[T, ...]`` and ``NewType(..., T)`` count as
``T``; instances are never types; ``bool`` is not an ``int`` instance.
"""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import types as _pytypes
import typing
from enum import Enum, EnumMeta
from typing import Any, Literal, Union, get_args, get_origin


def _unwrap(t: Any) -> Any:
    """``Annotated[T, ...]`` → ``T``; ``NewType("X", T)`` → ``T`` (repeatedly)."""
    while True:
        if get_origin(t) is typing.Annotated:
            t = get_args(t)[0]
        elif hasattr(t, "__supertype__"):
            t = t.__supertype__
        else:
            return t


def is_int(t: Any) -> bool:
    return _unwrap(t) is int


def is_float(t: Any) -> bool:
    return _unwrap(t) is float


def is_str(t: Any) -> bool:
    return _unwrap(t) is str


def is_bool(t: Any) -> bool:
    return _unwrap(t) is bool


def is_int_instance(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_float_instance(value: Any) -> bool:
    return isinstance(value, float)


def is_str_instance(value: Any) -> bool:
    return isinstance(value, str)


def is_datetime(t: Any) -> bool:
    return _unwrap(t) is datetime.datetime


def is_date(t: Any) -> bool:
    return _unwrap(t) is datetime.date


def is_time(t: Any) -> bool:
    return _unwrap(t) is datetime.time


def is_native_dict(t: Any) -> bool:
    return t is dict


def is_typing_dict(t: Any) -> bool:
    return get_origin(t) is dict


def is_typing_list(t: Any) -> bool:
    return get_origin(t) is list


def is_typing_tuple(t: Any) -> bool:
    return get_origin(t) is tuple


def is_union(t: Any) -> bool:
    return get_origin(t) is Union or isinstance(t, _pytypes.UnionType)


def is_literal(t: Any) -> bool:
    return get_origin(t) is Literal


def is_dataclass(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


def is_typed_dict(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__annotations__") \
        and hasattr(t, "__total__")


def is_pydantic_model(t: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return isinstance(t, type) and issubclass(t, BaseModel)


def is_genson_schema_builder(t: Any) -> bool:
    try:
        from genson import SchemaBuilder
    except ImportError:
        return False
    return isinstance(t, SchemaBuilder)


def is_enum(t: Any) -> bool:
    return isinstance(t, EnumMeta)


def is_callable(t: Any) -> bool:
    """A plain function (or partial / bound method): not a class, which is callable too."""
    return callable(t) and not isinstance(t, type)


def _enum_of(name: str, values: list[Any]) -> type[Enum]:
    """An enum whose members are ``values``; member names are ``str(value)``, suffixed with the
    value's type when two values print alike (``"1"`` and ``1`` both survive)."""
    members: list[tuple[str, Any]] = []
    seen: set[str] = set()
    for v in values:
        key = str(v)
        if key in seen:
            key = f"{key}_{type(v).__name__}"
            n = 2
            while key in seen:
                key = f"{str(v)}_{type(v).__name__}_{n}"
                n += 1
        seen.add(key)
        members.append((key, v))
    return Enum(name, members)  # type: ignore[return-value]


def get_enum_from_choice(choice: Any) -> type[Enum]:
    return _enum_of("Choice", list(choice.items))


def get_enum_from_literal(t: Any) -> type[Enum]:
    return _enum_of("Literal", list(get_args(t)))


def get_schema_from_signature(fn: Any) -> dict:
    """A JSON schema of ``fn``'s parameters: every one needs a type annotation; parameters with
    a default are optional and carry it."""
    from pydantic import create_model

    fields = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.annotation is inspect.Parameter.empty:
            raise ValueError(f"parameter {name!r} of {getattr(fn, '__name__', fn)!r} has no type annotation")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (param.annotation, default)
    model = create_model(getattr(fn, "__name__", "Arguments"), **fields)
    return model.model_json_schema()


def get_schema_from_enum(enum: Any) -> dict:
    """``oneOf`` over the members: a ``const`` per value, the signature schema per callable."""
    members = list(enum)
    if not members:
        raise ValueError(f"enum {enum.__name__} has no members (functions must be wrapped in enum.member)")
    one_of = []
    for m in members:
        value = m.value
        if callable(value):
            one_of.append(get_schema_from_signature(value.func if hasattr(value, "func") else value))
        else:
            one_of.append({"const": value})
    return {"title": enum.__name__, "oneOf": one_of}

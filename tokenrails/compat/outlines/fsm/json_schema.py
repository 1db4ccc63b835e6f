"""``outlines.fsm.json_schema``: schema → regex exactly as outlines-core builds it."""
from __future__ import annotations

import json
from enum import Enum
from typing import Any, Callable, Optional

from outlines_core.json_schema import (  # noqa: F401  (re-exported regex building blocks)
    BOOLEAN,
    DATE,
    DATE_TIME,
    INTEGER,
    NULL,
    NUMBER,
    STRING,
    STRING_INNER,
    TIME,
    UUID,
    WHITESPACE,
)
from outlines_core.json_schema import build_regex_from_schema as _core_build

from .._json_language import schema_to_str as convert_json_schema_to_str  # noqa: F401  (outlines name)


def build_regex_from_schema(schema: Any, whitespace_pattern: Optional[str] = None) -> str:
    """outlines-core's regex for ``schema`` (JSON text; a dict or pydantic model is accepted too)."""
    return _core_build(convert_json_schema_to_str(schema), whitespace_pattern)


def get_schema_from_signature(fn: Callable) -> dict:
    """JSON schema of a function's arguments (what ``generate.json(model, fn)`` used); every
    argument needs a type annotation, as in outlines."""
    from ..types.utils import get_schema_from_signature as from_signature

    return from_signature(fn)


def get_schema_from_enum(myenum: type[Enum]) -> dict:
    """``{"title": ..., "oneOf": [{"const": v}, ...]}``: the schema outlines built for an Enum."""
    if len(myenum) == 0:
        raise ValueError(f"enum {myenum.__name__} has no members")
    choices = [
        get_schema_from_signature(m.value.func) if callable(m.value) else {"const": m.value}
        for m in myenum
    ]
    return {"title": myenum.__name__, "oneOf": choices}


def to_regex(resolver: Any, instance: dict, whitespace_pattern: Optional[str] = None) -> str:
    """outlines 0.0.x: the regex of one schema node (``resolver`` — a ``referencing`` resolver for
    ``$ref`` — is not needed: a node's ``$ref``s must resolve inside the node itself)."""
    return build_regex_from_schema(json.dumps(instance), whitespace_pattern)

"""``outlines.types.json_schema_utils``: a JSON schema (dict) as a Python type — a pydantic model,
a TypedDict or a dataclass — so one schema can be handed to libraries that want types.
Written from outlines 1.x's documented behaviour and test cases."""
from __future__ import annotations

import dataclasses
from typing import Any, List, Literal, Optional, Union

import sys

if sys.version_info >= (3, 12):
    from typing import NotRequired, TypedDict
else:  # typing's TypedDict lacks __required_keys__ fidelity before 3.12 (as outlines uses)
    from typing_extensions import NotRequired, TypedDict  # type: ignore

_SCALARS = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def schema_type_to_python(schema: dict, caller_target_type: str) -> Any:
    """The Python type of one schema node; objects become ``caller_target_type`` classes
    ("pydantic", "typeddict", "dataclass"), anything else unknown is ``Any``."""
    if "const" in schema:
        return Literal[schema["const"]]  # type: ignore[valid-type]
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]  # type: ignore[valid-type]
    t = schema.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        parts = [schema_type_to_python(dict(schema, type=x), caller_target_type) for x in non_null]
        base = parts[0] if len(parts) == 1 else Union[tuple(parts)] if parts else type(None)
        return Optional[base] if "null" in t and non_null else base
    if t in _SCALARS:
        return _SCALARS[t]
    if t == "array":
        items = schema.get("items")
        return List[schema_type_to_python(items, caller_target_type) if isinstance(items, dict) else Any]
    if t == "object" and "properties" in schema:
        name = schema.get("title")
        if caller_target_type == "pydantic":
            return json_schema_dict_to_pydantic(schema, name)
        if caller_target_type == "typeddict":
            return json_schema_dict_to_typeddict(schema, name)
        if caller_target_type == "dataclass":
            return json_schema_dict_to_dataclass(schema, name)
    return Any


def _fields(schema: dict) -> tuple[dict, set]:
    return schema.get("properties", {}) or {}, set(schema.get("required", []) or [])


def json_schema_dict_to_typeddict(schema: dict, name: str | None = None) -> type:
    props, required = _fields(schema)
    annotations: dict[str, Any] = {}
    for key, sub in props.items():
        t = schema_type_to_python(sub, "typeddict")
        annotations[key] = t if key in required else NotRequired[t]
    return TypedDict(name or "AnonymousTypedDict", annotations)  # type: ignore[operator]


def json_schema_dict_to_pydantic(schema: dict, name: str | None = None) -> type:
    from pydantic import create_model

    props, required = _fields(schema)
    fields: dict[str, Any] = {}
    for key, sub in props.items():
        t = schema_type_to_python(sub, "pydantic")
        fields[key] = (t, ...) if key in required else (Optional[t], None)
    return create_model(name or "AnonymousPydanticModel", **fields)


def json_schema_dict_to_dataclass(schema: dict, name: str | None = None) -> type:
    props, required = _fields(schema)
    req, opt = [], []
    for key, sub in props.items():
        t = schema_type_to_python(sub, "dataclass")
        if key in required:
            req.append((key, t))
        else:
            opt.append((key, t, dataclasses.field(default=None)))
    return dataclasses.make_dataclass(name or "AnonymousDataclass", req + opt)

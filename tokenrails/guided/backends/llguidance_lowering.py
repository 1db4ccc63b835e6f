"""Exact rewrites of keywords llguidance does not enforce into ones it does.

llguidance enforces ``anyOf``/``allOf``/``properties: {k: false}`` but not ``dependencies`` or most
forms of ``not``; rewriting them keeps the instance set equal, so the backend serves those schemas
exactly instead of refusing them.
"""
from __future__ import annotations

from typing import Any

from ..schema_walk import LIST_KEYS, MAP_KEYS, ONE_KEYS

_ALL_TYPES = ("string", "number", "integer", "boolean", "null", "array", "object")


def lower_dependencies(schema: Any) -> Any:
    """Copy of ``schema`` with ``dependencies``/``dependentRequired``/``dependentSchemas`` and
    simple ``not`` forms rewritten into ``anyOf``/``allOf``/``properties: {k: false}``.

    Exact rewrites (same instance set), used for llguidance, which enforces the results but not
    the originals:

    * ``dependentRequired {k: [r...]}`` → ``anyOf [{properties: {k: false}}, {required: [k, r...]}]``
    * ``dependentSchemas {k: S}`` → ``anyOf [{properties: {k: false}}, {allOf: [{required: [k]}, S]}]``
    * ``not {required: [a, b]}`` → ``anyOf [{type: object, properties: {a: false}}, ...b...]``
    * ``not {propertyNames: false}`` → ``{type: object, minProperties: 1}``
    * ``not {type: T}`` → ``type: <the other types>`` (unless that needs "non-integer number")

    Any other ``not`` is left alone (the backend then refuses it).
    """
    if isinstance(schema, list):
        return [lower_dependencies(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    extra: list[Any] = []
    for key, value in schema.items():
        if key in MAP_KEYS and isinstance(value, dict) and key != "dependentSchemas":
            out[key] = {k: lower_dependencies(v) for k, v in value.items()}
        elif key in ("dependencies", "dependentRequired", "dependentSchemas") and isinstance(value, dict):
            for name, dep in value.items():
                absent = {"properties": {name: False}}
                if isinstance(dep, list):
                    extra.append({"anyOf": [absent, {"required": [name, *dep]}]})
                else:
                    extra.append({"anyOf": [absent, {"allOf": [{"required": [name]}, lower_dependencies(dep)]}]})
        elif key == "not":
            lowered = _lower_not(value)
            if lowered is None:
                out[key] = lower_dependencies(value)
            else:
                extra.append(lowered)
        elif key in ONE_KEYS or key in LIST_KEYS:
            out[key] = lower_dependencies(value)
        else:
            out[key] = value
    if extra:
        out["allOf"] = list(out.get("allOf", [])) + extra
    return out


def _lower_not(value: Any) -> Any:
    if value is True or value == {}:
        return False
    if value is False:
        return {}
    if not isinstance(value, dict):
        return None
    if set(value) == {"required"} and isinstance(value["required"], list) and value["required"]:
        names = value["required"]
        # required is vacuously true on non-objects, so its negation needs an object
        branches = [{"type": "object", "properties": {n: False}} for n in names]
        return branches[0] if len(branches) == 1 else {"anyOf": branches}
    if value == {"propertyNames": False}:  # "no property at all" negated: a non-empty object
        return {"type": "object", "minProperties": 1}
    if set(value) == {"type"}:
        t = value["type"]
        banned = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else None
        if banned is None or not banned <= set(_ALL_TYPES):
            return None
        if "number" in banned:
            banned.add("integer")
        elif "integer" in banned:
            return None  # "a number that is not an integer" has no type name
        return {"type": [x for x in _ALL_TYPES if x not in banned]}
    return None

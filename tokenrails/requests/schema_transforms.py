"""Schema rewrites that request options ask for (so an option is applied, never dropped)."""
from __future__ import annotations

from typing import Any

# Keywords whose value is one subschema / a list of subschemas / a name -> subschema map.
_ONE = ("additionalProperties", "items", "not", "if", "then", "else", "contains",
        "propertyNames", "additionalItems", "unevaluatedProperties", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _is_object_schema(schema: dict) -> bool:
    kind = schema.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        return True
    return "properties" in schema or "required" in schema or "patternProperties" in schema


def disable_additional_properties(schema: Any) -> Any:
    """Copy of ``schema`` with ``additionalProperties: false`` on every object schema that
    does not say otherwise (vLLM's ``disable_additional_properties``), at any depth."""
    if isinstance(schema, list):
        return [disable_additional_properties(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: disable_additional_properties(v) for k, v in out[key].items()}
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = disable_additional_properties(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [disable_additional_properties(s) for s in out[key]]
    if _is_object_schema(out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out

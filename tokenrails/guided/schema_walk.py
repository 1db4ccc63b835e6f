"""How a JSON-Schema document is walked and what its keywords mean, for every analysis.

Knows no backend: the limit checks, the strictness policy, the annotation filter and each
backend's own coverage declaration all read schemas through these helpers, so they agree on what
a subschema is and on which keyword values constrain nothing.
"""
from __future__ import annotations

import json
from typing import Any, Iterator
from urllib.parse import unquote

from .errors import InvalidGuideError

# Keywords whose value is free JSON that no backend interprets.
FREE_ANNOTATIONS: frozenset[str] = frozenset({
    "title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly",
    "contentEncoding", "contentMediaType",
})
# Keywords that never constrain an instance (allowed next to $ref / allOf): the free ones, and those
# that carry schemas or backend options.
ANNOTATIONS: frozenset[str] = FREE_ANNOTATIONS | {"$schema", "$id", "$anchor", "$defs", "definitions", "nullable",
                                                  "discriminator", "x-guidance"}

# Keys whose value is a map name -> subschema, a single subschema, or a list of subschemas.
MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
ONE_KEYS = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
            "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties",
            "contentSchema")
LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")


def iter_subschemas(schema: Any) -> Iterator[tuple[str, dict]]:
    """Yield ``(json_pointer, subschema)`` for every schema object in the document (iterative: a
    deep client schema never reaches Python's recursion limit here)."""
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, p = stack.pop()
        if not isinstance(node, dict):
            continue
        yield p, node
        for key, value in node.items():
            if (key in MAP_KEYS or key == "dependencies") and isinstance(value, dict):
                stack.extend((sub, f"{p}/{key}/{_escape(name)}") for name, sub in value.items())
            elif key in ONE_KEYS or key in LIST_KEYS:
                if isinstance(value, dict):
                    stack.append((value, f"{p}/{key}"))
                elif isinstance(value, list):
                    stack.extend((sub, f"{p}/{key}/{i}") for i, sub in enumerate(value))


def _escape(name: str) -> str:
    """A JSON-pointer segment (RFC 6901)."""
    return str(name).replace("~", "~0").replace("/", "~1")


def resolve_pointer(root: Any, ref: str) -> Any:
    """The subschema a local ``#...`` ref points at; ``InvalidGuideError`` when it does not exist."""
    if not ref.startswith("#"):
        raise InvalidGuideError(f"only local $ref ('#/...') is supported, got {ref[:100]!r}")
    node = root
    body = ref[1:]
    if body in ("", "/"):
        return root
    if not body.startswith("/"):
        raise InvalidGuideError(f"unsupported $ref anchor {ref[:100]!r}")
    for raw in body[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        part = unquote(part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidGuideError(f"$ref {ref[:100]!r} does not resolve")
    return node


def json_key(value: Any) -> str:
    """A canonical text of a JSON value (equal values, equal keys)."""
    return json.dumps(value, sort_keys=True)


def is_int(value: Any) -> bool:
    """An integer as JSON Schema reads one (``2.0`` included, booleans not)."""
    return isinstance(value, int) and not isinstance(value, bool) or (
        isinstance(value, float) and value.is_integer()
    )


def constrains_nothing(key: str, value: Any) -> bool:
    """Keyword values that constrain nothing, so a backend dropping them loses nothing.

    Shared by every backend's "would this be silently ignored" analysis. ``contains: {}`` is not
    here on purpose: it still demands a non-empty array."""
    if key == "uniqueItems":
        return value is False
    if key in ("minProperties", "minContains"):
        return value == 0
    if key in ("patternProperties", "dependentSchemas", "dependentRequired", "dependencies"):
        return value == {}
    if key in ("propertyNames", "contentSchema", "unevaluatedItems", "unevaluatedProperties"):
        return value is True or value == {}
    return False


def required_without_property(sub: dict) -> list:
    """Names in ``required`` with no ``properties`` entry (neither lowering enforces them)."""
    required = sub.get("required")
    if not isinstance(required, list) or not required:
        return []
    props = sub.get("properties") if isinstance(sub.get("properties"), dict) else {}
    return [name for name in required if name not in props]


def allof_with_parts_or_siblings(sub: dict) -> bool:
    """``allOf`` with several parts or next to constraining keywords: neither xgrammar nor outlines
    intersects them (xgrammar drops parts; outlines keeps only the siblings)."""
    all_of = sub.get("allOf")
    return isinstance(all_of, list) and (len(all_of) > 1 or constraining_siblings(sub, "allOf"))


def constraining_siblings(sub: dict, key: str) -> bool:
    """Whether ``sub`` has keywords besides ``key`` that constrain (not mere annotations)."""
    return any(k != key and k not in ANNOTATIONS for k in sub)

"""Static analysis of a JSON schema: which keywords a backend would silently ignore.

A backend must never pretend to enforce what it drops; ``auto`` uses these findings to route a
schema to a backend that enforces every keyword, or to fail with ``UnsupportedGuideError``.
"""
from __future__ import annotations

from typing import Any, Iterator

from .errors import GuideLimitError
from .limits import GuideLimits

# Keywords that constrain instances but that xgrammar 0.2 does not enforce (it accepts and drops
# them). Values: a short reason shown to the user.
XGRAMMAR_IGNORED: dict[str, str] = {
    "uniqueItems": "uniqueItems=true is not enforced",
    "not": "'not' is not enforced",
    "if": "if/then/else is not enforced",
    "dependentSchemas": "dependentSchemas is not enforced",
    "dependentRequired": "dependentRequired is not enforced",
    "dependencies": "dependencies is not enforced",
    "contains": "contains is not enforced",
    "propertyNames": "propertyNames is not enforced",
    "multipleOf": "multipleOf is not enforced",
    "minProperties": "minProperties is not enforced",
    "maxProperties": "maxProperties is not enforced",
    "patternProperties": "patternProperties is not enforced",
    "unevaluatedProperties": "unevaluatedProperties is not enforced",
    "unevaluatedItems": "unevaluatedItems is not enforced",
}


def iter_subschemas(schema: Any, path: str = "#", depth: int = 0) -> Iterator[tuple[str, dict, int]]:
    """Yield ``(json_pointer, subschema, depth)`` for every schema object in the document."""
    if not isinstance(schema, dict):
        return
    yield path, schema, depth
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            if isinstance(value, dict):
                for name, sub in value.items():
                    yield from iter_subschemas(sub, f"{path}/{key}/{name}", depth + 1)
        elif key in ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                     "propertyNames", "additionalItems", "unevaluatedItems", "unevaluatedProperties"):
            if isinstance(value, dict):
                yield from iter_subschemas(value, f"{path}/{key}", depth + 1)
            elif isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from iter_subschemas(sub, f"{path}/{key}/{i}", depth + 1)
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from iter_subschemas(sub, f"{path}/{key}/{i}", depth + 1)


def check_schema_limits(schema: Any, limits: GuideLimits) -> None:
    """Depth, enum size and anyOf fan-out, checked before any compiler sees the schema."""
    _check_json_depth(schema, limits.max_json_depth)
    for _, sub, _ in iter_subschemas(schema):
        enum = sub.get("enum")
        if isinstance(enum, list):
            limits.check("max_enum_values", len(enum))
        for key in ("anyOf", "oneOf"):
            if isinstance(sub.get(key), list):
                limits.check("max_any_of", len(sub[key]))


def _check_json_depth(value: Any, bound: int) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > bound:
            raise GuideLimitError(
                f"limit max_json_depth={bound} exceeded: schema nests deeper than {bound}",
                limit="max_json_depth", value=depth,
            )
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def xgrammar_unenforced(schema: Any) -> list[str]:
    """Human-readable findings (``"#/path: reason"``) for keywords xgrammar would drop."""
    findings: list[str] = []
    for path, sub, _ in iter_subschemas(schema):
        for key, reason in XGRAMMAR_IGNORED.items():
            if key in sub and not _trivial(key, sub[key]):
                findings.append(f"{path}: {reason}")
        if "pattern" in sub and ("minLength" in sub or "maxLength" in sub):
            findings.append(f"{path}: a string with both pattern and min/maxLength (length bound dropped)")
        if "pattern" in sub and "format" in sub:
            findings.append(f"{path}: a string with both pattern and format")
    return findings


def _trivial(key: str, value: Any) -> bool:
    """Keyword values that constrain nothing."""
    if key == "uniqueItems":
        return value is False
    if key in ("minProperties",):
        return value == 0
    if key in ("patternProperties", "dependentSchemas", "dependentRequired", "dependencies"):
        return value == {}
    return False

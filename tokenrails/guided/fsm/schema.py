"""JSON Schema → regex the way outlines does it, refusing keywords outlines would silently drop.

``outlines_core.json_schema.build_regex_from_schema`` ignores several constraining keywords
(numeric bounds, ``not``, ``uniqueItems``...). Enforcing a schema with them dropped would let
invalid instances through, so the fsm backend raises ``UnsupportedGuideError`` naming them
(``auto`` then uses xgrammar/llguidance) unless the spec opts in with the option
``fsm_ignore_unenforced=True`` (outlines' own lenient behaviour, for the compat layer).
``tests/fsm/test_schema.py`` proves each listed keyword is really dropped by outlines-core.

Other specs are lowered from ``policy_schema(spec)`` (keyword-implied types written out), and
places where outlines-core lowers an enforced keyword to a different language than the policy
(``_lowered_differently``) or a ``strict=False`` spec whose objects are not already closed are
refused too, so ``auto`` never gets a silently different language from this backend.
Numeric bounds outlines drops are written as digit-range regexes where that is exact
(``numeric_bounds.py``).
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidGuideError, UnsupportedGuideError
from ..limits import DEFAULT_LIMITS, GuideLimits
from ..schema_walk import (allof_with_parts_or_siblings, constraining_siblings, constrains_nothing,
                           iter_subschemas, required_without_property)
from ..schema_semantics import already_closed, is_strict, policy_payload
from ..spec import GuideSpec
from .lowering import IN_PROCESS_ESTIMATE, lower_in_worker, lowered_size_estimate
from .json_string_safety import unsafe_in_json_string
from .numeric_bounds import restore_bounds, rewrite_bounds

# keyword -> reason; each is silently ignored by outlines-core 0.2.14's regex builder.
OUTLINES_IGNORED: dict[str, str] = {
    "minimum": "minimum is not enforced",
    "maximum": "maximum is not enforced",
    "exclusiveMinimum": "exclusiveMinimum is not enforced",
    "exclusiveMaximum": "exclusiveMaximum is not enforced",
    "multipleOf": "multipleOf is not enforced",
    "uniqueItems": "uniqueItems=true is not enforced",
    "contains": "contains is not enforced",
    "minContains": "minContains is not enforced",
    "maxContains": "maxContains is not enforced",
    "minProperties": "minProperties is not enforced",
    "maxProperties": "maxProperties is not enforced",
    "patternProperties": "patternProperties is not enforced",
    "propertyNames": "propertyNames is not enforced",
    "not": "'not' is not enforced",
    "if": "if/then/else is not enforced",
    "dependentRequired": "dependentRequired is not enforced",
    "dependentSchemas": "dependentSchemas is not enforced",
    "dependencies": "dependencies is not enforced",
    "unevaluatedProperties": "unevaluatedProperties is not enforced",
    "unevaluatedItems": "unevaluatedItems is not enforced",
}

# formats outlines-core 0.2.14 lowers to a different language than RFC 3339 (JSON Schema's
# definition): the zone is optional ("Z" or nothing) where RFC 3339 requires "Z" or an offset
_LAX_FORMATS = ("date-time", "time")

DEFAULT_COMPACT_WHITESPACE = ""  # any_whitespace=False: no whitespace between JSON tokens


def outlines_unenforced(schema: Any) -> list[str]:
    """Findings (``"#/path: reason"``) for keywords outlines-core would drop from ``schema``."""
    findings = []
    for path, sub in iter_subschemas(schema):
        for key, reason in OUTLINES_IGNORED.items():
            if key in sub and not constrains_nothing(key, sub[key]):
                findings.append(f"{path}: {reason}")
        one_of = sub.get("oneOf")
        if isinstance(one_of, list) and len(one_of) > 1:
            findings.append(f"{path}: oneOf is lowered as anyOf (exclusivity is not enforced)")
        findings.extend(_lowered_differently(path, sub))
        missing = required_without_property(sub)
        if missing:
            findings.append(f"{path}: required names without a properties entry are not enforced: {missing[:3]}")
        pattern = sub.get("pattern")
        if isinstance(pattern, str):
            if "minLength" in sub or "maxLength" in sub:
                findings.append(f"{path}: pattern together with min/maxLength (outlines drops the pattern)")
            if "format" in sub:
                findings.append(f"{path}: pattern together with format (outlines drops the format)")
            if unsafe_in_json_string(pattern):
                findings.append(
                    f"{path}: pattern {pattern[:40]!r} can emit a raw quote, backslash or control "
                    "character inside a JSON string (outlines inserts patterns unescaped)"
                )
    return sorted(set(findings))


def _lowered_differently(path: str, sub: dict) -> list[str]:
    """Where outlines-core 0.2.14 lowers an enforced keyword to a different language than the
    policy (measured; ``tests/fsm/test_schema.py``): each would refuse valid output silently."""
    out = []
    extra = sub.get("additionalProperties", False)
    if isinstance(sub.get("properties"), dict) and sub["properties"] and extra is not False:
        out.append(f"{path}: additionalProperties next to properties is ignored (outlines closes the object)")
    prefix = sub.get("prefixItems")
    if isinstance(prefix, list) and prefix:
        min_items = sub.get("minItems", 0)
        if sub.get("items", False) is not False or not (isinstance(min_items, int) and min_items >= len(prefix)):
            out.append(f"{path}: prefixItems is lowered as a fixed-length tuple (shorter arrays and "
                       "items beyond it are refused)")
    if "$ref" in sub and constraining_siblings(sub, "$ref"):  # outlines-core lowers one of the two
        out.append(f"{path}: $ref next to constraining keywords (outlines keeps one side: properties or enum "
                   "over the $ref, the $ref over type and the rest)")
    if allof_with_parts_or_siblings(sub):
        out.append(f"{path}: allOf with several parts or sibling keywords (outlines keeps only the siblings "
                   "or refuses valid output)")
    fmt = sub.get("format")
    if fmt in _LAX_FORMATS and "pattern" not in sub:
        out.append(f"{path}: format {fmt} is lowered with an optional 'Z' and no numeric offsets "
                   "(outlines-core's regex): times without a zone would be accepted, '+02:00' refused")
    t = sub.get("type")
    if isinstance(t, list) and len(t) > 1 and (
        "object" in t and any(k in sub for k in ("properties", "additionalProperties"))
        or "array" in t and "object" in t
    ):
        out.append(f"{path}: a type list with object keywords keeps only the object branch")
    return out


def whitespace_pattern(spec: GuideSpec) -> str | None:
    """outlines' whitespace regex for this spec: explicit pattern, compact, or outlines' default."""
    pattern = spec.option("whitespace_pattern")
    if pattern is not None:
        return str(pattern)
    if spec.option("any_whitespace", True) is False:
        return DEFAULT_COMPACT_WHITESPACE
    return None  # outlines-core's default ``[ ]?``


def schema_to_regex(spec: GuideSpec, limits: GuideLimits = DEFAULT_LIMITS) -> str:
    """Lower a json_schema spec with outlines-core; map its errors to typed GuideErrors."""
    try:
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError as exc:  # pragma: no cover - outlines-core is a core dependency
        raise UnsupportedGuideError("outlines-core is not installed", feature="json_schema", backend="fsm") from exc
    lenient = bool(spec.option("fsm_ignore_unenforced", False))
    # outlines' own language for the compat layer; tokenrails' policy (implied types explicit)
    # for everyone else.
    text = spec.payload if lenient else policy_payload(spec)
    schema = json.loads(text)
    if not is_strict(spec) and not already_closed(schema):
        raise UnsupportedGuideError(
            "the fsm backend (outlines-style JSON lowering) always closes objects and tuples; "
            "strict=False needs a schema whose objects say additionalProperties themselves",
            feature="strict=False", backend="fsm",
        )
    bounds: dict[str, str] = {}
    if not lenient:  # bounded numeric leaves written as digit ranges (numeric_bounds.py)
        schema, bounds = rewrite_bounds(schema)
        if bounds:
            text = json.dumps(schema)
        findings = outlines_unenforced(schema)
        if findings:
            raise UnsupportedGuideError(
                "the fsm backend (outlines-style JSON lowering) cannot enforce: " + "; ".join(findings[:5]),
                feature=findings[0], backend="fsm",
            )
    try:
        whitespace = whitespace_pattern(spec)  # repeated at every separator: scales the estimate
        if lowered_size_estimate(schema) * (1 + len(whitespace or "") / 8) <= IN_PROCESS_ESTIMATE:
            regex = build_regex_from_schema(text, whitespace)
        else:  # may grow geometrically: in a worker that an abort or a deadline cannot take us down with
            regex = _lower_isolated(text, whitespace, limits)
        regex = restore_bounds(regex, bounds)
        limits.check("max_lowered_regex_bytes", len(regex))
        return regex
    except (ValueError, TypeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "not supported" in msg.lower() or "unsupported" in msg.lower():
            raise UnsupportedGuideError(f"outlines-core cannot lower this schema: {msg}",
                                        feature="json_schema", backend="fsm") from exc
        raise InvalidGuideError(f"invalid JSON schema for the fsm backend: {msg}") from exc


def _lower_isolated(text: str, whitespace: str | None, limits: GuideLimits) -> str:
    answer = lower_in_worker(text, whitespace, limits)
    if "regex" in answer:
        return answer["regex"]
    if "too_large" in answer:
        limits.check("max_lowered_regex_bytes", answer["too_large"])
    raise ValueError(answer.get("message") or answer.get("error") or "lowering failed")

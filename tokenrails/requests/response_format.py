"""OpenAI / LMDeploy ``response_format`` objects → a raw constraint ``(kind, value)``.

Raw constraints are turned into a ``GuideSpec`` by ``requests.build_spec`` after every request
option (whitespace, additionalProperties...) is known, so options are applied, never dropped.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..guided.errors import InvalidGuideError

RawConstraint = tuple[str, Any]  # (kind, value); kind as in GuideSpec.kind

# Keys each response_format type may carry; anything else would be silently ignored, so it raises.
_ALLOWED_KEYS: dict[str, frozenset[str]] = {
    "text": frozenset({"type"}),
    "json_object": frozenset({"type", "schema"}),
    "json_schema": frozenset({"type", "json_schema"}),
    "regex_schema": frozenset({"type", "regex_schema"}),
    "regex": frozenset({"type", "regex", "pattern"}),
    "choice": frozenset({"type", "choice", "choices"}),
    "grammar": frozenset({"type", "grammar"}),
    "ebnf": frozenset({"type", "ebnf"}),
    "structural_tag": frozenset({"type", "structures", "triggers", "format"}),
}
RESPONSE_FORMAT_TYPES = frozenset(_ALLOWED_KEYS)
# Not part of the constraint: the engine adapters' per-request reasoning setting
# (tokenrails/engine_patch/reasoning_settings.py reads and validates it); accepted and set aside here.
REASONING_KEY = "tokenrails_reasoning"
# Likewise the request's budget setting ("close": complete the output within max_tokens;
# tokenrails/guided/budget.py): read by the engine adapters, set aside here.
BUDGET_KEY = "tokenrails_budget"
_JSON_SCHEMA_BODY_KEYS = frozenset({"name", "description", "schema", "json_schema", "strict"})


def is_pydantic_model_class(obj: Any) -> bool:
    return isinstance(obj, type) and callable(getattr(obj, "model_json_schema", None))


def load_json_like(obj: Any, what: str) -> Any:
    """JSON text → its value and pydantic instances → dicts (by alias); anything else unchanged."""
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # bad UTF-8, deep nesting
            raise InvalidGuideError(f"{what} is not valid JSON: {exc}") from exc
    if hasattr(obj, "model_dump") and not isinstance(obj, type):
        obj = obj.model_dump(exclude_none=True, by_alias=True)
    return obj


def parse_response_format(rf: Any) -> RawConstraint | None:
    """``None`` for ``{"type": "text"}``; raises ``InvalidGuideError`` for anything malformed."""
    if is_pydantic_model_class(rf):  # openai SDK's ``parse(response_format=Model)``
        return ("json_schema", rf.model_json_schema())
    rf = load_json_like(rf, "response_format")
    if not isinstance(rf, Mapping):
        raise InvalidGuideError(f"response_format must be an object, got {type(rf).__name__}")
    if REASONING_KEY in rf or BUDGET_KEY in rf:
        rf = {k: v for k, v in rf.items() if k not in (REASONING_KEY, BUDGET_KEY)}
    kind = rf.get("type")
    if kind is None:
        raise InvalidGuideError("response_format needs a 'type'")
    if not isinstance(kind, str) or kind not in _ALLOWED_KEYS:
        raise InvalidGuideError(
            f"unknown response_format type {kind!r}; expected one of {sorted(RESPONSE_FORMAT_TYPES)}"
        )
    extra = {k for k, v in rf.items() if v is not None} - _ALLOWED_KEYS[kind]
    if extra:
        raise InvalidGuideError(
            f"response_format type {kind!r} does not take {sorted(extra)} (would be ignored)"
        )
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:  # Together/Fireworks style: json_object + schema
            return ("json_schema", rf["schema"])
        return ("json_object", None)
    if kind == "json_schema":
        return ("json_schema", _json_schema_body(rf.get("json_schema")))
    if kind in ("regex_schema", "regex"):
        pattern = rf.get("regex_schema", rf.get("regex", rf.get("pattern")))
        if pattern is None:
            raise InvalidGuideError(f"response_format type {kind!r} needs a pattern")
        return ("regex", pattern)
    if kind == "choice":
        return ("choice", rf.get("choice", rf.get("choices")))
    if kind in ("grammar", "ebnf"):
        return ("grammar", rf.get(kind))
    return ("structural_tag", canonical_structural_tag(rf))


def _json_schema_body(body: Any) -> Any:
    """OpenAI ``{"name", "schema", "strict"}``; LMDeploy's un-aliased ``json_schema`` key; or a
    bare schema (LMDeploy accepts one)."""
    if body is None:
        raise InvalidGuideError("response_format type 'json_schema' needs a 'json_schema' field")
    if is_pydantic_model_class(body):
        return body.model_json_schema()
    if isinstance(body, (str, bytes)):
        return body
    if not isinstance(body, Mapping):
        raise InvalidGuideError("response_format.json_schema must be an object")
    wrapper_keys = {"name", "schema", "strict", "json_schema", "description"} & set(body)
    if "schema" in body or "json_schema" in body or {"name", "strict"} & set(body):
        extra = set(body) - _JSON_SCHEMA_BODY_KEYS
        if extra:
            raise InvalidGuideError(f"response_format.json_schema has unknown keys {sorted(extra)}")
        if "name" in body and not isinstance(body["name"], str):
            raise InvalidGuideError("response_format.json_schema.name must be a string")
        if body.get("strict") is not None and not isinstance(body["strict"], bool):
            raise InvalidGuideError("response_format.json_schema.strict must be a boolean")
        schema = body.get("schema", body.get("json_schema"))
        if schema is None:
            raise InvalidGuideError(
                f"response_format.json_schema has no 'schema' (keys: {sorted(wrapper_keys)})"
            )
        return schema
    return dict(body)


def canonical_structural_tag(tag: Any) -> dict:
    """One canonical dict for both structural-tag shapes, whatever surface carried it.

    Legacy: ``{"structures": [...], "triggers": [...]}``; xgrammar ≥ 0.1.25:
    ``{"type": "structural_tag", "format": {...}}``.
    """
    tag = load_json_like(tag, "structural tag")
    if not isinstance(tag, Mapping):
        raise InvalidGuideError("structural tag must be an object or JSON text")
    if tag.get("type", "structural_tag") != "structural_tag":
        raise InvalidGuideError(f"structural tag has type {tag.get('type')!r}")
    body = {k: v for k, v in tag.items() if k != "type"}
    if "format" in body:
        if set(body) != {"format"}:
            raise InvalidGuideError(f"structural tag with 'format' takes no {sorted(set(body) - {'format'})}")
        return {"type": "structural_tag", "format": body["format"]}
    if set(body) != {"structures", "triggers"}:
        raise InvalidGuideError(
            "structural tag needs exactly 'structures' and 'triggers', or 'format'; "
            f"got {sorted(body)}"
        )
    if not isinstance(body["structures"], list) or not body["structures"]:
        raise InvalidGuideError("structural tag 'structures' must be a non-empty list")
    if not isinstance(body["triggers"], list) or not body["triggers"]:
        raise InvalidGuideError("structural tag 'triggers' must be a non-empty list")
    return body

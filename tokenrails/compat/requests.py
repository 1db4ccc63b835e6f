"""``normalize_request``: every accepted request shape → one ``GuideSpec`` (or None).

A recognized field is never silently dropped: conflicting or unknown constraint fields raise
``InvalidGuideError``.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..guided.errors import InvalidGuideError
from ..guided.spec import GuideSpec


def normalize_request(obj: Any) -> GuideSpec | None:
    """Map a request object (dict, JSON text, pydantic model, ``GuideSpec``) to a ``GuideSpec``."""
    if obj is None:
        return None
    if isinstance(obj, GuideSpec):
        return obj
    if isinstance(obj, (str, bytes)):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise InvalidGuideError(f"request is not valid JSON: {exc}") from exc
    if hasattr(obj, "model_dump") and not isinstance(obj, type):
        obj = obj.model_dump(exclude_none=True)
    if not isinstance(obj, Mapping):
        raise InvalidGuideError(f"unsupported request type {type(obj).__name__}")
    return _from_response_format(dict(obj))


def _from_response_format(rf: dict) -> GuideSpec | None:
    kind = rf.get("type")
    if kind is None:
        raise InvalidGuideError("response_format needs a 'type'")
    if kind == "text":
        return None
    if kind == "json_object":
        return GuideSpec.json_object()
    if kind == "json_schema":
        body = rf.get("json_schema")
        if body is None:
            raise InvalidGuideError("response_format type 'json_schema' needs a 'json_schema' field")
        if isinstance(body, Mapping) and "schema" in body:
            schema = body["schema"]
        elif isinstance(body, Mapping) and ("name" in body or "strict" in body):
            raise InvalidGuideError("response_format.json_schema has no 'schema'")
        else:
            schema = body
        return GuideSpec.json_schema(schema)
    if kind in ("regex_schema", "regex"):
        pattern = rf.get("regex_schema", rf.get("regex", rf.get("pattern")))
        if pattern is None:
            raise InvalidGuideError(f"response_format type {kind!r} needs a pattern")
        return GuideSpec.regex(pattern)
    if kind == "choice":
        return GuideSpec.choice(rf.get("choice", rf.get("choices")) or [])
    if kind in ("grammar", "ebnf"):
        return GuideSpec.grammar(rf.get("grammar", rf.get("ebnf")) or "")
    if kind == "structural_tag":
        tag = {k: v for k, v in rf.items() if k != "type"} if "format" not in rf else rf
        if "structures" in rf or "format" in rf:
            return GuideSpec.structural_tag(rf if "format" in rf else tag)
        raise InvalidGuideError("structural_tag needs 'structures' and 'triggers', or 'format'")
    raise InvalidGuideError(f"unknown response_format type {kind!r}")

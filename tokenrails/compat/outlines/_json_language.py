"""outlines' JSON language: schema text, the spec that keeps outlines' lowering, its regex, and a
warning naming the keywords outlines ignores."""
from __future__ import annotations

import json
import warnings
from typing import Any

from ... import GuideSpec, InvalidGuideError


def schema_to_str(json_schema: Any) -> str:
    """outlines' ``convert_json_schema_to_str``: dict / JSON text / pydantic model → JSON text
    (its parameter keeps outlines' name: the cookbook calls it with ``json_schema=``)."""
    schema = json_schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, str):
        return schema
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        return json.dumps(schema.model_json_schema())
    raise InvalidGuideError(
        f"cannot parse schema {schema!r}: expected a dict, a JSON string or a pydantic model"
    )


class UnenforcedSchemaWarning(UserWarning):
    """The schema uses keywords outlines ignored; the shim keeps outlines' language, so they
    are not enforced either (use ``GuideSpec.json_schema`` + ``compile_guide`` to enforce them)."""


def json_spec(schema: Any, whitespace_pattern: str | None = None) -> GuideSpec:
    """outlines' JSON language: ``build_regex_from_schema(schema, whitespace_pattern)``, as a
    ``json_schema`` spec that asks the fsm backend for outlines' lenient lowering
    (``fsm_ignore_unenforced``). Keywords outlines ignored raise an ``UnenforcedSchemaWarning``
    naming them instead of passing silently.
    """
    text = schema_to_str(schema)
    base = GuideSpec.json_schema(text, whitespace_pattern=whitespace_pattern)
    _warn_unenforced(base.schema)
    options = dict(base.options, fsm_ignore_unenforced=True)
    return GuideSpec("json_schema", base.payload, tuple(sorted(options.items())))


def outlines_regex(spec: GuideSpec) -> str:
    """The regex outlines would have used for a spec made by ``json_spec`` (or a regex spec)."""
    from outlines_core.json_schema import build_regex_from_schema

    if spec.kind == "regex":
        return spec.pattern
    if spec.kind == "json_schema":
        return build_regex_from_schema(spec.payload, spec.option("whitespace_pattern"))
    raise InvalidGuideError(f"{spec.kind} specs have no outlines regex")


def _warn_unenforced(schema: dict) -> None:
    from ... import outlines_unenforced

    findings = outlines_unenforced(schema)
    if findings:
        warnings.warn(
            "outlines ignores these schema keywords and so does the outlines shim: "
            + "; ".join(findings[:5]),
            UnenforcedSchemaWarning,
            stacklevel=3,
        )

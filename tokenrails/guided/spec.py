"""``GuideSpec``: the one normalized, immutable form of every structured-output request.

Every surface (OpenAI ``response_format``, vLLM ``guided_*``, outlines, LMDeploy) is turned into a
``GuideSpec`` first; backends, caches and matchers only ever see this type. Equal requests give
equal ``key``s, so the key is safe to use for compile caches and per-sequence matcher identity.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Mapping

from .errors import InvalidGuideError

GuideKind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")


# Maps whose key order is part of the meaning: generated objects list properties in this order.
_ORDERED_MAPS = frozenset({"properties"})


def _canonical(value: Any, ordered: bool = False) -> Any:
    """Sort object keys, except inside ``properties`` maps, whose order decides output order."""
    if isinstance(value, Mapping):
        items = list(value.items()) if ordered else sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): _canonical(v, str(k) in _ORDERED_MAPS and not ordered) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _canonical_json(value: Any) -> str:
    try:
        text = json.dumps(_canonical(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # lone surrogates ("\ud800") cannot be hashed, compiled or sent on
        return text
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidGuideError(f"value is not JSON-serializable: {exc}") from exc


def _schema_to_dict(schema: Any) -> dict:
    """Accept a dict, a JSON string, or a pydantic model class (or instance's class)."""
    if isinstance(schema, Mapping):
        return dict(schema)
    if isinstance(schema, (str, bytes, bytearray)):
        try:
            value = json.loads(schema)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # deep nesting
            raise InvalidGuideError(f"JSON schema is not valid JSON: {exc}") from exc
        if isinstance(value, bool):
            return {} if value else {"not": {}}
        if not isinstance(value, dict):
            raise InvalidGuideError(f"JSON schema must be an object, got {type(value).__name__}")
        return value
    if isinstance(schema, bool):
        return {} if schema else {"not": {}}
    model_json_schema = getattr(schema, "model_json_schema", None)
    if callable(model_json_schema):  # pydantic v2 model class
        return model_json_schema()
    legacy = getattr(schema, "schema", None)
    if isinstance(schema, type) and callable(legacy):  # pydantic v1
        return legacy()
    raise InvalidGuideError(
        f"JSON schema must be a dict, a JSON string or a pydantic model, got {type(schema).__name__}"
    )


@dataclass(frozen=True)
class GuideSpec:
    """A normalized constraint. ``payload`` is canonical text; ``options`` are sorted pairs."""

    kind: GuideKind
    payload: str
    options: tuple[tuple[str, Any], ...] = ()
    key: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidGuideError(f"unknown guide kind {self.kind!r}; expected one of {KINDS}")
        digest = hashlib.sha256(
            _canonical_json([self.kind, self.payload, list(map(list, self.options))]).encode()
        ).hexdigest()[:32]
        object.__setattr__(self, "key", f"{self.kind}:{digest}")

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def json_schema(
        cls, schema: Any, *, any_whitespace: bool = True, whitespace_pattern: str | None = None
    ) -> "GuideSpec":
        """``schema``: dict, JSON text or pydantic model class."""
        opts: dict[str, Any] = {"any_whitespace": bool(any_whitespace)}
        if whitespace_pattern is not None:
            opts["whitespace_pattern"] = str(whitespace_pattern)
        return cls("json_schema", _canonical_json(_schema_to_dict(schema)), _sorted(opts))

    @classmethod
    def json_object(cls, *, any_whitespace: bool = True) -> "GuideSpec":
        return cls("json_object", "", _sorted({"any_whitespace": bool(any_whitespace)}))

    @classmethod
    def regex(cls, pattern: str) -> "GuideSpec":
        if not isinstance(pattern, str):
            raise InvalidGuideError(f"regex must be a string, got {type(pattern).__name__}")
        if pattern == "":
            raise InvalidGuideError("regex is empty")
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Iterable[Any]) -> "GuideSpec":
        if isinstance(options, (str, bytes)) or not isinstance(options, Iterable):
            raise InvalidGuideError("choice needs a list of strings")
        values = [str(o) if not isinstance(o, str) else o for o in options]
        if not values:
            raise InvalidGuideError("choice list is empty")
        # Order is kept: it is visible to users (outlines' regex alternation order).
        return cls("choice", _canonical_json(values))

    @classmethod
    def grammar(cls, ebnf: str) -> "GuideSpec":
        if not isinstance(ebnf, str) or not ebnf.strip():
            raise InvalidGuideError("grammar must be a non-empty EBNF string")
        return cls("grammar", ebnf)

    @classmethod
    def structural_tag(cls, tag: Any) -> "GuideSpec":
        if isinstance(tag, (str, bytes)):
            try:
                tag = json.loads(tag)
            except json.JSONDecodeError as exc:
                raise InvalidGuideError(f"structural tag is not valid JSON: {exc}") from exc
        if hasattr(tag, "model_dump"):
            tag = tag.model_dump()
        if not isinstance(tag, Mapping):
            raise InvalidGuideError("structural tag must be a dict or JSON text")
        return cls("structural_tag", _canonical_json(dict(tag)))

    @classmethod
    def from_request(cls, obj: Any) -> "GuideSpec | None":
        """Accept any supported request shape (OpenAI/LMDeploy ``response_format``, vLLM fields...).

        Returns ``None`` for an unconstrained request (``{"type": "text"}`` or ``None``).
        """
        from ..compat.requests import normalize_request

        return normalize_request(obj)

    # ---- accessors ----------------------------------------------------------------------
    def option(self, name: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == name:
                return v
        return default

    @property
    def schema(self) -> dict:
        if self.kind != "json_schema":
            raise AttributeError(f"{self.kind} spec has no schema")
        return json.loads(self.payload)

    @property
    def pattern(self) -> str:
        if self.kind != "regex":
            raise AttributeError(f"{self.kind} spec has no pattern")
        return self.payload

    @property
    def choices(self) -> list[str]:
        if self.kind != "choice":
            raise AttributeError(f"{self.kind} spec has no choices")
        return json.loads(self.payload)

    @property
    def ebnf(self) -> str:
        if self.kind != "grammar":
            raise AttributeError(f"{self.kind} spec has no grammar")
        return self.payload

    @property
    def tag(self) -> dict:
        if self.kind != "structural_tag":
            raise AttributeError(f"{self.kind} spec has no structural tag")
        return json.loads(self.payload)

    def __repr__(self) -> str:
        body = self.payload if len(self.payload) <= 60 else self.payload[:57] + "..."
        return f"GuideSpec({self.kind}, {body!r}, {dict(self.options)})"


def _sorted(opts: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(opts.items()))

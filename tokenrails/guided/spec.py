"""``GuideSpec``: the one normalized, immutable form of every structured-output request.

Every surface (OpenAI ``response_format``, vLLM ``guided_*``, outlines, LMDeploy) is turned into a
``GuideSpec`` first; backends, caches and matchers only ever see this type. Equal requests give
equal ``key``s, so the key is safe to use for compile caches and per-sequence matcher identity.
Reading request objects into a spec is ``tokenrails.requests`` (``spec_from_request``), a layer
above this module: the core never parses a client's request shape itself.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Literal, Mapping

from .errors import InvalidGuideError

GuideKind = Literal["json_schema", "json_object", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[str, ...] = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")


# Maps whose key order is part of the meaning: generated objects list properties in this order.
_ORDERED_MAPS = frozenset({"properties"})


# Exact types ``_canonical`` returns unchanged; checked by identity before the (slow) ABC check.
_SCALARS = frozenset({str, int, float, bool, type(None)})
# ``json.dumps(x, separators=(",", ":"), ensure_ascii=False, allow_nan=False)`` without building
# an encoder per call (the encoder keeps no state between calls, so sharing it is thread-safe).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# UTF-8 bytes that JSON escapes inside a string (ensure_ascii=False): controls, '\\' and '"'.
_JSON_ESCAPED = bytes(range(0x20)) + b'\\"'


def _canonical(value: Any, ordered: bool = False) -> Any:
    """Sort object keys, except inside ``properties`` maps, whose order decides output order."""
    t = type(value)
    if t in _SCALARS:
        return value
    if t is dict or (t is not list and t is not tuple and isinstance(value, Mapping)):
        items = list(value.items()) if ordered else sorted(value.items(), key=lambda kv: str(kv[0]))
        return {str(k): _canonical(v, str(k) in _ORDERED_MAPS and not ordered) for k, v in items}
    if t is list or t is tuple or isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _canonical_json(value: Any) -> str:
    try:
        text = _ENCODER.encode(_canonical(value))
        if not text.isascii():
            text.encode("utf-8")  # lone surrogates ("\ud800") cannot be hashed, compiled or sent on
        return text
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidGuideError(f"value is not JSON-serializable: {exc}") from exc


def _plain_str(value: Any) -> bool:
    """True for a ``str`` that JSON-encodes (no lone surrogate)."""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _simple_options(options: Any) -> bool:
    """True when ``options`` are (str, scalar) pairs that JSON-encode without error.

    Such options (every constructor's) need no canonical JSON at construction: nothing in them
    can fail to serialize, so the key can be computed later, when a cache first asks for it.
    """
    if type(options) is not tuple:
        return False
    for pair in options:
        if type(pair) is not tuple or len(pair) != 2 or not _plain_str(pair[0]):
            return False
        t = type(pair[1])
        if not (t is bool or t is int or pair[1] is None or _plain_str(pair[1])):
            return False
    return True


def _fast_choice_payload(options: list | tuple) -> str | None:
    """``_canonical_json(list(options))`` for a non-empty list of plain strings that JSON writes
    verbatim (no quote, backslash or control character, no lone surrogate); None otherwise: one
    join and one byte scan instead of encoding item by item."""
    try:
        joined = '","'.join(options)  # TypeError unless every item is a str
        raw = joined.encode("utf-8")  # UnicodeEncodeError on a lone surrogate
    except (TypeError, UnicodeEncodeError):
        return None
    # every byte JSON would escape is deleted; only the separators' quotes may be among them
    if len(raw) - len(raw.translate(None, _JSON_ESCAPED)) != 2 * (len(options) - 1):
        return None
    return '["' + joined + '"]'


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
    """A normalized constraint. ``payload`` is canonical text; ``options`` are sorted pairs.

    ``key`` is ``"<kind>:"`` + the first 32 hex digits of the SHA-256 of the UTF-8 canonical JSON
    of ``[kind, payload, [list(pair) for pair in options]]``. It is computed on first access
    (only caches read it); anything that would make it fail is still rejected at construction.
    """

    kind: GuideKind
    payload: str
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidGuideError(f"unknown guide kind {self.kind!r}; expected one of {KINDS}")
        if not (_plain_str(self.payload) and _simple_options(self.options)):
            # the general case: serialize now (raising what the key would raise) and keep the text
            text = _canonical_json([self.kind, self.payload, list(map(list, self.options))])
            object.__setattr__(self, "_key_text", text)

    @cached_property
    def key(self) -> str:
        """Cache key: equal for equal specs (see the class docstring for the recipe)."""
        text = self.__dict__.get("_key_text")
        if text is None:  # checked plain strings and scalars: canonical as they are, and encodable
            text = _ENCODER.encode([self.kind, self.payload, [list(p) for p in self.options]])
        return f"{self.kind}:{hashlib.sha256(text.encode()).hexdigest()[:32]}"

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def json_schema(
        cls, schema: Any, *, any_whitespace: bool = True, whitespace_pattern: str | None = None,
        strict: bool = True,
    ) -> "GuideSpec":
        """``schema``: dict, JSON text or pydantic model class.

        ``strict`` (default): objects that list members admit only those, tuples no extra items,
        on every backend (docs/semantics.md §5). ``strict=False``: JSON Schema's rule instead
        (unlisted properties allowed unless ``additionalProperties: false``). Only ``False`` is
        recorded in ``options``, so strict specs keep the keys they always had.
        """
        opts: dict[str, Any] = {"any_whitespace": bool(any_whitespace)}
        if whitespace_pattern is not None:
            opts["whitespace_pattern"] = str(whitespace_pattern)
        if strict is not None and not strict:  # None: unspecified, the default
            opts["strict"] = False
        from .schema_annotations import drop_container_annotations

        return cls("json_schema", _canonical_json(drop_container_annotations(_schema_to_dict(schema))), _sorted(opts))

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
        # Order is kept: it is visible to users (outlines' regex alternation order).
        if (type(options) is list or type(options) is tuple) and options:
            payload = _fast_choice_payload(options)
            if payload is not None:
                spec = cls("choice", payload)
                # the strings, for ``choices``: the payload minus its brackets, split at '","'
                object.__setattr__(spec, "_choices_joined", payload[2:-2])
                return spec
        if isinstance(options, (str, bytes)) or not isinstance(options, Iterable):
            raise InvalidGuideError("choice needs a list of strings")
        values = [str(o) if not isinstance(o, str) else o for o in options]
        if not values:
            raise InvalidGuideError("choice list is empty")
        return cls("choice", _canonical_json(values))

    @classmethod
    def grammar(cls, ebnf: str, *, dialect: str = "ebnf") -> "GuideSpec":
        """``dialect``: "ebnf" (xgrammar's GBNF-like EBNF, every backend) or "lark" (outlines'
        and llguidance's Lark dialect: llguidance only)."""
        if not isinstance(ebnf, str) or not ebnf.strip():
            raise InvalidGuideError("grammar must be a non-empty EBNF string")
        if dialect not in ("ebnf", "lark"):
            raise InvalidGuideError(f"unknown grammar dialect {dialect!r} (ebnf or lark)")
        return cls("grammar", ebnf, (("dialect", "lark"),) if dialect == "lark" else ())

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
        _check_legacy_tag(tag)
        from .schema_annotations import drop_tag_annotations

        return cls("structural_tag", _canonical_json(drop_tag_annotations(dict(tag))))

    def with_routing(self, backend: str | None, *, fallback: bool = True) -> "GuideSpec":
        """This spec, compiled by ``backend`` first (a registry name; None: auto's choice) and,
        with ``fallback=False``, by that backend only (``compile_guide`` reads both options).

        Routing is part of the key: a guide one backend compiled is not another backend's."""
        opts = {k: v for k, v in self.options if k not in ("backend", "fallback")}
        if backend is not None:
            if not isinstance(backend, str) or not backend:
                raise InvalidGuideError(f"backend must be a non-empty string, got {backend!r}")
            opts["backend"] = backend
        if not fallback:
            opts["fallback"] = False
        options = _sorted(opts)
        if options == self.options:
            return self
        return GuideSpec(self.kind, self.payload, options)

    # ---- accessors ----------------------------------------------------------------------
    def option(self, name: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == name:
                return v
        return default

    def _payload_of(self, kind: str, what: str) -> str:
        """The payload of a ``kind`` spec; another kind has no such accessor (``AttributeError``)."""
        if self.kind != kind:
            raise AttributeError(f"{self.kind} spec has no {what}")
        return self.payload

    @property
    def schema(self) -> dict:
        return json.loads(self._payload_of("json_schema", "schema"))

    @property
    def pattern(self) -> str:
        return self._payload_of("regex", "pattern")

    @property
    def choices(self) -> list[str]:
        """The choice strings (a new list each call); parsed once per spec, then copied."""
        self._payload_of("choice", "choices")
        d = self.__dict__
        cached = d.get("_choices")
        if cached is None:
            joined = d.get("_choices_joined")
            if joined is not None:  # the fast constructor's strings contain no '"'
                cached = tuple(joined.split('","'))
            else:
                value = json.loads(self.payload)
                if type(value) is not list or not all(type(v) is str for v in value):
                    return value  # a hand-built payload: parsed each time
                cached = tuple(value)
            d["_choices"] = cached
        return list(cached)

    @property
    def ebnf(self) -> str:
        return self._payload_of("grammar", "grammar")

    @property
    def tag(self) -> dict:
        return json.loads(self._payload_of("structural_tag", "structural tag"))

    def __repr__(self) -> str:
        body = self.payload if len(self.payload) <= 60 else self.payload[:57] + "..."
        return f"GuideSpec({self.kind}, {body!r}, {dict(self.options)})"


def _check_legacy_tag(tag: Mapping) -> None:
    """The ``structures`` + ``triggers`` shape, checked field by field: a missing ``begin`` must be
    this request's ``InvalidGuideError``, not a ``KeyError`` inside a backend. (xgrammar's own
    ``format`` shape is checked by the backends' parsers, which raise their own errors.)"""
    if "structures" not in tag:
        if "format" in tag and not isinstance(tag["format"], Mapping):
            raise InvalidGuideError(f"structural tag 'format' must be an object, got {type(tag['format']).__name__}")
        return
    structures, triggers = tag["structures"], tag.get("triggers", [])
    if not isinstance(structures, list):
        raise InvalidGuideError("structural tag 'structures' must be a list")
    for n, item in enumerate(structures):
        if not isinstance(item, Mapping):
            raise InvalidGuideError(f"structural tag structures[{n}] must be an object")
        for field_name in ("begin", "end"):
            if not isinstance(item.get(field_name), str):
                raise InvalidGuideError(f"structural tag structures[{n}] needs a string {field_name!r}")
        if "schema" in item and not isinstance(item["schema"], (Mapping, bool)):
            raise InvalidGuideError(f"structural tag structures[{n}].schema must be a JSON schema object")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGuideError("structural tag 'triggers' must be a list of non-empty strings")


def _sorted(opts: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(opts.items()))

"""``normalize_request``: every accepted request shape → one ``GuideSpec`` (or None).

Accepted: OpenAI/LMDeploy ``response_format``; vLLM legacy ``guided_*`` fields and a
``GuidedDecodingParams``-shaped dict; vLLM ``structured_outputs``; a whole request body holding
any of those (non-constraint fields such as ``messages`` are ignored; ``extra_body`` is read).

Rules (docs/migrating-from-outlines.md): exactly one constraint per request; an empty
constraint, an unknown ``guided_*`` key or an unknown key inside a constraint object raises
``InvalidGuideError``; every option is applied to the spec or, when it cannot apply, raises.

Backend hints route the compile: ``guided_decoding_backend`` / ``backend`` name the backend tried
first (``GuideSpec.with_routing``: the spec's ``backend`` option, read by ``compile_guide``), and
``no-fallback`` / ``disable_fallback: true`` stop the fallback to other backends. Both are part of
the spec key (a guide compiled by one backend is not another's). ``backend_was_auto: true`` (vLLM's
mark for a backend it filled in itself) makes the hint a non-binding default again: the hint is
dropped. The request's reasoning setting (``response_format["tokenrails_reasoning"]``) is set aside
unparsed on ``NormalizedRequest.reasoning`` for the engine adapter that interprets it.

This package sits beside the core: it imports ``GuideSpec`` and is never imported by it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..guided.errors import InvalidGuideError, client_input_boundary
from ..guided.spec import GuideSpec
from ..guided.xgrammar_classes import xgrammar_classes
from .backend_hints import BackendHint, parse_backend_hint
from .response_format import (
    REASONING_KEY,
    RawConstraint,
    canonical_structural_tag,
    is_pydantic_model_class,
    load_json_like,
    parse_response_format,
)
from .schema_transforms import disable_additional_properties

# vLLM GuidedDecodingParams / StructuredOutputsParams keys.
PARAM_CONSTRAINTS = {
    "json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
    "json_object": "json_object", "structural_tag": "structural_tag",
}
PARAM_OPTIONS = frozenset({
    "backend", "_backend", "whitespace_pattern", "disable_any_whitespace",
    "disable_additional_properties", "disable_fallback", "backend_was_auto", "_backend_was_auto",
})
PARAM_KEYS = frozenset(PARAM_CONSTRAINTS) | PARAM_OPTIONS
# vLLM legacy top-level request fields.
GUIDED_CONSTRAINTS = {
    "guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
    "guided_grammar": "grammar", "guided_json_object": "json_object",
}
GUIDED_OPTIONS = frozenset({"guided_whitespace_pattern", "guided_decoding_backend"})
BODY_CONTAINERS = ("response_format", "structured_outputs", "guided_decoding")


@dataclass(frozen=True)
class NormalizedRequest:
    """The spec plus what else the request said, read once: the backend hint (tokenrails name or
    None for auto; already applied to ``spec`` as routing options), whether fallback to other
    backends is allowed, and the raw ``tokenrails_reasoning`` value (None: not sent)."""

    spec: GuideSpec | None
    backend: str | None = None
    engine: str | None = None
    source: str | None = None
    fallback: bool = True
    reasoning: Any = None


def normalize_request(obj: Any) -> GuideSpec | None:
    """Map a request object (dict, JSON text, pydantic model, ``GuideSpec``) to a ``GuideSpec``.

    Returns ``None`` for an unconstrained request (``{"type": "text"}`` or ``None``)."""
    return parse_request(obj).spec


@client_input_boundary("reading the request failed")
def parse_request(obj: Any) -> NormalizedRequest:
    """Like ``normalize_request`` but returns everything the request said (``NormalizedRequest``)."""
    if obj is None:
        return NormalizedRequest(None)
    if isinstance(obj, GuideSpec):
        return NormalizedRequest(obj)
    if is_pydantic_model_class(obj):
        raise InvalidGuideError(
            "a pydantic model class is a schema, not a request: use GuideSpec.json_schema(Model) "
            "or {'response_format': Model}"
        )
    # what the client set, for ``strict`` (a pydantic default is not a client's choice)
    view = _unset_view(obj)
    obj = load_json_like(obj, "request")
    if not isinstance(obj, Mapping):
        raise InvalidGuideError(f"unsupported request type {type(obj).__name__}")
    req = _Collector()
    if "type" in obj and not _body_keys(obj):  # a response_format (a bad "type" is an error)
        req.add_response_format(obj, view)
    elif not obj:
        raise InvalidGuideError("empty constraint object")
    elif set(obj) <= PARAM_KEYS:
        req.add_params("structured_outputs", obj)
    else:
        req.add_body(obj, view)
    return req.build()


def _body_keys(obj: Mapping) -> set[str]:
    keys = {k for k in obj if isinstance(k, str)}
    return {k for k in keys if k.startswith("guided_") or k in BODY_CONTAINERS or k == "extra_body"}


def _present(value: Any) -> bool:
    """None (and pydantic's dumped defaults) mean "not sent"."""
    return value is not None


class _Collector:
    """Gathers constraints and options from every surface, then builds one spec."""

    def __init__(self) -> None:
        self.constraints: list[tuple[str, RawConstraint]] = []
        self.any_whitespace: tuple[str, bool] | None = None
        self.whitespace_pattern: tuple[str, str] | None = None
        self.no_additional_properties: str | None = None
        self.hint: tuple[str, BackendHint] | None = None
        self.non_strict: str | None = None  # where an explicit ``strict: false`` came from
        self.no_fallback: str | None = None  # where fallback was turned off
        self.hint_was_auto = False  # vLLM's backend_was_auto: the hint is not the client's
        self.reasoning: Any = None

    # ---- surfaces --------------------------------------------------------------------------
    def add_response_format(self, rf: Any, view: Any = None) -> None:
        """``view``: the same response_format as the client set it (see ``_unset_view``)."""
        if not is_pydantic_model_class(rf):
            rf = load_json_like(rf, "response_format")  # once: the constraint and the reasoning key
        raw = parse_response_format(rf)
        self.add_raw("response_format", raw)
        self.set_reasoning(rf)
        if raw is not None and raw[0] == "json_schema" and explicit_strict(
                rf if view is None else view) is False:
            self.non_strict = "response_format.json_schema.strict"

    def add_raw(self, source: str, raw: RawConstraint | None) -> None:
        if raw is not None:
            self.constraints.append((source, raw))

    def add_body(self, body: Mapping, view: Any = None) -> None:
        view = view if isinstance(view, Mapping) else {}
        for key, value in body.items():
            if not isinstance(key, str) or not _present(value):
                continue
            if key == "response_format":
                self.add_response_format(value, view.get(key))
            elif key in ("structured_outputs", "guided_decoding"):
                if hasattr(value, "model_dump") and not isinstance(value, type):
                    value = value.model_dump(exclude_none=True, by_alias=True)
                if not isinstance(value, Mapping):
                    raise InvalidGuideError(f"{key} must be an object, got {type(value).__name__}")
                self.add_params(key, value)
            elif key == "structural_tag":
                self.add_raw(key, ("structural_tag", value))
            elif key == "extra_body":
                if not isinstance(value, Mapping):
                    raise InvalidGuideError("extra_body must be an object")
                self.add_body(value, _unset_view(view.get(key, value)))
            elif key in GUIDED_CONSTRAINTS:
                if GUIDED_CONSTRAINTS[key] == "json_object" and value is False:
                    continue
                self.add_raw(key, (GUIDED_CONSTRAINTS[key], _not_empty(key, value)))
            elif key == "guided_whitespace_pattern":
                self.set_whitespace_pattern(key, value)
            elif key == "guided_decoding_backend":
                self.set_hint(key, value)
            elif key.startswith("guided_"):
                known = sorted(set(GUIDED_CONSTRAINTS) | GUIDED_OPTIONS)
                raise InvalidGuideError(f"unknown guided decoding field {key!r}; known: {known}")

    def add_params(self, where: str, params: Mapping) -> None:
        unknown = set(params) - PARAM_KEYS
        if unknown:
            raise InvalidGuideError(
                f"unknown key(s) {sorted(unknown)} in {where}; known: {sorted(PARAM_KEYS)}"
            )
        present = {k: v for k, v in params.items() if _present(v)}
        if not any(k in PARAM_CONSTRAINTS and v is not False for k, v in present.items()):
            if {"whitespace_pattern", "disable_additional_properties"} & set(present) or (
                present.get("disable_any_whitespace") is True
            ):
                raise InvalidGuideError(f"{where} sets options but no constraint")
            if not any(k in ("backend", "_backend") for k in present):
                raise InvalidGuideError(f"{where} is empty: no json/regex/choice/grammar/json_object")
        for key, value in present.items():
            label = f"{where}.{key}"
            if key in PARAM_CONSTRAINTS:
                kind = PARAM_CONSTRAINTS[key]
                if kind == "json_object":
                    if not isinstance(value, bool):
                        raise InvalidGuideError(f"{label} must be a boolean")
                    if value:
                        self.add_raw(label, ("json_object", None))
                    continue
                self.add_raw(label, (kind, _not_empty(label, value)))
            elif key == "whitespace_pattern":
                self.set_whitespace_pattern(label, value)
            elif key == "disable_any_whitespace":
                if _as_bool(label, value):
                    self.set_any_whitespace(label, False)
            elif key == "disable_additional_properties":
                if _as_bool(label, value):
                    self.no_additional_properties = label
            elif key in ("backend", "_backend"):
                self.set_hint(label, value)
            elif key == "disable_fallback":
                if _as_bool(label, value):
                    self.no_fallback = label
            else:  # backend_was_auto, _backend_was_auto
                if _as_bool(label, value):
                    self.hint_was_auto = True

    # ---- options ---------------------------------------------------------------------------
    def set_whitespace_pattern(self, source: str, value: Any) -> None:
        if not isinstance(value, str):
            raise InvalidGuideError(f"{source} must be a string")
        if self.whitespace_pattern and self.whitespace_pattern[1] != value:
            raise InvalidGuideError(f"{source} conflicts with {self.whitespace_pattern[0]}")
        self.whitespace_pattern = (source, value)

    def set_any_whitespace(self, source: str, value: bool) -> None:
        self.any_whitespace = (source, value)

    def set_hint(self, source: str, value: Any) -> None:
        hint = parse_backend_hint(value)
        if hint is None:
            return
        if self.hint and self.hint[1].backend != hint.backend:
            raise InvalidGuideError(f"{source}={value!r} conflicts with {self.hint[0]}")
        self.hint = (source, hint)
        if "disable-any-whitespace" in hint.options:
            self.set_any_whitespace(source, False)
        if "no-additional-properties" in hint.options:
            self.no_additional_properties = source
        if "no-fallback" in hint.options:
            self.no_fallback = source

    def set_reasoning(self, rf: Any) -> None:
        """Keep the raw reasoning setting of a (loaded) response_format; the adapters interpret it."""
        if isinstance(rf, Mapping) and rf.get(REASONING_KEY) is not None:
            self.reasoning = rf[REASONING_KEY]

    # ---- result ----------------------------------------------------------------------------
    def build(self) -> NormalizedRequest:
        hint = self.hint[1] if self.hint and not self.hint_was_auto else None
        backend, engine = (hint.backend, hint.engine) if hint else (None, None)
        fallback = self.no_fallback is None
        if len(self.constraints) > 1:
            names = [s for s, _ in self.constraints]
            raise InvalidGuideError(f"request has more than one constraint: {names}")
        if not self.constraints:
            for what in (self.whitespace_pattern, self.any_whitespace):
                if what is not None:
                    raise InvalidGuideError(f"{what[0]} is set but the request has no constraint")
            if self.no_additional_properties:
                raise InvalidGuideError(
                    f"{self.no_additional_properties} is set but the request has no constraint"
                )
            return NormalizedRequest(None, backend, engine, None, fallback, self.reasoning)
        source, (kind, value) = self.constraints[0]
        spec = self._spec(source, kind, value).with_routing(backend, fallback=fallback)
        return NormalizedRequest(spec, backend, engine, source, fallback, self.reasoning)

    def _spec(self, source: str, kind: str, value: Any) -> GuideSpec:
        json_kinds = ("json_schema", "json_object")
        for option in (self.whitespace_pattern, self.any_whitespace):
            if option is not None and kind not in json_kinds:
                raise InvalidGuideError(f"{option[0]} applies to JSON only, not to {source}")
        if self.no_additional_properties and kind != "json_schema":
            raise InvalidGuideError(
                f"{self.no_additional_properties} applies to a JSON schema only, not to {source}"
            )
        if self.whitespace_pattern and self.any_whitespace:
            raise InvalidGuideError(
                f"{self.whitespace_pattern[0]} conflicts with {self.any_whitespace[0]}"
            )
        any_ws = self.any_whitespace[1] if self.any_whitespace else True
        if kind == "json_schema":
            if isinstance(value, str) and not value.strip() or value in ({}, []):
                raise InvalidGuideError(f"{source}: empty JSON schema (use json_object for any JSON)")
            schema = GuideSpec.json_schema(value).schema  # dict / text / pydantic → canonical dict
            if self.no_additional_properties:
                schema = disable_additional_properties(schema)
            pattern = self.whitespace_pattern[1] if self.whitespace_pattern else None
            # strict=False only when the client said so; disable_additional_properties closes
            # every object explicitly, which a strict=False spec then honours as written.
            return GuideSpec.json_schema(schema, any_whitespace=any_ws, whitespace_pattern=pattern,
                                         strict=self.non_strict is None)
        if kind == "json_object":
            if self.whitespace_pattern:
                raise InvalidGuideError(
                    f"{self.whitespace_pattern[0]} needs a JSON schema; send "
                    "json={'type': 'object'} instead of json_object"
                )
            return GuideSpec.json_object(any_whitespace=any_ws)
        if kind == "regex":  # the stock engines' (xgrammar's) \d \w \s: guided/xgrammar_classes.py
            return GuideSpec.regex(xgrammar_classes(value) if isinstance(value, str) else value)
        if kind == "choice":
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise InvalidGuideError(f"{source} must be a list of strings")
            return GuideSpec.choice(value)
        if kind == "grammar":
            return GuideSpec.grammar(value)
        return GuideSpec.structural_tag(canonical_structural_tag(value))


def explicit_strict(rf: Any) -> bool | None:
    """The ``strict`` flag a client *sent* in an OpenAI/LMDeploy json_schema response_format
    (``{"type": "json_schema", "json_schema": {"schema": ..., "strict": false}}``), else None.

    A pydantic model's unset field does not count: LMDeploy's ``JsonSchema.strict`` defaults to
    False, which would otherwise turn every such request non-strict."""
    if isinstance(rf, (str, bytes)):
        rf = load_json_like(rf, "response_format")
    body = _field(rf, "json_schema")
    if _field(rf, "type") != "json_schema" or body is None or isinstance(body, (str, bytes, type)):
        return None
    value = _field(body, "strict")
    return value if isinstance(value, bool) else None


def _unset_view(obj: Any) -> Any:
    """A pydantic model as the client set it (unset defaults left out); anything else as is."""
    if hasattr(obj, "model_dump") and not isinstance(obj, type):
        try:
            return obj.model_dump(exclude_unset=True, by_alias=True)
        except Exception:  # not a pydantic v2 model after all: no view, the plain value decides
            return None
    return obj


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` for a mapping; for a pydantic model the attribute, only when it was set."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    fields_set = getattr(obj, "model_fields_set", None)
    if fields_set is not None and not isinstance(obj, type):
        return getattr(obj, name, None) if name in fields_set else None
    return None


def _not_empty(label: str, value: Any) -> Any:
    if value == "" or value == [] or value == {}:
        raise InvalidGuideError(f"{label} is empty")
    return value


def _as_bool(label: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidGuideError(f"{label} must be a boolean, got {value!r}")
    return value

"""Hypothesis fuzzing of the front ends: no exception other than GuideError ever escapes
``GuideSpec`` construction, the static analysis, or ``compile_guide`` — whatever the client sends."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideSpec, compile_guide
from tokenrails.requests import normalize_request
from tokenrails.guided.errors import GuideError
from tokenrails.guided.limits import GuideLimits
from tokenrails.guided.registry import available_backends
from tokenrails.guided.routing import route
from tokenrails.guided.backends.xgrammar_coverage import xgrammar_stricter, xgrammar_unenforced
from tokenrails.guided.limit_checks import check_schema_limits, scan_repeat_bounds

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
SMALL = GuideLimits(max_repeat=50, max_enum_values=50, max_any_of=16, max_json_depth=12,
                    max_regex_length=200, max_dfa_states=5_000, max_literal_bytes=200)

# ---- regexes: built from the pieces that break regex front ends -----------------------------
_ATOMS = ["a", "b", "é", ".", r"\d", r"\w", r"\s", "[a-c]", "[^x]", r"\.", "[", "]", "(", ")", "|",
          "*", "+", "?", "{", "}", "{2}", "{1,3}", "{0,}", "^", "$", r"\\", "(?:", "(?P<n>", r"\p{L}",
          r"\u00e9", r"\x41", "{99999}", "\ud800", "\x00", "*?", "(?=", r"\b"]
regexes = st.lists(st.sampled_from(_ATOMS), min_size=1, max_size=12).map("".join)

REGEX_BACKENDS = [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()] + ["auto"]


@pytest.mark.parametrize("backend", REGEX_BACKENDS)
@FAST
@given(pattern=regexes)
def test_regex_front_end_only_raises_guide_errors(vocab, backend, pattern):
    try:
        spec = GuideSpec.regex(pattern)
        guide = compile_guide(spec, vocab, backend, limits=SMALL)
    except GuideError:
        return
    m = guide.matcher()
    assert isinstance(m.is_accepting(), bool)


@FAST
@given(text=st.text(max_size=200))
def test_repeat_scanner_never_crashes(text):
    for grammar in (False, True):
        try:
            bound = scan_repeat_bounds(text, SMALL, grammar=grammar)
        except GuideError:
            continue
        assert 0 <= bound <= SMALL.max_repeat


# ---- JSON schemas: recursive strategy over the keywords that matter --------------------------
_leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])}),
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": st.integers(-2, 80), "maxLength": st.integers(-2, 80),
                                    "pattern": regexes, "format": st.sampled_from(["email", "date", "uuid", "bogus"])}),
    st.fixed_dictionaries({"type": st.just("integer")},
                          optional={"minimum": st.integers(-10**20, 10**20), "maximum": st.floats(allow_nan=False),
                                    "multipleOf": st.one_of(st.integers(-3, 9), st.floats(0.1, 3))}),
    st.fixed_dictionaries({"enum": st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=6)}),
    st.fixed_dictionaries({"const": st.one_of(st.integers(), st.text(max_size=8), st.booleans())}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/$defs/x", "#/nope", "http://x/y", "#/properties/a"])}),
    st.booleans(),
)


def _extend(children):
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("array"), "items": children},
                              optional={"minItems": st.integers(-1, 5), "maxItems": st.integers(-1, 5),
                                        "uniqueItems": st.booleans(), "prefixItems": st.lists(children, max_size=2)}),
        st.fixed_dictionaries({"type": st.just("object"),
                               "properties": st.dictionaries(st.sampled_from(["a", "b", "c d", "é"]), children, max_size=3)},
                              optional={"required": st.lists(st.sampled_from(["a", "b", "z"]), max_size=3),
                                        "additionalProperties": st.one_of(st.booleans(), children),
                                        "patternProperties": st.dictionaries(regexes, children, max_size=1),
                                        "minProperties": st.integers(0, 3)}),
        st.fixed_dictionaries({st.sampled_from(["anyOf", "oneOf", "allOf"]): st.lists(children, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"not": children}),
        st.fixed_dictionaries({"$defs": st.fixed_dictionaries({"x": children}), "$ref": st.just("#/$defs/x")}),
    )


schemas = st.recursive(_leaf, _extend, max_leaves=8)
SCHEMA_BACKENDS = [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()] + ["auto"]


@FAST
@given(schema=schemas)
def test_schema_analysis_only_raises_guide_errors(vocab, schema):
    try:
        spec = GuideSpec.json_schema(schema)
    except GuideError:
        return
    doc = spec.schema
    for fn in (xgrammar_unenforced, xgrammar_stricter):
        assert isinstance(fn(doc), list)
    try:
        check_schema_limits(doc, SMALL)
    except GuideError:
        pass
    ladder, reason = route(spec, vocab, SMALL)
    assert ladder and isinstance(reason, str)


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=schemas)
def test_schema_lowering_only_raises_guide_errors(vocab, backend, schema):
    try:
        guide = compile_guide(GuideSpec.json_schema(schema, any_whitespace=False), vocab, backend, limits=SMALL)
    except GuideError:
        return
    m = guide.matcher()
    assert isinstance(m.is_accepting(), bool)


@FAST
@given(body=st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.binary(max_size=20)),
    lambda c: st.one_of(st.lists(c, max_size=3),
                        st.dictionaries(st.sampled_from(["response_format", "type", "json_schema", "schema",
                                                         "guided_json", "guided_regex", "guided_choice",
                                                         "guided_grammar", "name", "strict"]), c, max_size=4)),
    max_leaves=10))
def test_request_normalisation_only_raises_guide_errors(body):
    try:
        spec = normalize_request(body)
    except GuideError:
        return
    assert spec is None or isinstance(spec, GuideSpec)
    if spec is not None:
        json.dumps(spec.payload)

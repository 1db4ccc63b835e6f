"""One JSON-Schema policy on every backend, part 2: keyword-implied types and ``strict=False``.

* Type-specific keywords at a node without ``type`` mean that type (``{"properties": ...}`` is an
  object schema): xgrammar, llguidance and the fsm backend accept the same instances, and every
  adversarial output is valid under ``jsonschema`` for the schema with the implied types written
  out (``infer_types``, checked here against hand-written expectations).
* ``GuideSpec.json_schema(schema, strict=False)``: JSON Schema's open objects and tuples. Every
  backend that compiles such a spec accepts an extra property; strict specs refuse it; the fsm
  backend (which can only close objects) refuses strict=False schemas that are not already closed.
* Request mapping: only an explicit ``"strict": false`` in a json_schema response_format is
  non-strict; strict specs keep their keys.
"""
from __future__ import annotations

import json

import jsonschema
import pytest

from tokenrails import GuideSpec, Vocabulary, compile_guide
from tokenrails.requests import normalize_request
from tokenrails.guided.errors import GuideError, UnsupportedGuideError
from tokenrails.guided.routing import route
from tokenrails.guided.limits import DEFAULT_LIMITS
from tokenrails.guided.schema_semantics import already_closed, close_schema, infer_types
from tests.guided.helpers import adversarial_decode, decode_text

V = jsonschema.Draft202012Validator
BACKENDS = ("xgrammar", "llguidance", "fsm")
I = {"type": "integer", "minimum": 0, "maximum": 9}
W = {"type": "string", "pattern": "^[a-z]{1,3}$"}

# name -> (schema, expected infer_types(schema))
TYPELESS = {
    "props": ({"properties": {"a": I}}, {"properties": {"a": I}, "type": "object"}),
    "props_plain": ({"properties": {"a": {"type": "integer"}}, "required": ["a"]},  # fsm compiles it
                    {"properties": {"a": {"type": "integer"}}, "required": ["a"], "type": "object"}),
    "props_required": ({"properties": {"a": I}, "required": ["a"]},
                       {"properties": {"a": I}, "required": ["a"], "type": "object"}),
    "additional_false": ({"additionalProperties": False}, {"additionalProperties": False, "type": "object"}),
    "additional_schema": ({"additionalProperties": I}, {"additionalProperties": I, "type": "object"}),
    "min_properties": ({"minProperties": 1}, {"minProperties": 1, "type": "object"}),
    "nested": ({"type": "object", "properties": {"o": {"properties": {"a": I}, "required": ["a"]}},
                "required": ["o"]},
               {"type": "object", "properties": {"o": {"properties": {"a": I}, "required": ["a"],
                                                       "type": "object"}}, "required": ["o"]}),
    "in_anyof": ({"anyOf": [{"properties": {"a": I}, "required": ["a"]}, {"type": "boolean"}]},
                 {"anyOf": [{"properties": {"a": I}, "required": ["a"], "type": "object"},
                            {"type": "boolean"}]}),
    "in_items": ({"type": "array", "items": {"properties": {"k": W}, "required": ["k"]}, "maxItems": 2},
                 {"type": "array", "items": {"properties": {"k": W}, "required": ["k"], "type": "object"},
                  "maxItems": 2}),
    "items": ({"items": I, "maxItems": 3}, {"items": I, "maxItems": 3, "type": "array"}),
    "prefix_items": ({"prefixItems": [I, W]}, {"prefixItems": [I, W], "type": "array"}),
    "min_items": ({"minItems": 1, "maxItems": 2}, {"minItems": 1, "maxItems": 2, "type": "array"}),
    "pattern": ({"pattern": "^a{1,4}$"}, {"pattern": "^a{1,4}$", "type": "string"}),
    "min_length": ({"minLength": 2, "maxLength": 4}, {"minLength": 2, "maxLength": 4, "type": "string"}),
    "minimum": ({"minimum": 3, "maximum": 7}, {"minimum": 3, "maximum": 7, "type": "number"}),
    "mixed": ({"properties": {"a": I}, "items": I, "maxItems": 2},
              {"properties": {"a": I}, "items": I, "maxItems": 2, "type": ["object", "array"]}),
    "allof_parts_count": ({"allOf": [{"properties": {"a": I}}, {"required": ["a"]}]},
                          {"allOf": [{"properties": {"a": I}}, {"required": ["a"]}], "type": "object"}),
    "defs_entry": ({"$defs": {"P": {"properties": {"a": I}}}, "$ref": "#/$defs/P"},
                   {"$defs": {"P": {"properties": {"a": I}, "type": "object"}}, "$ref": "#/$defs/P"}),
}

# Left alone: an explicit type decides (also one in an allOf part or $ref target), and `not`/`if`
# (an added type would change what the negation or condition means), and values.
UNCHANGED = [
    {"type": ["object", "null"], "allOf": [{"properties": {"a": I}}]},
    {"allOf": [{"type": "object"}], "minLength": 2},
    {"$defs": {"S": {"type": ["string", "null"]}}, "$ref": "#/$defs/S", "minLength": 2},
    {"type": "object", "properties": {"n": {"type": "object", "not": {"required": ["a"]}}}},
    {"type": "object", "if": {"properties": {"k": {"const": 1}}}, "then": {"type": "object"}},
    {"type": "object", "properties": {"e": {"type": "object", "enum": [{"properties": 1}]},
                                      "c": {"const": {"minLength": 1}}}},
    {"type": "integer"},
    {},
]

# instance texts probed on every backend (the byte vocabulary spells any text)
PROBES = ['5', '"aa"', '"a"', '"aaaaa"', '[1]', '[1, "ab"]', '[]', 'null', 'true', '{}', '{"a": 1}',
          '{"a": 1, "b": 2}', '{"b": 2}', '{"o": {"a": 1}}', '{"o": {}}', '[{"k": "ab"}]', '2', '7.5']


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    return Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="bytes")


def _compile(backend, spec, vocab):
    try:
        return compile_guide(spec, vocab, backend)
    except UnsupportedGuideError:
        return None


def _accepts(guide, text: str, vocab: Vocabulary) -> bool:
    m = guide.matcher()
    return all(m.accept_token(b) for b in text.encode()) and m.accept_token(vocab.eos_ids[0])


@pytest.mark.parametrize("name", sorted(TYPELESS))
def test_implied_types_are_written_out(name):
    schema, expected = TYPELESS[name]
    before = json.dumps(schema)
    assert infer_types(schema) == expected
    assert json.dumps(schema) == before  # input not mutated
    assert infer_types(expected) == expected  # idempotent


@pytest.mark.parametrize("schema", UNCHANGED, ids=[f"u{i}" for i in range(len(UNCHANGED))])
def test_explicit_types_not_and_values_are_left_alone(schema):
    assert infer_types(schema) == schema


@pytest.mark.parametrize("name", sorted(TYPELESS))
def test_every_backend_accepts_the_same_instances(byte_vocab, name):
    """Each compiling backend accepts exactly the instances valid under the typed schema (closed
    where the policy closes); a backend that cannot enforce it refuses with UnsupportedGuideError."""
    schema, typed = TYPELESS[name]
    spec = GuideSpec.json_schema(schema)
    oracle = V(close_schema(typed))
    expected = [t for t in PROBES if oracle.is_valid(json.loads(t))]
    compiled = 0
    for backend in BACKENDS:
        guide = _compile(backend, spec, byte_vocab)
        if guide is None:
            continue
        compiled += 1
        assert [t for t in PROBES if _accepts(guide, t, byte_vocab)] == expected, backend
    assert compiled, "no backend compiled the schema"
    assert compile_guide(spec, byte_vocab, "auto") is not None


# values of any JSON type: a worst-token sampler may nest forever, so only instances are probed
FREE_FORM = {"min_items", "min_properties"}


@pytest.mark.parametrize("name", sorted(set(TYPELESS) - FREE_FORM))
def test_adversarial_outputs_obey_jsonschema_and_the_policy(vocab, name):
    """Worst-token outputs of each backend: valid under plain jsonschema for the original schema
    (implied types only narrow it) and under the typed, closed schema."""
    schema, typed = TYPELESS[name]
    spec = GuideSpec.json_schema(schema, any_whitespace=False)
    plain, policy = V(schema), V(close_schema(typed))
    for backend in BACKENDS:
        guide = _compile(backend, spec, vocab)
        if guide is None:
            continue
        ended = 0
        for seed in range(3):
            ids, done = adversarial_decode(guide.matcher(), vocab, seed=seed, max_steps=120)
            if not done:
                continue
            ended += 1
            value = json.loads(decode_text(vocab, ids))
            plain.validate(value)
            policy.validate(value)
        assert ended, f"{backend}: no seed produced a complete output"


def test_typeless_string_keywords_no_longer_dropped_by_xgrammar(byte_vocab):
    """Before the rule xgrammar compiled {"minimum": 3} as any JSON value (1.5 accepted)."""
    g = compile_guide(GuideSpec.json_schema({"minimum": 3}), byte_vocab, "xgrammar")
    assert _accepts(g, "5", byte_vocab) and not _accepts(g, "1.5", byte_vocab)
    assert not _accepts(g, '"x"', byte_vocab)


# ---- strict=False ---------------------------------------------------------------------------
OPEN = {
    "flat": ({"type": "object", "properties": {"a": I}, "required": ["a"]}, '{"a": 1}', '{"a": 1, "zz": [true]}'),
    "typeless": ({"properties": {"a": I}, "required": ["a"]}, '{"a": 1}', '{"a": 1, "zz": null}'),
    "nested": ({"type": "object", "properties": {"o": {"type": "object", "properties": {"x": I}}},
                "required": ["o"]}, '{"o": {"x": 1}}', '{"o": {"x": 1, "y": "q"}}'),
    "array_items": ({"type": "array", "items": {"type": "object", "properties": {"k": W}}, "maxItems": 2},
                    '[{"k": "ab"}]', '[{"k": "ab", "v": 1}]'),
    "tuple": ({"type": "array", "prefixItems": [I]}, '[1]', '[1, "extra"]'),
    "in_anyof": ({"anyOf": [{"type": "object", "properties": {"c": W}, "required": ["c"]}, {"type": "null"}]},
                 '{"c": "ab"}', '{"c": "ab", "d": 2}'),
}


@pytest.mark.parametrize("name", sorted(OPEN))
def test_extra_member_accepted_only_when_not_strict(byte_vocab, name):
    schema, base, extra = OPEN[name]
    strict_spec = GuideSpec.json_schema(schema)
    open_spec = GuideSpec.json_schema(schema, strict=False)
    assert not V(close_schema(infer_types(schema))).is_valid(json.loads(extra))
    assert V(schema).is_valid(json.loads(extra))
    compiled_open = 0
    for backend in BACKENDS:
        g = _compile(backend, strict_spec, byte_vocab)
        if g is not None:
            assert _accepts(g, base, byte_vocab) and not _accepts(g, extra, byte_vocab), backend
        g = _compile(backend, open_spec, byte_vocab)
        if g is not None:
            compiled_open += 1
            assert _accepts(g, base, byte_vocab) and _accepts(g, extra, byte_vocab), backend
    assert compiled_open >= 2  # xgrammar (strict_mode=False) and llguidance (no closing)
    assert _accepts(compile_guide(open_spec, byte_vocab, "auto"), extra, byte_vocab)


@pytest.mark.parametrize("name", ["flat", "typeless", "tuple", "in_anyof"])
def test_non_strict_adversarial_outputs_cross_backends(vocab, name):
    """strict=False: each backend's worst-token outputs are valid JSON Schema instances and the
    other backend accepts them token by token (same language, both directions). Only schemas
    whose open member sits at the top: a worst-token sampler in a nested open object keeps
    adding members for ever."""
    schema = OPEN[name][0]
    spec = GuideSpec.json_schema(schema, strict=False, any_whitespace=False)
    guides = {b: compile_guide(spec, vocab, b) for b in ("xgrammar", "llguidance")}
    plain = V(schema)
    for source, other in (("xgrammar", "llguidance"), ("llguidance", "xgrammar")):
        ended = 0
        for seed in range(4):
            ids, done = adversarial_decode(guides[source].matcher(), vocab, seed=seed, max_steps=160)
            if not done:
                continue
            ended += 1
            plain.validate(json.loads(decode_text(vocab, ids)))
            m = guides[other].matcher()
            assert all(m.accept_token(t) for t in ids) and m.accept_token(vocab.eos_ids[0]), (
                source, decode_text(vocab, ids))
        assert ended, source


def test_fsm_refuses_open_schemas_but_compiles_closed_ones(byte_vocab):
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    with pytest.raises(UnsupportedGuideError, match="strict=False"):
        compile_guide(GuideSpec.json_schema(open_schema, strict=False), byte_vocab, "fsm")
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    assert already_closed(closed) and not already_closed(open_schema)
    g = compile_guide(GuideSpec.json_schema(closed, strict=False), byte_vocab, "fsm")
    assert _accepts(g, '{"a": 1}', byte_vocab) and not _accepts(g, '{"a": 1, "b": 2}', byte_vocab)


def test_strict_default_keeps_spec_keys():
    schema = {"type": "object", "properties": {"a": I}}
    legacy = GuideSpec("json_schema", GuideSpec.json_schema(schema).payload, (("any_whitespace", True),))
    assert GuideSpec.json_schema(schema).key == legacy.key
    assert GuideSpec.json_schema(schema, strict=True).key == legacy.key
    assert GuideSpec.json_schema(schema, strict=None).key == legacy.key  # None: unspecified
    off = GuideSpec.json_schema(schema, strict=False)
    assert off.key != legacy.key and off.option("strict") is False
    assert "strict" not in dict(GuideSpec.json_schema(schema).options)


def test_routing_uses_the_spec_policy():
    # strict: xgrammar closes an item-less bounded array, so llguidance goes first; open: no finding
    schema = {"type": "array", "maxItems": 2}
    vocab = Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="route")
    ladder, reason = route(GuideSpec.json_schema(schema), vocab, DEFAULT_LIMITS)
    assert ladder[0] == "llguidance" and "stricter" in reason
    _, reason = route(GuideSpec.json_schema(schema, strict=False), vocab, DEFAULT_LIMITS)
    assert "stricter" not in reason


def test_strict_mode_compile_errors_fall_through_to_llguidance(byte_vocab):
    """xgrammar's strict_mode rejects minProperties/minItems it cannot satisfy with a compile
    error; that is now an UnsupportedGuideError, so a repeated schema still compiles on auto."""
    for schema in ({"type": "object", "minProperties": 1}, {"minItems": 1}):
        spec = GuideSpec.json_schema(schema)
        with pytest.raises(UnsupportedGuideError, match="strict mode"):
            compile_guide(spec, byte_vocab, "xgrammar")
        for _ in range(2):  # the second time the schema is "seen": xgrammar is tried first
            assert compile_guide(spec, byte_vocab, "auto").backend == "llguidance"
        assert compile_guide(GuideSpec.json_schema(schema, strict=False), byte_vocab, "xgrammar")


# ---- request mapping ------------------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _rf(**body):
    return {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, **body}}


@pytest.mark.parametrize("request_obj,strict", [
    (_rf(), True),
    (_rf(strict=True), True),
    (_rf(strict=None), True),
    (_rf(strict=False), False),
    ({"messages": [], "response_format": _rf(strict=False)}, False),
    ({"extra_body": {"response_format": _rf(strict=False)}}, False),
    (json.dumps(_rf(strict=False)), False),
    ({"type": "json_schema", "json_schema": SCHEMA}, True),  # LMDeploy's bare schema
    ({"guided_json": SCHEMA}, True),  # vLLM stays strict
    ({"structured_outputs": {"json": SCHEMA}}, True),
])
def test_request_mapping(request_obj, strict):
    spec = normalize_request(request_obj)
    assert spec.kind == "json_schema"
    assert (spec.option("strict", True) is not False) is strict
    expected = GuideSpec.json_schema(SCHEMA, strict=strict)
    assert spec.key == expected.key


def test_lmdeploy_pydantic_default_is_not_an_opt_out():
    """lmdeploy's JsonSchema model defaults ``strict`` to False: only a value the client set counts."""
    from lmdeploy.serve.openai.protocol import JsonSchema, ResponseFormat

    unset = ResponseFormat(type="json_schema", json_schema=JsonSchema(name="n", schema=SCHEMA))
    assert normalize_request(unset).key == GuideSpec.json_schema(SCHEMA).key
    assert normalize_request({"response_format": unset}).key == GuideSpec.json_schema(SCHEMA).key
    off = ResponseFormat(type="json_schema", json_schema=JsonSchema(name="n", schema=SCHEMA, strict=False))
    assert normalize_request(off).option("strict") is False
    assert normalize_request({"response_format": off}).option("strict") is False


def test_lmdeploy_engine_spec_keeps_the_option():
    from tokenrails.engine_patch.lmdeploy.server.request_parsing import spec_of, validate_spec

    spec = spec_of(_rf(strict=False))
    assert spec.option("strict") is False
    validate_spec(spec)  # compiles on the probe vocabulary
    assert spec_of(_rf()).key == GuideSpec.json_schema(SCHEMA).key


def test_outlines_compat_keeps_outlines_language(byte_vocab):
    """The outlines shim lowers the schema exactly as outlines does (no implied-type rewrite,
    no strict option): same regex as outlines-core for a type-less schema."""
    from outlines_core.json_schema import build_regex_from_schema

    from tokenrails.compat.outlines._json_language import json_spec, outlines_regex

    schema = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = json_spec(schema)
    assert spec.option("strict") is None
    assert outlines_regex(spec) == build_regex_from_schema(json.dumps(schema), None)
    if spec.kind == "json_schema":
        g = compile_guide(spec, byte_vocab, "fsm")
        assert g.regex == build_regex_from_schema(spec.payload, None)


def test_disable_additional_properties_with_strict_false_is_closed(byte_vocab):
    """vLLM's disable_additional_properties writes additionalProperties: false, which a
    strict=False spec honours: the fsm backend can then compile it too."""
    spec = normalize_request({"response_format": _rf(strict=False),
                              "guided_decoding_backend": "xgrammar:no-additional-properties"})
    assert spec.option("strict") is False
    assert spec.option("backend") == "xgrammar"  # the hint routes an auto compile
    spec = spec.with_routing(None)  # ... and a pinned backend refuses another's request
    for backend in BACKENDS:
        g = compile_guide(spec, byte_vocab, backend)
        assert _accepts(g, '{"a": 1}', byte_vocab) and not _accepts(g, '{"a": 1, "b": 2}', byte_vocab)


def test_policy_errors_are_typed(byte_vocab):
    with pytest.raises(GuideError):
        compile_guide(GuideSpec.json_schema({"properties": {"a": {"$ref": "#/nope"}}}), byte_vocab, "auto")


# ---- fsm: where outlines-core's lowering differs from the policy (refused, never silent) --------
LOWERED_DIFFERENTLY = [
    # (schema, an instance the policy admits but outlines' regex refuses)
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True}, '{"a":1,"b":2}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
     '{"a":1,"b":2}'),
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}]}, "[1]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, '[1,"x"]'),
    ({"type": ["object", "null"], "properties": {"a": {"type": "integer"}}}, "null"),
    ({"type": ["object", "array"], "properties": {"a": {"type": "integer"}}, "items": {"type": "integer"}}, "[1]"),
]


@pytest.mark.parametrize("schema,instance", LOWERED_DIFFERENTLY, ids=[f"d{i}" for i in range(len(LOWERED_DIFFERENTLY))])
def test_fsm_refuses_what_outlines_lowers_differently(byte_vocab, schema, instance):
    import re

    from outlines_core.json_schema import build_regex_from_schema

    assert V(close_schema(schema)).is_valid(json.loads(instance))  # the policy admits it
    assert re.fullmatch(build_regex_from_schema(json.dumps(schema), ""), instance) is None  # outlines refuses
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.json_schema(schema), byte_vocab, "fsm")
    assert _accepts(compile_guide(GuideSpec.json_schema(schema), byte_vocab, "auto"), instance, byte_vocab)


def test_fsm_still_compiles_a_full_length_closed_tuple(byte_vocab):
    schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}], "minItems": 2}
    g = compile_guide(GuideSpec.json_schema(schema), byte_vocab, "fsm")
    assert _accepts(g, "[1, 2]", byte_vocab) and not _accepts(g, "[1, 2, 3]", byte_vocab)


def test_date_formats_go_to_llguidance_even_when_repeated():
    """xgrammar's date grammar admits 2020-02-31 (llguidance refuses it): auto sends date formats
    to llguidance first, also for a repeated schema (which would otherwise prefer xgrammar)."""
    vocab = Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="dates")
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    spec = GuideSpec.json_schema(schema, any_whitespace=False)
    for _ in range(2):  # the second time the key has been seen
        ladder, reason = route(spec, vocab, DEFAULT_LIMITS)
        assert ladder[0] == "llguidance" and "looser" in reason
    guide = compile_guide(spec, vocab, "auto")
    assert guide.backend == "llguidance"
    assert _accepts(guide, '{"d": "2020-02-28"}', vocab) and not _accepts(guide, '{"d": "2020-02-31"}', vocab)
    raw = compile_guide(spec, vocab, "xgrammar")  # still compiles when asked for (approximate)
    assert _accepts(raw, '{"d": "2020-02-31"}', vocab)

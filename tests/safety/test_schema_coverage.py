"""Zero wrong accepts: for each (schema, invalid instance) a backend either refuses the schema with a
GuideError or rejects the instance. Cases are the minimised findings of bench/conformance.py and
of probing xgrammar 0.2.8 keyword by keyword; the keywords xgrammar *does* enforce are here too, so
an upgrade that silently drops one fails this test instead of shipping unsafe routing."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tokenrails import GuideSpec, compile_guide
from tokenrails.guided.errors import GuideError, UnsupportedGuideError
from tokenrails.guided.registry import available_backends
from tokenrails.guided.backends.xgrammar_coverage import xgrammar_stricter, xgrammar_unenforced

# (schema, valid instance or None, invalid instance)
CASES = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ({"type": "integer", "not": {"const": 3}}, 4, 3),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "if": {"required": ["a"]}, "then": {"required": ["b"]}}, {"a": 1, "b": 2}, {"a": 1}),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependentRequired": {"a": ["b"]}}, {"b": 1}, {"a": 1}),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
      "dependencies": {"a": ["b"]}}, {"b": 1}, {"a": 1}),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, [5], [1]),
    ({"type": "object", "propertyNames": {"pattern": "^a"}, "additionalProperties": {"type": "integer"}},
     {"a": 1}, {"b": 1}),  # xgrammar full-matches "^a" here: {"ab": 1} is refused (too strict, safe)
    ({"type": "integer", "multipleOf": 3}, 6, 4),
    ({"type": "number", "multipleOf": 0.5}, 1.5, 0.3),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}, {"a": 1, "b": 2}, {"a": 1}),
    ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1}, {"a": 1}, {"a": 1, "b": 2}),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}}, {"xa": 1}, {"xa": "s"}),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, 4, 2),
    ({"type": "integer", "allOf": [{"minimum": 3}]}, 4, 2),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1.5, 1),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, 1, True),
    ({"type": "string", "pattern": "^a+$", "maxLength": 2}, "aa", "aaa"),
    ({"type": "string", "pattern": "^a+$", "minLength": 2}, "aa", "a"),
    ({"type": "string", "format": "email", "maxLength": 8}, "a@b.com", "abcdefgh@x.com"),
    ({"type": "string", "format": "email", "pattern": "^z"}, "z@x.com", "a@x.com"),
    ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "abc"),
    ({"type": "string", "format": "date"}, "2020-01-02", "2020-13-45"),
    ({"type": "string", "format": "ipv4"}, "1.2.3.4", "1.2.3"),
    ({"type": "object", "required": ["a"]}, {"a": 1}, {}),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}, {"a": 1, "b": 0}, {"a": 1}),
    ({"type": "integer", "$ref": "#/$defs/a", "$defs": {"a": {"minimum": 3}}}, 4, 2),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, [1], [1, 2]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}, [1, 2], [1, 2, 3, 4]),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 100000}, None, [1]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False}, {"a": 1}, {"b": 1}),
    ({"type": "number", "exclusiveMinimum": 3}, 3.5, 3),
    ({"type": "integer", "minimum": -5, "maximum": 5}, -5, -6),
    ({"type": "string", "maxLength": 1}, "é", "éé"),
    ({"enum": [{"a": 1}, [1, 2], None]}, {"a": 1}, {"a": 2}),
    ({"const": "x"}, "x", "y"),
    ({"type": ["integer", "null"]}, None, "x"),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "maximum": 0}]}, "ab", 1),
    # JSON-Schema-Test-Suite draft4 findings (bench/conformance.py --jsts)
    ({"type": "object", "patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}},
     {"aaaa": 18}, {"aaaa": 31}),  # a key matching both patterns must satisfy both (xgrammar: one)
    ({"type": "object", "properties": {"ab": {"type": "integer"}}, "patternProperties": {"^a": {"maximum": 5}}},
     {"ab": 3}, {"ab": 7}),  # a listed name that also matches a pattern
    ({"properties": {"bar": {"type": "integer"}}, "required": ["bar"],
      "allOf": [{"properties": {"foo": {"type": "string"}}, "required": ["foo"]}]},
     {"foo": "q", "bar": 2}, {"bar": 2}),  # outlines keeps only the siblings of allOf
]

BACKENDS = ["auto"] + [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()]


def _validator(schema):
    draft7 = "dependencies" in schema or isinstance(schema.get("items"), list)
    cls = jsonschema.Draft7Validator if draft7 else jsonschema.Draft202012Validator
    return cls(schema, format_checker=jsonschema.FormatChecker())


def _accepts(guide, tokenizer, vocab, value) -> bool:
    """Raw UTF-8 text, as a model writes it (llguidance refuses \\u escapes under maxLength)."""
    m = guide.matcher()
    ids = tokenizer.encode(json.dumps(value, ensure_ascii=False), add_special_tokens=False)
    return all(m.accept_token(t) for t in ids) and m.accept_token(vocab.eos_ids[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_backend_accepts_an_invalid_instance(vocab, smollm2_tokenizer, backend):
    wrong = []
    for schema, valid, invalid in CASES:
        validator = _validator(schema)
        assert not validator.is_valid(invalid), schema  # the corpus itself is right
        if valid is not None:
            assert validator.is_valid(valid), schema
        try:
            guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend)
        except GuideError:
            continue
        if _accepts(guide, smollm2_tokenizer, vocab, invalid):
            wrong.append((schema, invalid))
    assert not wrong, f"{backend} wrongly accepts: {wrong}"


@pytest.mark.parametrize("backend", [b for b in ("auto", "llguidance") if b in available_backends() or b == "auto"])
def test_valid_instances_accepted_when_compiled(vocab, smollm2_tokenizer, backend):
    """No false refusals on the corpus either (auto routes xgrammar-stricter schemas away).

    A refusal counts only when it is an ``UnsupportedGuideError`` for a keyword this backend is
    documented not to enforce exactly (docs/backends.md); any other refusal is a false refusal,
    so a backend refusing everything fails here."""
    wrong, refused_wrongly = [], []
    for schema, valid, _ in CASES:
        if valid is None:
            continue
        try:
            guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend)
        except GuideError as exc:
            keywords = _keywords(schema)
            if not (isinstance(exc, UnsupportedGuideError) and keywords & DOCUMENTED_REFUSALS[backend]):
                refused_wrongly.append((schema, f"{type(exc).__name__}: {exc}"))
            continue
        if not _accepts(guide, smollm2_tokenizer, vocab, valid):
            wrong.append((schema, valid))
    assert not wrong, f"{backend} wrongly rejects: {wrong}"
    assert not refused_wrongly, f"{backend} falsely refuses: {refused_wrongly}"


# Keywords a backend refuses by design (measured: none of them is enforced exactly there); a
# schema holding none of them must compile on that backend.
_NEVER_EXACT = {"uniqueItems", "not", "if", "contains", "oneOf", "unevaluatedProperties", "patternProperties"}
DOCUMENTED_REFUSALS = {"auto": _NEVER_EXACT, "llguidance": _NEVER_EXACT | {"propertyNames"}}


def _keywords(schema) -> set:
    found = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_analysis_flags_exactly_the_dropped_keywords():
    flagged = {json.dumps(s) for s, _, _ in CASES if xgrammar_unenforced(s)}
    assert json.dumps({"type": "integer", "multipleOf": 3}) not in flagged  # enforced
    assert json.dumps({"type": "number", "multipleOf": 0.5}) in flagged
    assert json.dumps({"allOf": [{"type": "integer"}, {"minimum": 3}]}) in flagged
    assert not xgrammar_unenforced({"oneOf": [{"type": "integer"}, {"type": "string"}]})  # disjoint
    tagged = {"oneOf": [
        {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}, "required": ["k"]},
        {"type": "object", "properties": {"k": {"const": "b"}, "x": {"type": "integer"}}, "required": ["k"]}]}
    assert not xgrammar_unenforced(tagged)
    assert xgrammar_stricter({"type": "string", "pattern": "a"})
    assert not xgrammar_stricter({"type": "string", "pattern": "^a$"})
    # one strict policy: unlisted properties are refused by every backend, so no routing reason
    assert not xgrammar_stricter({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert xgrammar_stricter({"type": "array", "maxItems": 3})  # xgrammar admits only []
    assert not xgrammar_stricter({"type": "array", "maxItems": 3, "items": {"type": "integer"}})


# ---- lowering is exact: same verdict as the original on every instance ----------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tokenrails.guided.backends.llguidance_lowering import lower_dependencies  # noqa: E402

_keys = st.sampled_from(["a", "b", "c"])
_small = st.one_of(
    st.just({"propertyNames": False}),
    st.fixed_dictionaries({"required": st.lists(_keys, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "integer", "number", "null"])}),
    st.fixed_dictionaries({"properties": st.dictionaries(_keys, st.fixed_dictionaries({"type": st.sampled_from(["integer", "string"])}), max_size=2)}),
)
def _dep_schemas(draft7: bool):
    def extend(c):
        deps = ([st.fixed_dictionaries({"dependencies": st.dictionaries(_keys, st.one_of(st.lists(_keys, max_size=2), c), max_size=2)})]
                if draft7 else
                [st.fixed_dictionaries({"dependentRequired": st.dictionaries(_keys, st.lists(_keys, max_size=2), max_size=2)}),
                 st.fixed_dictionaries({"dependentSchemas": st.dictionaries(_keys, c, max_size=2)})])
        return st.one_of(*deps, st.fixed_dictionaries({"not": c}),
                         st.fixed_dictionaries({"allOf": st.lists(c, min_size=1, max_size=2)}))
    return st.recursive(_small, extend, max_leaves=5)


_dep_schema = st.one_of(_dep_schemas(True).map(lambda s: ("7", s)), _dep_schemas(False).map(lambda s: ("2020", s)))
_instance = st.one_of(st.dictionaries(_keys, st.one_of(st.integers(0, 2), st.just("s")), max_size=3),
                      st.integers(0, 3), st.floats(0.5, 1.5), st.just("x"), st.none())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=_dep_schema, instances=st.lists(_instance, min_size=1, max_size=8))
def test_lower_dependencies_is_exact(schema, instances):
    draft, schema = schema
    lowered = lower_dependencies(schema)
    a = (jsonschema.Draft7Validator if draft == "7" else jsonschema.Draft202012Validator)(schema)
    b = jsonschema.Draft202012Validator(lowered)
    for inst in instances:
        assert a.is_valid(inst) == b.is_valid(inst), (schema, lowered, inst)


def test_xgrammar_hostname_format_is_refused(vocab):
    """xgrammar 0.2.8's hostname grammar has no 63-byte label limit (JSON-Schema-Test-Suite draft4
    accepted a 90-character label), so that format never goes to xgrammar."""
    from tokenrails.guided.errors import UnsupportedGuideError

    schema = {"type": "string", "format": "hostname"}
    assert any("hostname" in f for f in xgrammar_unenforced(schema))
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.json_schema(schema), vocab, "xgrammar")

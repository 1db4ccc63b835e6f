"""JSON schemas lowered like outlines: valid instances accepted token by token, keywords outlines
would drop are refused, outlines-core errors are typed."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tokenrails import GuideSpec, InvalidGuideError, UnsupportedGuideError, compile_guide
from tokenrails.guided.fsm.schema import OUTLINES_IGNORED, outlines_unenforced

SCHEMAS = [
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                                        "tags": {"type": "array", "items": {"enum": ["a", "b", "ü"]}, "maxItems": 3}},
      "required": ["name", "age"]},
     [{"name": "Zoë", "age": 31, "tags": ["a", "ü"]}, {"name": "", "age": -2}]),
    ({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "when": {"type": "string", "format": "date"},
                                        "ok": {"type": "boolean"}, "x": {"anyOf": [{"type": "null"}, {"type": "number"}]}},
      "required": ["id", "when", "ok", "x"]},
     [{"id": "123e4567-e89b-12d3-a456-426614174000", "when": "2024-02-29", "ok": True, "x": 1.5e3},
      {"id": "00000000-0000-0000-0000-000000000000", "when": "1999-12-31", "ok": False, "x": None}]),
    ({"type": "array", "items": {"type": "object", "properties": {"k": {"const": "v\"q"}}, "required": ["k"]}, "minItems": 1},
     [[{"k": "v\"q"}], [{"k": "v\"q"}, {"k": "v\"q"}]]),
]


def _encode(value, ws):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":") if ws == "compact" else (", ", ": "))


def _accepts(guide, tokenizer, vocab, text):
    m = guide.matcher()
    for t in tokenizer.encode(text, add_special_tokens=False):
        if not m.accept_token(t):
            return False
    return m.accept_token(vocab.eos_ids[0])


@pytest.mark.parametrize("schema,instances", SCHEMAS)
def test_valid_instances_accepted(smollm2_tokenizer, vocab, schema, instances):
    for ws, spec in (("spaced", GuideSpec.json_schema(schema)),
                     ("compact", GuideSpec.json_schema(schema, any_whitespace=False))):
        guide = compile_guide(spec, vocab, "fsm")
        for inst in instances:
            jsonschema.validate(inst, schema)
            assert _accepts(guide, smollm2_tokenizer, vocab, _encode(inst, ws)), (ws, inst)
        # compact guides refuse spaced output and vice versa for multi-key objects
        if ws == "compact" and isinstance(instances[0], dict) and len(instances[0]) > 1:
            assert not _accepts(guide, smollm2_tokenizer, vocab, _encode(instances[0], "spaced"))


def test_invalid_instances_rejected(smollm2_tokenizer, vocab):
    schema = SCHEMAS[0][0]
    guide = compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")
    for bad in ['{"name": "toolongname", "age": 1}', '{"age": 1}', '{"name": "a", "age": 1.5}',
                '{"name": "a", "age": 1, "tags": ["c"]}', '{"name": "a", "age": 1, "tags": ["a","a","a","a"]}']:
        assert not _accepts(guide, smollm2_tokenizer, vocab, bad), bad


def test_whitespace_pattern_option(smollm2_tokenizer, vocab):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    guide = compile_guide(GuideSpec.json_schema(schema, whitespace_pattern=r"[\n ]*"), vocab, "fsm")
    assert _accepts(guide, smollm2_tokenizer, vocab, '{\n  "a" :\n 1\n}')
    default = compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")
    assert not _accepts(default, smollm2_tokenizer, vocab, '{\n  "a" :\n 1\n}')


@pytest.mark.parametrize("keyword", sorted(OUTLINES_IGNORED))
def test_listed_keywords_really_are_dropped_by_outlines(keyword):
    """Ablation proof for OUTLINES_IGNORED: the regex is the same with and without the keyword."""
    from outlines_core.json_schema import build_regex_from_schema

    examples = {
        "minimum": {"type": "integer", "minimum": 3}, "maximum": {"type": "integer", "maximum": 3},
        "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 3},
        "exclusiveMaximum": {"type": "number", "exclusiveMaximum": 3},
        "multipleOf": {"type": "integer", "multipleOf": 3},
        "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        "contains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}},
        "minContains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 2},
        "maxContains": {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "maxContains": 2},
        "minProperties": {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 1},
        "maxProperties": {"type": "object", "maxProperties": 1},
        "patternProperties": {"type": "object", "patternProperties": {"^a": {"type": "integer"}}},
        "propertyNames": {"type": "object", "propertyNames": {"maxLength": 2}},
        "not": {"type": "integer", "not": {"const": 1}},
        "if": {"type": "integer", "if": {"const": 1}, "then": {"const": 1}},
        "dependentRequired": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                              "dependentRequired": {"a": ["b"]}},
        "dependentSchemas": {"type": "object", "properties": {"a": {"type": "integer"}},
                             "dependentSchemas": {"a": {"required": ["b"]}}},
        "dependencies": {"type": "object", "properties": {"a": {"type": "integer"}}, "dependencies": {"a": ["b"]}},
        "unevaluatedProperties": {"type": "object", "properties": {"a": {"type": "integer"}}, "unevaluatedProperties": False},
        "unevaluatedItems": {"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": False},
    }
    schema = examples[keyword]
    stripped = {k: v for k, v in schema.items() if k != keyword and not (keyword == "if" and k == "then")}
    if keyword in ("minContains", "maxContains"):
        stripped.pop("contains", None)
    assert build_regex_from_schema(json.dumps(schema)) == build_regex_from_schema(json.dumps(stripped))
    assert outlines_unenforced(schema)


@pytest.mark.parametrize("keyword,schema", [
    ("maxLength", {"type": "string", "maxLength": 3}), ("minItems", {"type": "array", "minItems": 2}),
    ("enum", {"enum": [1, 2]}), ("pattern", {"type": "string", "pattern": "[a-z]+"}),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
])
def test_enforced_keywords_change_the_regex(keyword, schema):
    from outlines_core.json_schema import build_regex_from_schema

    stripped = {k: v for k, v in schema.items() if k != keyword}
    assert build_regex_from_schema(json.dumps(schema)) != build_regex_from_schema(json.dumps(stripped))
    assert not outlines_unenforced(schema)


def test_dropped_keywords_are_refused_unless_opted_in(vocab):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}, "required": ["n"]}
    with pytest.raises(UnsupportedGuideError) as err:
        compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")
    assert "multipleOf" in str(err.value)
    lenient = GuideSpec("json_schema", GuideSpec.json_schema(schema).payload,
                        (("any_whitespace", True), ("fsm_ignore_unenforced", True)))
    compile_guide(lenient, vocab, "fsm")  # outlines' behaviour on request
    # auto routes the strict request to a backend that enforces it
    assert compile_guide(GuideSpec.json_schema(schema), vocab).backend != "fsm"


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "a.*"},            # '.' can emit a raw quote
    {"type": "string", "pattern": r"\S+"},           # \S includes '"' and '\'
    {"type": "string", "pattern": "[a-z]+", "maxLength": 3},   # outlines drops the pattern
    {"type": "string", "pattern": "[a-z]+", "format": "date"},  # outlines drops the format
])
def test_patterns_outlines_would_mishandle_are_refused(vocab, schema):
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")


def test_outlines_errors_are_typed(vocab):
    with pytest.raises(UnsupportedGuideError):
        compile_guide(GuideSpec.json_schema({"type": "string", "format": "ipv4"}), vocab, "fsm")
    with pytest.raises(InvalidGuideError):
        compile_guide(GuideSpec.json_schema({"$ref": "#/nope"}), vocab, "fsm")
    with pytest.raises(UnsupportedGuideError):  # a lookahead in a pattern reaches our parser
        compile_guide(GuideSpec.json_schema({"type": "string", "pattern": "a(?=b)"}), vocab, "fsm")


def test_safe_pattern_is_enforced(smollm2_tokenizer, vocab):
    guide = compile_guide(GuideSpec.json_schema({"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}), vocab, "fsm")
    assert _accepts(guide, smollm2_tokenizer, vocab, '"AB12"')
    assert not _accepts(guide, smollm2_tokenizer, vocab, '"ab12"')


def test_oneof_and_required_without_properties_are_refused_not_weakened(vocab):
    """outlines lowers oneOf as anyOf and ignores required names it has no property for."""
    from tokenrails import GuideSpec, UnsupportedGuideError, compile_guide

    for schema in (
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        {"type": "object", "required": ["id"], "additionalProperties": {"type": "string"}},
    ):
        with pytest.raises(UnsupportedGuideError):
            compile_guide(GuideSpec.json_schema(schema), vocab, backend="fsm")


def test_contains_an_empty_schema_still_demands_an_item(vocab):
    """``contains: {}`` rejects ``[]``; outlines drops ``contains``, so fsm must refuse it."""
    schema = {"type": "array", "items": {"type": "integer"}, "contains": {}}
    with pytest.raises(UnsupportedGuideError, match="contains"):
        compile_guide(GuideSpec.json_schema(schema), vocab, backend="fsm")


@pytest.mark.parametrize("fmt,local,offset", [
    ("date-time", '"2022-01-01T12:00:00"', '"2022-01-01T12:00:00+02:00"'),
    ("time", '"12:00:00"', '"12:00:00+02:00"'),
])
def test_date_time_formats_outlines_lowers_differently_are_refused(vocab, smollm2_tokenizer, fmt, local, offset):
    """outlines-core makes the zone optional and has no numeric offsets: a time without a zone
    (not RFC 3339) would be accepted and a valid offset refused. fsm refuses the schema unless
    outlines' behaviour is asked for; auto enforces it elsewhere."""
    import json
    import re

    from outlines_core.json_schema import build_regex_from_schema

    schema = {"type": "string", "format": fmt}
    regex = build_regex_from_schema(json.dumps(schema))
    assert re.fullmatch(regex, local) and not re.fullmatch(regex, offset)
    with pytest.raises(UnsupportedGuideError, match=f"format {fmt}"):
        compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")
    lenient = GuideSpec("json_schema", GuideSpec.json_schema(schema).payload,
                        (("any_whitespace", True), ("fsm_ignore_unenforced", True)))
    assert _accepts(compile_guide(lenient, vocab, "fsm"), smollm2_tokenizer, vocab, local)  # outlines' language
    guide = compile_guide(GuideSpec.json_schema(schema), vocab)
    assert guide.backend != "fsm"
    assert _accepts(guide, smollm2_tokenizer, vocab, offset) and not _accepts(guide, smollm2_tokenizer, vocab, local)

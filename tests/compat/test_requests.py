"""normalize_request: every legacy request shape gives the modern spec's key; nothing is dropped."""
from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tokenrails import GuideSpec, InvalidGuideError
from tokenrails.requests import spec_from_request
from tokenrails.compat import normalize_request, parse_request
from tokenrails.requests.schema_transforms import disable_additional_properties
from tokenrails.guided.xgrammar_classes import xgrammar_classes

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
}
TAG_LEGACY = {
    "structures": [{"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}],
    "triggers": ["<f>"],
}
TAG_FORMAT = {
    "type": "structural_tag",
    "format": {"type": "tag", "begin": "<a>", "content": {"type": "regex", "pattern": "[0-9]+"},
               "end": "</a>"},
}


class Person(BaseModel):
    name: str
    age: int | None = None


class LMDeployJsonSchema(BaseModel):  # mirrors lmdeploy.serve.openai.protocol.JsonSchema
    name: str
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = False


class LMDeployResponseFormat(BaseModel):  # mirrors lmdeploy's ResponseFormat
    type: str
    json_schema: LMDeployJsonSchema | None = None
    regex_schema: str | None = None


def body(**fields: Any) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.1,
            **fields}


MODERN = {
    "json": GuideSpec.json_schema(SCHEMA),
    # a request's \d is stock LMDeploy's / vLLM's (xgrammar's) [0-9]: guided/xgrammar_classes.py
    "regex": GuideSpec.regex(xgrammar_classes(r"\d{3}-[a-z]+")),
    "choice": GuideSpec.choice(["yes", "no", "maybe"]),
    "grammar": GuideSpec.grammar('root ::= "a" root | "b"'),
    "json_object": GuideSpec.json_object(),
    "tag_legacy": GuideSpec.structural_tag(TAG_LEGACY),
    "tag_format": GuideSpec.structural_tag(TAG_FORMAT),
}

EQUIVALENT: list[tuple[str, Any]] = [
    # OpenAI response_format (bare, inside a body, as JSON text, openai SDK's pydantic class)
    ("json", {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}),
    ("json", body(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})),
    ("json", json.dumps({"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})),
    ("json", body(response_format={"type": "json_schema", "json_schema": {"schema": json.dumps(SCHEMA)}})),
    ("json_object", {"type": "json_object"}),
    ("json_object", body(response_format={"type": "json_object"})),
    # LMDeploy: pydantic models (alias "schema"), un-aliased dump, bare schema, regex_schema, tags
    ("json", LMDeployResponseFormat(type="json_schema", json_schema=LMDeployJsonSchema(name="p", schema=SCHEMA))),
    ("json", {"type": "json_schema", "json_schema": {"name": "p", "json_schema": SCHEMA}}),
    ("json", {"type": "json_schema", "json_schema": SCHEMA}),
    ("regex", LMDeployResponseFormat(type="regex_schema", regex_schema=r"\d{3}-[a-z]+")),
    ("regex", body(response_format={"type": "regex_schema", "regex_schema": r"\d{3}-[a-z]+"})),
    ("tag_legacy", {"type": "structural_tag", **TAG_LEGACY}),
    ("tag_format", TAG_FORMAT),
    # vLLM legacy top-level guided_* fields (in a body and in an openai-client extra_body)
    ("json", body(guided_json=SCHEMA)),
    ("json", body(guided_json=json.dumps(SCHEMA))),
    ("json", body(extra_body={"guided_json": SCHEMA})),
    ("regex", body(guided_regex=r"\d{3}-[a-z]+")),
    ("choice", body(guided_choice=["yes", "no", "maybe"])),
    ("grammar", body(guided_grammar='root ::= "a" root | "b"')),
    ("json_object", body(guided_json_object=True)),
    ("json", body(guided_json=SCHEMA, guided_decoding_backend="xgrammar")),
    ("json", body(guided_json=SCHEMA, guided_json_object=False, guided_regex=None)),
    ("tag_legacy", body(structural_tag=json.dumps({"type": "structural_tag", **TAG_LEGACY}))),
    # vLLM GuidedDecodingParams-shaped dicts
    ("json", {"json": SCHEMA}),
    ("json", {"json": SCHEMA, "backend": "outlines", "disable_fallback": True}),
    ("regex", {"regex": r"\d{3}-[a-z]+", "json_object": False}),
    ("choice", {"choice": ["yes", "no", "maybe"]}),
    ("grammar", {"grammar": 'root ::= "a" root | "b"'}),
    ("json_object", {"json_object": True}),
    ("json", body(guided_decoding={"json": SCHEMA, "whitespace_pattern": None})),
    # vLLM structured_outputs
    ("json", body(structured_outputs={"json": SCHEMA})),
    ("json", body(structured_outputs={"json": json.dumps(SCHEMA), "disable_any_whitespace": False})),
    ("regex", body(structured_outputs={"regex": r"\d{3}-[a-z]+"})),
    ("choice", body(structured_outputs={"choice": ["yes", "no", "maybe"]})),
    ("grammar", body(structured_outputs={"grammar": 'root ::= "a" root | "b"'})),
    ("json_object", body(structured_outputs={"json_object": True})),
    ("tag_legacy", body(structured_outputs={"structural_tag": json.dumps({"type": "structural_tag", **TAG_LEGACY})})),
    ("tag_format", body(structured_outputs={"structural_tag": json.dumps(TAG_FORMAT)})),
]


@pytest.mark.parametrize("expected,request_obj", EQUIVALENT, ids=[f"{e}-{i}" for i, (e, _) in enumerate(EQUIVALENT)])
def test_legacy_shape_maps_to_modern_key(expected: str, request_obj: Any) -> None:
    spec = normalize_request(request_obj)
    assert spec is not None
    # a backend hint adds routing options (tests/compat/test_backend_routing.py); the language is the same
    assert spec.with_routing(None).key == MODERN[expected].key, (spec, MODERN[expected])
    assert spec_from_request(request_obj).key == spec.key


def test_pydantic_schema_everywhere_is_the_same_spec() -> None:
    want = GuideSpec.json_schema(Person.model_json_schema()).key
    assert normalize_request(body(guided_json=Person)).key == want
    assert normalize_request(body(response_format=Person)).key == want
    assert normalize_request({"type": "json_schema", "json_schema": {"name": "p", "schema": Person}}).key == want


@pytest.mark.parametrize("request_obj", [
    None, {"type": "text"}, body(), body(response_format={"type": "text"}),
    body(response_format=None, guided_json=None), body(guided_decoding_backend="auto"),
])
def test_unconstrained(request_obj: Any) -> None:
    assert normalize_request(request_obj) is None


def test_response_format_text_does_not_conflict_with_a_guided_field() -> None:
    spec = normalize_request(body(response_format={"type": "text"}, guided_regex="a+"))
    assert spec == GuideSpec.regex("a+")


BAD: list[tuple[str, Any]] = [
    ("two guided fields", body(guided_json=SCHEMA, guided_regex="a")),
    ("response_format + guided", body(response_format={"type": "json_object"}, guided_regex="a")),
    ("two in structured_outputs", body(structured_outputs={"json": SCHEMA, "regex": "a"})),
    ("structured_outputs + guided", body(structured_outputs={"regex": "a"}, guided_choice=["a"])),
    ("json_object + choice", {"json_object": True, "choice": ["a"]}),
    ("unknown guided key", body(guided_jsonschema=SCHEMA)),
    ("unknown guided key alone", body(guided_foo=1)),
    ("unknown structured_outputs key", body(structured_outputs={"json": SCHEMA, "strict_mode": True})),
    ("unknown response_format type", {"type": "xml"}),
    ("unhashable response_format type", {"type": []}),
    ("bare JSON schema is not a request", SCHEMA),
    ("unknown response_format key", {"type": "json_object", "strict": True}),
    ("text with payload", {"type": "text", "json_schema": SCHEMA}),
    ("json_schema without schema", {"type": "json_schema", "json_schema": {"name": "x", "strict": True}}),
    ("json_schema unknown wrapper key", {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "extra": 1}}),
    ("empty regex", body(guided_regex="")),
    ("empty choice", body(guided_choice=[])),
    ("empty grammar", body(structured_outputs={"grammar": ""})),
    ("empty json", body(guided_json={})),
    ("empty structured_outputs", body(structured_outputs={})),
    ("empty object", {}),
    ("options only", body(structured_outputs={"disable_any_whitespace": True})),
    ("choice not a list", body(guided_choice="yes")),
    ("whitespace on regex", body(guided_regex="a", guided_whitespace_pattern=" ")),
    ("whitespace on json_object", body(guided_json_object=True, guided_whitespace_pattern=" ")),
    ("whitespace without constraint", body(guided_whitespace_pattern=" ")),
    ("additional props on regex", {"regex": "a", "disable_additional_properties": True}),
    ("no-ws on choice", {"choice": ["a"], "disable_any_whitespace": True}),
    ("pattern + no whitespace", {"json": SCHEMA, "whitespace_pattern": " ", "disable_any_whitespace": True}),
    ("unknown backend", body(guided_json=SCHEMA, guided_decoding_backend="magic")),
    ("unknown backend option", body(guided_json=SCHEMA, guided_decoding_backend="xgrammar:turbo")),
    ("conflicting backends", body(guided_decoding_backend="xgrammar", structured_outputs={"json": SCHEMA, "backend": "guidance"})),
    ("non-bool option", {"json": SCHEMA, "disable_any_whitespace": "yes"}),
    ("bad structural tag", body(structural_tag={"structures": []})),
    ("bad json text", "{not json"),
    ("pydantic class as request", Person),
    ("not a mapping", 42),
]


@pytest.mark.parametrize("request_obj", [b for _, b in BAD], ids=[n for n, _ in BAD])
def test_invalid_requests_raise(request_obj: Any) -> None:
    with pytest.raises(InvalidGuideError):
        normalize_request(request_obj)


# ---- options are applied, never dropped --------------------------------------------------------

def test_whitespace_pattern_reaches_the_spec() -> None:
    for req in (body(guided_json=SCHEMA, guided_whitespace_pattern=r"[\n ]?"),
                body(structured_outputs={"json": SCHEMA, "whitespace_pattern": r"[\n ]?"}),
                {"json": SCHEMA, "whitespace_pattern": r"[\n ]?"}):
        spec = normalize_request(req)
        assert spec.key == GuideSpec.json_schema(SCHEMA, whitespace_pattern=r"[\n ]?").key
        assert spec.option("whitespace_pattern") == r"[\n ]?"


@pytest.mark.parametrize("req", [
    {"json": SCHEMA, "disable_any_whitespace": True},
    body(guided_json=SCHEMA, guided_decoding_backend="xgrammar:disable-any-whitespace"),
    body(structured_outputs={"json": SCHEMA, "backend": "guidance:disable-any-whitespace,no-fallback"}),
])
def test_disable_any_whitespace_reaches_the_spec(req: Any) -> None:
    spec = normalize_request(req)
    assert spec.option("any_whitespace") is False
    assert spec.with_routing(None).key == GuideSpec.json_schema(SCHEMA, any_whitespace=False).key


def test_disable_any_whitespace_on_json_object() -> None:
    spec = normalize_request({"json_object": True, "disable_any_whitespace": True})
    assert spec.key == GuideSpec.json_object(any_whitespace=False).key


NESTED = {
    "type": "object",
    "properties": {
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "open": {"type": "object", "additionalProperties": True},
        "list": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "either": {"anyOf": [{"type": "object", "properties": {"y": {"type": "string"}}}, {"type": "null"}]},
    },
    "$defs": {"Item": {"properties": {"z": {"type": "boolean"}}}},
}


@pytest.mark.parametrize("req", [
    {"json": NESTED, "disable_additional_properties": True},
    body(structured_outputs={"json": NESTED, "disable_additional_properties": True}),
    body(guided_json=NESTED, guided_decoding_backend="guidance:no-additional-properties"),
])
def test_disable_additional_properties_transforms_the_schema(req: Any) -> None:
    schema = normalize_request(req).schema
    assert schema == disable_additional_properties(NESTED)
    ok = {"inner": {"x": 1}, "open": {"anything": 1}, "list": [{"z": True}], "either": {"y": "s"}}
    jsonschema.validate(ok, schema)
    for extra in ({"zzz": 1}, {"inner": {"x": 1, "w": 2}}, {"list": [{"z": True, "w": 2}]},
                  {"either": {"y": "s", "w": 2}}):
        jsonschema.validate(extra, NESTED)  # the original schema allows every one of these
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(extra, schema)
    assert schema["properties"]["open"]["additionalProperties"] is True  # explicit value kept


def test_backend_hints_are_recorded() -> None:
    assert parse_request(body(guided_regex="a", guided_decoding_backend="outlines")).backend == "fsm"
    got = parse_request(body(structured_outputs={"regex": "a", "backend": "xgrammar"}))
    assert (got.backend, got.engine, got.source) == ("xgrammar", "xgrammar", "structured_outputs.regex")
    assert parse_request(body(guided_regex="a", guided_decoding_backend="guidance")).backend == "llguidance"
    assert parse_request(body(guided_regex="a", guided_decoding_backend="auto")).backend is None
    assert parse_request(body(guided_regex="a")).backend is None


def test_backend_hint_changes_only_the_routing_options() -> None:
    specs = {b: normalize_request(body(guided_regex="a+", guided_decoding_backend=b))
             for b in ("outlines", "xgrammar", "guidance", "lm-format-enforcer", "auto", None)}
    assert {s.with_routing(None).key for s in specs.values()} == {GuideSpec.regex("a+").key}
    assert {b: s.option("backend") for b, s in specs.items()} == {
        "outlines": "fsm", "xgrammar": "xgrammar", "guidance": "llguidance",
        "lm-format-enforcer": None, "auto": None, None: None}
    assert specs["auto"].key == specs[None].key == GuideSpec.regex("a+").key


def test_reasoning_key_is_set_aside_not_a_constraint():
    """``tokenrails_reasoning`` (read by the engine adapters) passes any entry point and never
    changes the constraint."""
    from tokenrails import GuideSpec

    for rf in ({"type": "regex", "regex": "[0-9]+"},
               {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}},
               {"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}],
                "triggers": ["<a>"]}):
        with_key = dict(rf, tokenrails_reasoning="off")
        assert spec_from_request({"response_format": with_key}) == spec_from_request({"response_format": rf})
    assert spec_from_request({"response_format": {"type": "text", "tokenrails_reasoning": "auto"}}) is None

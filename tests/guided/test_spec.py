import json

import pytest
from pydantic import BaseModel

from tokenrails import GuideSpec, InvalidGuideError


class Person(BaseModel):
    name: str
    age: int


def test_equal_requests_have_equal_keys():
    a = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    b = GuideSpec.json_schema('{"properties": {"a": {"type": "integer"}}, "type": "object"}')
    assert a.key == b.key and a == b


def test_different_options_change_the_key():
    s = {"type": "string"}
    assert GuideSpec.json_schema(s).key != GuideSpec.json_schema(s, any_whitespace=False).key
    assert GuideSpec.regex("a").key != GuideSpec.choice(["a"]).key


def test_pydantic_model_is_accepted():
    spec = GuideSpec.json_schema(Person)
    assert spec.schema["required"] == ["name", "age"]
    assert spec.key == GuideSpec.json_schema(Person.model_json_schema()).key


def test_choice_keeps_order_and_rejects_empty():
    assert GuideSpec.choice(["b", "a"]).choices == ["b", "a"]
    with pytest.raises(InvalidGuideError):
        GuideSpec.choice([])
    with pytest.raises(InvalidGuideError):
        GuideSpec.choice("abc")


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", 42])
def test_bad_schemas_raise_invalid(bad):
    with pytest.raises(InvalidGuideError):
        GuideSpec.json_schema(bad)


def test_from_request_openai_and_lmdeploy_shapes():
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert GuideSpec.from_request({"type": "text"}) is None
    assert GuideSpec.from_request(None) is None
    a = GuideSpec.from_request({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}})
    assert a.key == GuideSpec.json_schema(schema).key
    assert GuideSpec.from_request({"type": "json_object"}).key == GuideSpec.json_object().key
    r = GuideSpec.from_request({"type": "regex_schema", "regex_schema": "[a-z]+"})
    assert r.key == GuideSpec.regex("[a-z]+").key
    tag = {"type": "structural_tag", "structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}], "triggers": ["<f>"]}
    assert GuideSpec.from_request(tag).kind == "structural_tag"
    assert GuideSpec.from_request(json.dumps({"type": "json_object"})).kind == "json_object"
    with pytest.raises(InvalidGuideError):
        GuideSpec.from_request({"type": "json_schema"})
    with pytest.raises(InvalidGuideError):
        GuideSpec.from_request({"type": "yaml"})


def test_property_order_is_kept_because_it_decides_output_order():
    a = GuideSpec.json_schema({"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}})
    b = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}})
    assert list(a.schema["properties"]) == ["b", "a"]
    assert a.key != b.key
    # a property literally named "properties" keeps its own subschema canonical
    c = GuideSpec.json_schema({"properties": {"properties": {"type": "object", "properties": {"y": {}, "x": {}}}}})
    assert list(c.schema["properties"]["properties"]["properties"]) == ["y", "x"]

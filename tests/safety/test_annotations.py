"""Annotations (``default``, ``examples``, ``description``, ``title``, ``$comment``...) constrain
nothing, so they cost nothing: a deep or large annotation never trips the limits that protect
compilation, on any backend, and the guide still enforces the schema it annotates."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tokenrails import GuideSpec, compile_guide
from tokenrails.guided.errors import GuideLimitError
from tokenrails.guided.registry import available_backends

BACKENDS = ["auto"] + [b for b in ("xgrammar", "llguidance", "fsm") if b in available_backends()]


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


def _annotated(depth: int) -> dict:
    deep = _deep(depth)
    return {"type": "object", "title": "T", "description": "d", "$comment": "c",
            "default": deep, "examples": [deep],
            "properties": {"n": {"type": "integer", "default": deep, "examples": [deep], "title": "N",
                                 "deprecated": False, "readOnly": False},
                           # a property *named* like an annotation keyword is a real property
                           "default": {"type": "string", "description": "x"}},
            "required": ["n", "default"], "additionalProperties": False}


def _ids(vocab, text: str) -> list[int]:
    by_bytes = {b: i for i, b in enumerate(vocab.token_bytes) if i not in vocab.special_ids}
    return [by_bytes[bytes([c])] for c in text.encode()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("depth", [40, 450])  # 80 levels: past max_json_depth; 900: past Python's recursion limit
def test_deep_annotations_do_not_count_against_depth(vocab, backend, depth):
    schema = _annotated(depth)
    guide = compile_guide(GuideSpec.json_schema(schema), vocab, backend)
    good = json.dumps({"n": 7, "default": "v"}, separators=(",", ":"))
    jsonschema.validate(json.loads(good), schema)
    m = guide.matcher()
    assert all(m.accept_token(t) for t in _ids(vocab, good)) and m.is_accepting()
    # the annotated schema is still enforced: a missing required member is refused
    m2 = guide.matcher()
    bad = _ids(vocab, '{"n":7}')
    assert not all(m2.accept_token(t) for t in bad) or not m2.is_accepting()


def test_real_nesting_is_still_limited(vocab):
    schema: dict = {"type": "integer", "default": 1}
    for _ in range(100):
        schema = {"type": "array", "items": schema, "description": "x"}
    with pytest.raises(GuideLimitError) as err:
        compile_guide(GuideSpec.json_schema(schema), vocab, "auto")
    assert err.value.limit == "max_json_depth"


def test_tool_schema_annotations_do_not_count_against_depth(vocab):
    params = _annotated(40)
    tag = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": [
        {"begin": '<tool_call>{"name": "f", "arguments": ', "content": {"type": "json_schema", "json_schema": params},
         "end": "}</tool_call>"}]}}
    spec = GuideSpec.structural_tag(tag)
    assert "default" in json.loads(spec.payload)["format"]["tags"][0]["content"]["json_schema"]["properties"]
    guide = compile_guide(spec, vocab, "auto")
    text = '<tool_call>{"name": "f", "arguments": {"n":7,"default":"v"}}</tool_call>'
    m = guide.matcher()
    assert all(m.accept_token(t) for t in _ids(vocab, text))

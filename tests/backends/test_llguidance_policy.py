"""One JSON-Schema policy across backends: llguidance closes objects/tuples like xgrammar's
strict_mode. Parity is checked token by token in both directions on adversarial outputs, against
``jsonschema`` (plain and with an ``unevaluated*: false`` oracle), and on hand-picked instances."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest

pytest.importorskip("llguidance")

from tokenrails import GuideSpec, compile_guide
from tokenrails.guided.errors import GuideError, UnsupportedGuideError
from tokenrails.guided.schema_walk import resolve_pointer
from tokenrails.guided.schema_semantics import close_schema
from tests.guided.helpers import adversarial_decode, decode_text

V = jsonschema.Draft202012Validator
INT = {"type": "integer", "minimum": 0, "maximum": 99}
WORD = {"type": "string", "pattern": "^[a-z]{1,5}$"}

# Schemas both backends compile (xgrammar refuses multi-part allOf etc.; those are below).
PARITY = {
    "flat": {"type": "object", "properties": {"a": INT, "b": WORD}, "required": ["a"]},
    "nested": {"type": "object", "properties": {"o": {"type": "object", "properties": {"x": INT, "y": {
        "type": "object", "properties": {"z": {"type": "boolean"}}}}}}, "required": ["o"]},
    "array_of_objects": {"type": "array", "items": {"type": "object", "properties": {"k": WORD}},
                         "maxItems": 3},
    "defs_ref": {"$defs": {"P": {"type": "object", "properties": {"n": INT, "w": WORD}}},
                 "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}, "q": {"$ref": "#/$defs/P"}}},
    "definitions_ref": {"definitions": {"P": {"type": "object", "properties": {"n": INT}}},
                        "type": "array", "items": {"$ref": "#/definitions/P"}, "maxItems": 2},
    "recursive": {"$defs": {"N": {"type": "object", "properties": {
        "v": INT, "next": {"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "$ref": "#/$defs/N"},
    "anyof_objects": {"anyOf": [{"type": "object", "properties": {"cat": WORD}, "required": ["cat"]},
                                {"type": "object", "properties": {"dog": INT}, "required": ["dog"]}]},
    "oneof_by_type": {"oneOf": [{"type": "object", "properties": {"s": WORD}}, {"type": "integer"}]},
    "prefix_only": {"type": "array", "prefixItems": [INT, WORD]},
    "prefix_and_items": {"type": "array", "prefixItems": [INT], "items": {"type": "boolean"},
                         "maxItems": 4},
    "prefix_items_false": {"type": "array", "prefixItems": [INT], "items": False},
    "object_in_prefix": {"type": "object", "properties": {"t": {"type": "array", "prefixItems": [
        {"type": "object", "properties": {"u": INT}}, INT]}}},
    "pattern_props": {"type": "object", "patternProperties": {"^x[0-9]$": INT}},
    "props_and_pattern": {"type": "object", "properties": {"a": INT},
                          "patternProperties": {"^x[0-9]$": {"type": "boolean"}}},
    "explicit_additional_schema": {"type": "object", "properties": {"a": INT},
                                   "additionalProperties": {"type": "object", "properties": {"n": INT}}},
    "nullable_object": {"type": ["object", "null"], "properties": {"a": INT}},
    "empty_properties": {"type": "object", "properties": {}},
    "explicit_false_nested_open": {"type": "object", "properties": {"o": {"type": "object",
                                   "properties": {"i": INT}}}, "additionalProperties": False},
}

# Only llguidance compiles these (xgrammar refuses several allOf parts, sibling keywords...).
LLG_ONLY = {
    "allof_two_parts": {"allOf": [{"type": "object", "properties": {"a": INT}, "required": ["a"]},
                                  {"properties": {"b": WORD}}]},
    "allof_ref_base": {"$defs": {"Base": {"type": "object", "properties": {"id": INT}, "required": ["id"]}},
                       "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"tag": WORD}}]},
    "discriminated": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"],
                      "anyOf": [{"properties": {"kind": {"const": "a"}, "x": INT}},
                                {"properties": {"kind": {"const": "b"}, "y": WORD}}]},
    "allof_nested_in_property": {"type": "object", "properties": {"p": {"allOf": [
        {"type": "object", "properties": {"m": INT}}, {"properties": {"n": INT}}]}}},
    "dependent_required": {"type": "object", "properties": {"a": INT, "b": INT},
                           "dependentRequired": {"a": ["b"]}},
    "allof_prefix": {"allOf": [{"type": "array", "prefixItems": [INT]}, {"prefixItems": [INT, INT]}]},
}


def _unevaluated_oracle(schema):
    """Independent encoding of the policy for ``jsonschema``: ``unevaluatedProperties: false`` /
    ``unevaluatedItems: false`` where the instance is evaluated as a whole (value positions, and
    anyOf branches of a schema that declares nothing itself)."""
    def inline(node):  # allOf parts that are $refs: copies of the target (open there, closed in $defs)
        if isinstance(node, dict):
            for p in node.get("allOf", []):
                if isinstance(p, dict) and isinstance(p.get("$ref"), str):
                    target = copy.deepcopy(resolve_pointer(schema, p.pop("$ref")))
                    target.pop("$defs", None)
                    p.update(target)
            for v in node.values():
                inline(v)
        elif isinstance(node, list):
            for v in node:
                inline(v)

    root = copy.deepcopy(schema)
    inline(root)

    def declares(node, seen=()):
        if not isinstance(node, dict):
            return False
        if "properties" in node or "patternProperties" in node:
            return True
        parts = list(node.get("allOf", []))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            parts.append(resolve_pointer(schema, ref))
            seen = (*seen, ref)
        return any(declares(p, seen) for p in parts)

    def prefix(node):
        parts = [node] + [p for p in node.get("allOf", []) if isinstance(p, dict)]
        has = any("prefixItems" in p for p in parts)
        return has and not any(k in p for p in parts for k in ("items", "unevaluatedItems"))

    def walk(node, value=True):
        if not isinstance(node, dict):
            return
        explicit = "additionalProperties" in node or "unevaluatedProperties" in node or any(
            isinstance(p, dict) and "additionalProperties" in p for p in node.get("allOf", []))
        decl = declares(node)
        if value and decl and not explicit and not (isinstance(node.get("$ref"), str) and len(node) == 1):
            node["unevaluatedProperties"] = False
        if value and prefix(node):
            node["unevaluatedItems"] = False
        for key in ("properties", "patternProperties", "$defs", "definitions"):
            for sub in (node.get(key) or {}).values():
                walk(sub)
        for key in ("items", "additionalProperties", "contains"):
            walk(node.get(key))
        for sub in node.get("prefixItems", []):
            walk(sub)
        for sub in node.get("allOf", []):
            walk(sub, value=False)
        for key in ("anyOf", "oneOf"):
            for sub in node.get(key, []):
                walk(sub, value=not decl)

    walk(root)
    return root


def _guide(backend, schema, vocab):
    return compile_guide(GuideSpec.json_schema(schema, any_whitespace=False), vocab, backend)


def _accepts_ids(guide, ids, eos):
    m = guide.matcher()
    return all(m.accept_token(t) for t in ids) and m.accept_token(eos)


def _accepts_text(guide, tokenizer, text, eos):
    return _accepts_ids(guide, tokenizer.encode(text, add_special_tokens=False), eos)


def _check_outputs(source, other, schema, vocab, seeds=(0, 1, 2, 3)):
    oracle = V(_unevaluated_oracle(schema))
    plain = V(schema)
    ended_any = False
    for seed in seeds:
        ids, ended = adversarial_decode(source.matcher(), vocab, seed=seed, max_steps=160)
        if not ended:
            continue
        ended_any = True
        text = decode_text(vocab, ids)
        value = json.loads(text)
        plain.validate(value)
        oracle.validate(value)
        if other is not None:
            assert _accepts_ids(other, ids, vocab.eos_ids[0]), f"{other.backend} refuses {text!r}"
    assert ended_any, "no seed produced a complete output"


@pytest.mark.parametrize("name", sorted(PARITY))
def test_adversarial_outputs_are_accepted_by_the_other_backend(vocab, name):
    schema = PARITY[name]
    llg = _guide("llguidance", schema, vocab)
    xgr = _guide("xgrammar", schema, vocab)
    _check_outputs(llg, xgr, schema, vocab)
    _check_outputs(xgr, llg, schema, vocab)


@pytest.mark.parametrize("name", sorted(LLG_ONLY))
def test_merged_schemas_are_closed_and_satisfiable(vocab, name):
    """allOf/anyOf parts are closed at the merged parent: outputs exist and obey the oracle."""
    _check_outputs(_guide("llguidance", LLG_ONLY[name], vocab), None, LLG_ONLY[name], vocab)


# (schema, accepted instances, refused instances) — both backends when both compile.
INSTANCES = [
    (PARITY["flat"], ['{"a": 1}', '{"a": 1, "b": "x"}'], ['{"a": 1, "c": 2}', '{"a": 1, "b": "x", "z": 0}']),
    (PARITY["nested"], ['{"o": {"x": 1, "y": {"z": true}}}'], ['{"o": {"x": 1, "w": 2}}', '{"o": {"y": {"z": true, "q": 1}}}']),
    (PARITY["prefix_only"], ['[1, "a"]', '[1]', '[]'], ['[1, "a", 2]']),
    (PARITY["props_and_pattern"], ['{"a": 1, "x1": true}'], ['{"a": 1, "y": true}']),
    (PARITY["empty_properties"], ['{}'], ['{"a": 1}']),
    (PARITY["explicit_additional_schema"], ['{"a": 1, "k": {"n": 2}}'], ['{"a": 1, "k": {"n": 2, "m": 3}}']),
    ({"type": "object"}, ['{"free": {"x": [1]}}'], []),  # no declared members: open, as xgrammar
    ({"type": "object", "properties": {"meta": {"type": "object"}}}, ['{"meta": {"any": 1}}'], ['{"meta": {}, "x": 1}']),
    ({"type": "object", "properties": {"a": INT}, "additionalProperties": True}, ['{"a": 1, "b": 2}'], []),
    (LLG_ONLY["allof_two_parts"], ['{"a": 1, "b": "x"}', '{"a": 1}'], ['{"a": 1, "b": "x", "c": 1}', '{"b": "x"}']),
    (LLG_ONLY["allof_ref_base"], ['{"id": 1, "tag": "x"}'], ['{"id": 1, "tag": "x", "z": 1}', '{"tag": "x"}']),
    (LLG_ONLY["discriminated"], ['{"kind": "a", "x": 1}', '{"kind": "b", "y": "q"}'],
     ['{"kind": "a", "y": "q"}', '{"kind": "a", "x": 1, "y": "q"}', '{"kind": "b", "z": 1}']),
    (LLG_ONLY["allof_prefix"], ['[1, 2]', '[1]'], ['[1, 2, 3]']),
    (LLG_ONLY["dependent_required"], ['{"a": 1, "b": 2}', '{"b": 2}'], ['{"a": 1}', '{"a": 1, "b": 2, "c": 3}']),
]


@pytest.mark.parametrize("schema,good,bad", INSTANCES, ids=[f"inst{i}" for i in range(len(INSTANCES))])
def test_instances_same_verdict_on_both_backends(vocab, smollm2_tokenizer, schema, good, bad):
    eos = vocab.eos_ids[0]
    guides = [_guide("llguidance", schema, vocab)]
    try:
        guides.append(_guide("xgrammar", schema, vocab))
    except GuideError:
        pass  # xgrammar refuses the schema (multi-part allOf...): nothing to compare
    oracle = V(_unevaluated_oracle(schema))
    for text in good:
        assert oracle.is_valid(json.loads(text))
        for g in guides:
            assert _accepts_text(g, smollm2_tokenizer, text, eos), (g.backend, text)
    for text in bad:
        assert not oracle.is_valid(json.loads(text))
        for g in guides:
            assert not _accepts_text(g, smollm2_tokenizer, text, eos), (g.backend, text)


# ---- close_schema unit behaviour -------------------------------------------------------
def test_values_and_explicit_decisions_are_left_alone():
    schema = {"type": "object", "properties": {
        "e": {"enum": [{"properties": {"q": 1}}]}, "c": {"const": {"properties": {}}},
        "d": {"default": {"properties": {}}, "type": "object", "properties": {"i": INT}},
        "open": {"type": "object", "properties": {"i": INT}, "additionalProperties": True},
        "n": {"not": {"properties": {"z": INT}}}}}
    out = close_schema(schema)
    assert out["additionalProperties"] is False
    p = out["properties"]
    assert p["e"] == schema["properties"]["e"] and p["c"] == schema["properties"]["c"]
    assert p["d"]["default"] == {"properties": {}} and p["d"]["additionalProperties"] is False
    assert p["open"]["additionalProperties"] is True
    assert p["n"] == schema["properties"]["n"]  # inside `not`, closing would change the meaning


def test_closing_is_idempotent_and_input_is_not_mutated():
    for schema in [*PARITY.values(), *LLG_ONLY.values()]:
        before = json.dumps(schema, sort_keys=True)
        once = close_schema(schema)
        assert json.dumps(schema, sort_keys=True) == before
        assert close_schema(once) == once


def test_recursion_through_a_ref_with_siblings_is_refused_not_looped():
    schema = {"$defs": {"A": {"type": "object", "properties": {"c": {"$ref": "#/$defs/A", "properties": {"x": INT}}}}},
              "$ref": "#/$defs/A"}
    with pytest.raises(UnsupportedGuideError):
        close_schema(schema)


def test_recursive_alias_refs_compile(vocab, smollm2_tokenizer):
    g = _guide("llguidance", PARITY["recursive"], vocab)
    eos = vocab.eos_ids[0]
    assert _accepts_text(g, smollm2_tokenizer, '{"v": 1, "next": {"v": 2, "next": null}}', eos)
    assert not _accepts_text(g, smollm2_tokenizer, '{"v": 1, "next": {"v": 2, "next": null, "w": 0}}', eos)


# ---- strict=False: JSON Schema's open objects on both backends ------------------------------
# Schemas whose open members sit where a worst-token sampler still ends (top-level objects,
# tuples); the typeless ones check that implied types apply in both modes.
OPEN_PARITY = {
    "flat": PARITY["flat"],
    "prefix_only": PARITY["prefix_only"],
    "typeless_flat": {"properties": {"a": INT, "b": WORD}, "required": ["a"]},
}


@pytest.mark.parametrize("name", sorted(OPEN_PARITY))
def test_non_strict_outputs_are_accepted_by_the_other_backend(vocab, name):
    from tokenrails.guided.schema_semantics import infer_types

    schema = OPEN_PARITY[name]
    spec = GuideSpec.json_schema(schema, any_whitespace=False, strict=False)
    llg, xgr = compile_guide(spec, vocab, "llguidance"), compile_guide(spec, vocab, "xgrammar")
    typed = V(infer_types(schema))
    for source, other in ((llg, xgr), (xgr, llg)):
        ended = 0
        for seed in range(4):
            ids, done = adversarial_decode(source.matcher(), vocab, seed=seed, max_steps=160)
            if done:
                ended += 1
                typed.validate(json.loads(decode_text(vocab, ids)))
                assert _accepts_ids(other, ids, vocab.eos_ids[0]), (source.backend, decode_text(vocab, ids))
        assert ended, source.backend


@pytest.mark.parametrize("schema,good,bad", INSTANCES[:6], ids=[f"inst{i}" for i in range(6)])
def test_non_strict_accepts_every_jsonschema_instance(vocab, smollm2_tokenizer, schema, good, bad):
    """What strict mode refuses only for being unlisted is valid JSON Schema: strict=False admits it."""
    eos = vocab.eos_ids[0]
    spec = GuideSpec.json_schema(schema, any_whitespace=False, strict=False)
    for backend in ("llguidance", "xgrammar"):
        g = compile_guide(spec, vocab, backend)
        for text in good + bad:
            assert _accepts_text(g, smollm2_tokenizer, text, eos) == V(schema).is_valid(json.loads(text)), (
                backend, text)

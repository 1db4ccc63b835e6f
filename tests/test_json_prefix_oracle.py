"""harness/json_prefix_oracle.py: the engine bench's judge of length-capped JSON outputs.

Soundness (a valid prefix is never called invalid) under hypothesis: documents drawn for a set of
embedded schemas, kept only when jsonschema accepts them, serialised with varied whitespace, key
order and escaping; every prefix of every such document must not be ``invalid``, and every
``valid`` verdict carries a completion that jsonschema (with Python's json) accepts. Refutation:
the escapes seen from stock LMDeploy (JSONSchemaBench's Synthesized ``allOf`` + ``enum`` schemas,
where stock writes ``{"allOf": [...`` to the cap) and one case per rule.
"""
from __future__ import annotations

import json
import math

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.json_prefix_oracle import INVALID, UNDECIDED, VALID, PrefixOracle, loads_strict, parse_prefix, \
    PrefixError

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
                         "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True,
                                  "maxItems": 3}}}
TREE = {"$defs": {"node": {"type": "object", "required": ["value"], "additionalProperties": False,
                           "properties": {"value": {"type": "number", "exclusiveMaximum": 100},
                                          "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
SCHEMAS = {
    "person": PERSON,
    "tree": TREE,
    "any_of": {"anyOf": [{"type": "string", "enum": ["red", "green"]}, {"type": "integer", "maximum": -1},
                         {"type": "array", "items": {"type": "boolean"}, "minItems": 1}]},
    "one_of_not": {"oneOf": [{"type": "integer", "multipleOf": 3}, {"type": "integer", "multipleOf": 5}],
                   "not": {"const": 0}},
    "if_then": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                "required": ["kind"],
                "if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]},
                "else": {"properties": {"n": False}}},
    "tuple_draft7": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                     "items": [{"type": "string"}, {"type": "number"}], "additionalItems": False},
    "prefix_items": {"type": "array", "prefixItems": [{"const": "x"}, {"type": "null"}], "items": {"type": "string"}},
    "pattern_props": {"type": "object", "patternProperties": {"^n_": {"type": "integer"}},
                      "additionalProperties": {"type": "string"}, "maxProperties": 3},
    "synthesized_enum": {"allOf": [{"enum": [{"foo": 1, "vroom": 2}]},
                                   {"not": {"not": {"additionalProperties": False, "patternProperties": {"^v": {}},
                                                    "properties": {"bar": {}, "foo": {}}}}}]},
    "unicode": {"type": "object", "properties": {"árvíz": {"type": "string", "minLength": 2}},
                "required": ["árvíz"]},
    "max_props_required": {"type": "object", "required": ["a", "b"], "maxProperties": 2},
    "dependencies": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                     "dependentSchemas": {"a": {"required": ["b"]}}, "dependentRequired": {"b": ["a"]},
                     "propertyNames": {"maxLength": 3}},
    "draft4_numbers": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "array",
                       "items": {"type": "number", "maximum": 0, "exclusiveMaximum": True, "minimum": -2.5}},
    "negative_numbers": {"type": "array", "items": {"type": "number", "minimum": -2.5, "exclusiveMaximum": 0},
                         "contains": {"type": "integer"}},
    "ref_siblings_draft7": {"$schema": "http://json-schema.org/draft-07/schema#",
                            "definitions": {"s": {"type": "string"}}, "$ref": "#/definitions/s", "type": "integer"},
}


def _resolve(schema, root):
    """Follow local $refs (the embedded schemas use only ``#/...``)."""
    while isinstance(schema, dict) and "$ref" in schema and isinstance(schema["$ref"], str):
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            if part:
                target = target[part]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        if root.get("$schema", "").endswith("draft-07/schema#"):
            rest = {}  # draft 7: $ref hides its siblings
        schema = {**target, **{k: v for k, v in rest.items() if k not in target}}
    return schema


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000),
                  st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), st.text(max_size=8))
_ANY = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                        max_size=3), max_leaves=6)


def values_for(schema, root, depth=0):
    """A strategy aimed at ``schema`` (jsonschema filters its draws: it needs to be good, not exact)."""
    schema = _resolve(schema, root)
    if schema is True or schema == {} or depth > 3:
        return _ANY if depth <= 3 else _LEAF
    if schema is False:
        return st.nothing()
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for kw in ("anyOf", "oneOf"):
        if kw in schema:
            rest = {k: v for k, v in schema.items() if k not in (kw, "not")}
            return st.one_of([values_for({**rest, **b} if isinstance(b, dict) else b, root, depth)
                              for b in schema[kw]])
    if "allOf" in schema:
        return values_for(schema["allOf"][0], root, depth)
    t = schema.get("type")
    if isinstance(t, list):
        return st.one_of([values_for({**schema, "type": x}, root, depth) for x in t])
    if t == "object" or "properties" in schema or "patternProperties" in schema:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        fixed = {k: values_for(props.get(k, True), root, depth + 1) for k in required}
        optional = {k: values_for(v, root, depth + 1) for k, v in props.items() if k not in required}
        extra = st.just({})
        for pat, sub in schema.get("patternProperties", {}).items():
            extra = st.dictionaries(st.from_regex(pat, fullmatch=False).filter(lambda s: len(s) < 8),
                                    values_for(sub, root, depth + 1), max_size=2)
        return st.builds(lambda a, b, c: {**c, **a, **b}, st.fixed_dictionaries(fixed, optional=optional), st.just({}),
                         extra)
    if t == "array" or "items" in schema or "prefixItems" in schema:
        items = schema.get("items", True)
        if isinstance(items, list):
            return st.tuples(*[values_for(s, root, depth + 1) for s in items]).map(list)
        head = [values_for(s, root, depth + 1) for s in schema.get("prefixItems", [])]
        rest = st.lists(values_for(items, root, depth + 1), min_size=schema.get("minItems", 0), max_size=3)
        return st.builds(lambda h, r: list(h) + r, st.tuples(*head), rest) if head else rest
    if t == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"])
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 10))
    if t in ("integer", "number"):
        bound = lambda *ks: next((schema[k] for k in ks if type(schema.get(k)) in (int, float)), None)  # noqa: E731
        lo, hi = bound("minimum", "exclusiveMinimum"), bound("maximum", "exclusiveMaximum")
        lo, hi = (-200 if lo is None else lo), (200 if hi is None else hi)
        ints = st.integers(math.ceil(lo), math.floor(hi)) if math.ceil(lo) <= math.floor(hi) else st.nothing()
        return ints if t == "integer" else ints | st.floats(lo, hi, allow_nan=False)
    if t == "boolean":
        return st.booleans()
    if t == "null":
        return st.none()
    return _ANY


_DUMPS = st.fixed_dictionaries({"indent": st.sampled_from([None, 0, 2, "\t"]),
                                "ensure_ascii": st.booleans(), "sort_keys": st.booleans(),
                                "separators": st.sampled_from([None, (",", ":"), (", ", ": "), (" ,", " : ")])})


def _documents(name):
    schema = SCHEMAS[name]
    return st.tuples(values_for(schema, schema), _DUMPS, st.sampled_from(["", " ", "\n"]))


_ORACLES = {name: PrefixOracle(schema) for name, schema in SCHEMAS.items()}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_every_prefix_of_a_valid_document_is_not_invalid(name, data):
    schema = SCHEMAS[name]
    value, dumps, lead = data.draw(_documents(name))
    assume(jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
           .is_valid(value))
    text = lead + json.dumps(value, **dumps)
    oracle = _ORACLES[name]
    decided = 0
    for cut in range(len(text) + 1):
        verdict = oracle.judge(text[:cut])
        assert verdict.status != INVALID, (text[:cut], verdict.reason)
        if verdict.status == VALID:
            decided += 1
            document = text[:cut] + verdict.witness
            assert jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema) \
                .is_valid(json.loads(document)), document
    assert oracle.judge(text).status == VALID  # the whole document: the empty completion
    assert decided >= 1


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_valid_verdicts_on_mutated_text_carry_a_real_witness(name, data):
    """Adversarial texts (a valid document with a character changed, cut anywhere): whatever the
    verdict, ``valid`` always comes with a completion jsonschema accepts."""
    schema = SCHEMAS[name]
    value, dumps, _ = data.draw(_documents(name))
    text = json.dumps(value, **dumps)
    pos = data.draw(st.integers(0, len(text)))
    char = data.draw(st.sampled_from(list('{}[]",:0-9eE.+ tfnax\\')))
    text = text[:pos] + char + text[pos + 1:]
    cut = data.draw(st.integers(0, len(text)))
    verdict = _ORACLES[name].judge(text[:cut])
    if verdict.status == VALID:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
        assert validator.is_valid(loads_strict(text[:cut] + verdict.witness))


SYNTH_ENUM_1 = {"allOf": [{"enum": [1]}, {"not": False}]}
SYNTH_ENUM_FOO = {"allOf": [{"enum": ["foo"]}, {"not": False}]}


@pytest.mark.parametrize("schema", [SYNTH_ENUM_1, SYNTH_ENUM_FOO])
def test_the_known_stock_escape_is_invalid(schema):
    """Stock LMDeploy leaves these unenforced and writes ``{"allOf": [...`` to the cap (its own
    xgrammar accepts that prefix); no object equals 1 or "foo"."""
    oracle = PrefixOracle(schema)
    for text in ('{\n  "allOf": [\n    {\n      "enum": [', "{", '{"'):
        assert oracle.judge(text).status == INVALID, text
    assert oracle.judge("").status == VALID
    assert oracle.judge('"fo' if schema is SYNTH_ENUM_FOO else "1").status == VALID
    assert oracle.judge('"fox' if schema is SYNTH_ENUM_FOO else "2").status == INVALID


@pytest.mark.parametrize("name,text", [
    ("person", '{"name": 3'),                             # finished value, wrong type
    ("person", '{"name": "abcdefghijklm'),                # maxLength exceeded already
    ("person", '{"nick'),                                 # additionalProperties: false, no such name
    ("person", '{"name": "a", "age": "'),                 # an open string where an integer is required
    ("person", '{"name": "a", "age": 1.5,'),              # a finished non-integer
    ("person", '{"email": "Bob'),                         # anchored pattern, open string
    ("person", '{"tags": ["a", "a"'),                     # uniqueItems over finished items
    ("person", '{"tags": ["a", "b", "c", '),              # maxItems
    ("person", '{"tags": ["d'),                           # enum of an open string
    ("person", '{"name": "a", "name'),                    # a repeated member name
    ("person", "[1, 2"),                                  # type
    ("tree", '{"value": 1, "children": [{"value": "'),    # through $ref, recursively
    ("tree", '{"children": [{"value": 100}'),             # exclusiveMaximum on a finished number
    ("any_of", '"blu'),                                   # every anyOf branch refuted
    ("any_of", "[]"),                                     # finished, minItems
    ("any_of", "5"),                                      # a number >= 0 where only maximum -1 admits numbers
    ("one_of_not", "0 "),                                 # finished (by the space): not const 0
    ("one_of_not", '"'),
    ("if_then", '{"kind": "b", "n": '),                   # else: n is false
    ("tuple_draft7", '["a", 1, '),                        # additionalItems false
    ("prefix_items", '["y'),                              # const "x" of item 0
    ("pattern_props", '{"n_1": "x"'),                     # patternProperties: integer
    ("pattern_props", '{"a": 1'),                         # additionalProperties: string
    ("pattern_props", '{"a": "", "b": "", "c": "", '),    # maxProperties 3
    ("synthesized_enum", '{"foo": 1, "bar'),              # enum: no such key
    ("max_props_required", '{"a": 1, "c'),                # "c" is a third member: maxProperties 2
    ("ref_siblings_draft7", "1"),                         # draft 7: $ref wins, the sibling type is ignored
    ("person", '{"name": "a"}x'),                         # not a JSON prefix
    ("person", '{"name": NaN'),                           # not JSON
    ("person", '{"name": "a\x01'),                        # raw control character
])
def test_refuted(name, text):
    verdict = _ORACLES[name].judge(text)
    assert verdict.status == INVALID, verdict


@pytest.mark.parametrize("name,text", [
    ("person", '{"name": "Mike", "age": 2'),
    ("person", '{"name": "Mike", "ag'),
    ("person", '{"email": "bob@'),
    ("person", '{"tags": ["b", '),
    ("person", '{"name": "a\\u00'),                       # an escape cut in the middle
    ("person", '{"name": "a\\'),
    ("tree", '{"value": 99.9, "children": [{"value": -1e'),
    ("if_then", '{"kind": "a"'),                          # then: n required, added by the completion
    ("if_then", '{"kind": "b"'),
    ("tuple_draft7", '["a", 1'),
    ("prefix_items", '["x", null, "'),
    ("pattern_props", '{"n_1": 3, "z": "'),
    ("synthesized_enum", '{"vroom": 2, "f'),
    ("unicode", '{"árvíz": "é'),
    ("ref_siblings_draft7", '"a'),
    ("any_of", "-"),
    ("person", '{"name": "a", "age": -1'),                # -1e-400 is -0.0 >= 0: json underflows
    ("any_of", "[tr"),
    ("person", "  "),
    ("max_props_required", '{"a": 1, "'),               # the open name may be the missing required "b"
    ("max_props_required", '{"a": 1, '),
    ("max_props_required", '{"'),
    ("person", '{"name": "a\ufffd'),                      # a character cut by the token cap
])
def test_decided_valid(name, text):
    verdict = _ORACLES[name].judge(text)
    assert verdict.status == VALID, verdict
    assert _ORACLES[name].accepts(text.rstrip("\ufffd") + verdict.witness)


def test_undecided_is_reported_not_passed():
    """An open number that only a positive multiple of 7919 beginning with 1 completes (15838): the refuter
    cannot rule it out and no candidate completion reaches it, so undecided, with a reason."""
    oracle = PrefixOracle({"type": "object", "required": ["k"],
                           "properties": {"k": {"type": "integer", "multipleOf": 7919, "minimum": 1}}})
    verdict = oracle.judge('{"k": 1')
    assert verdict.status == UNDECIDED and verdict.witness is None and "no completion" in verdict.reason
    assert oracle.judge('{"k": 15838').status == VALID
    assert oracle.judge('{"k": 15838,').status == VALID
    assert oracle.judge('{"k": 15839 ').status == INVALID


def test_pattern_completions_reach_anchored_patterns():
    oracle = PrefixOracle({"type": "string", "pattern": "^[a-z]{3}-[0-9]{4}$"})
    assert oracle.judge('"abc').status == VALID
    assert oracle.judge('"abc1').status == INVALID


def test_parse_prefix_shapes():
    assert parse_prefix('{"a": [1, {"b": "c').__class__.__name__ == "PObject"
    with pytest.raises(PrefixError):
        parse_prefix("[1,]")
    with pytest.raises(PrefixError):
        parse_prefix("01")
    with pytest.raises(ValueError):
        loads_strict('{"a": 1, "a": 2}')


def test_engine_bench_validator_refutes_the_stock_escape_xgrammar_passes(smollm2_tokenizer):
    """bench/lmdeploy_engine.py's Validator: the capped ``{"allOf": [`` of stock LMDeploy on the
    Synthesized schema is invalid (main's xgrammar-only check passed it), the xgrammar cross-check
    is recorded and the disagreement listed; an undecided prefix is counted apart, not valid."""
    from types import SimpleNamespace

    from bench.lmdeploy_engine import CHECK_ORACLE, CHECK_XGRAMMAR, Row, Tally, Validator

    validator = Validator(smollm2_tokenizer, len(smollm2_tokenizer))
    tally = Tally()
    for schema, text in ((SYNTH_ENUM_1, '{\n  "allOf": [\n    {'), (SYNTH_ENUM_FOO, '{\n  "allOf": [')):
        row = Row("maskbench", "Synthesized", "p", {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
                  schema=schema)
        out = SimpleNamespace(finish_reason="length", text=text,
                              token_ids=smollm2_tokenizer.encode(text, add_special_tokens=False))
        judgement = validator.check(row, out)
        assert judgement.status == "invalid"
        assert dict(judgement.checks) == {CHECK_ORACLE: "invalid", CHECK_XGRAMMAR: "valid"}
        assert judgement.disagreement
        tally.add(row, judgement)
    hard = {"type": "object", "required": ["k"], "properties": {"k": {"type": "integer", "multipleOf": 7919,
                                                                        "minimum": 1}}}
    row = Row("maskbench", "hard", "p", {"type": "json_schema", "json_schema": {"name": "s", "schema": hard}},
              schema=hard)
    text = '{"k": 1'
    out = SimpleNamespace(finish_reason="length", text=text,
                          token_ids=smollm2_tokenizer.encode(text, add_special_tokens=False))
    tally.add(row, validator.check(row, out))
    assert len(tally.invalid) == 2 and len(tally.undecided) == 1
    assert tally.checks[CHECK_ORACLE] == {"invalid": 2, "undecided": 1}


def test_engine_bench_step_timer_counts_emitted_tokens_and_row_steps():
    """The engine bench's step chain: a decode step's time runs to the next decode step's start (a
    prefill breaks the chain: the step before it is not counted, nor the last); tokens are what the
    step emitted (several per row with drafts), so forward passes per output token = row-steps / tokens."""
    from bench.lmdeploy_engine import StepTimer

    timer = StepTimer()
    # [t, decoding, tokens emitted, forward s, logits s, process CPU s, rows, cyclic GC s]
    timer.starts = [[0.0, False, 0, 0.5, 0.0, 0.0, 0, 0.0], [1.0, True, 2, 0.1, 0.01, 0.1, 2, 0.0],
                    [1.2, True, 7, 0.1, 0.02, 0.3, 2, 0.5], [1.5, False, 0, 0.4, 0.0, 0.5, 0, 0.0],
                    [2.0, True, 1, 0.1, 0.01, 0.6, 1, 0.004], [2.1, True, 1, 0.1, 0.01, 0.7, 1, 0.0]]
    secs, tokens, steps, fwd, logits, cpu, rows, gcs = timer.decode_steps()
    assert (steps, tokens, rows) == (2, 3, 3)
    assert abs(gcs - 0.004) < 1e-9  # only the counted steps' GC pauses
    assert abs(secs - 0.3) < 1e-9 and abs(fwd - 0.2) < 1e-9 and abs(logits - 0.02) < 1e-9 and abs(cpu - 0.3) < 1e-9

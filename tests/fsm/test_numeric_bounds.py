"""Numeric bounds lowered by the fsm backend as digit ranges: exact against jsonschema.

Two directions per random schema (hypothesis): every string the lowered DFA accepts (random walks
of the byte DFA) parses and validates, and values drawn inside the bounds, spelled as JSON writes
them, are accepted. Bounds the lowering cannot write exactly stay refused with their reason."""
from __future__ import annotations

import json
import random
from decimal import Decimal

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideSpec, UnsupportedGuideError, compile_guide
from tokenrails.guided.budget import budget_spec, budget_table
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.fsm.dfa import DEAD, START
from tokenrails.guided.fsm.schema import schema_to_regex
from tokenrails.guided.limits import DEFAULT_LIMITS
from tokenrails.testing import walk

ALPHABET = b"0123456789-.eE+nul"


def _dfa(schema: dict):
    return compile_regex(schema_to_regex(GuideSpec.json_schema(schema, any_whitespace=False)), DEFAULT_LIMITS)


def _walks(dfa, rng: random.Random, n: int) -> list[str]:
    """Strings the DFA accepts: random byte walks that stop in accepting states."""
    out = []
    for _ in range(n):
        state, text = START, b""
        for _ in range(40):
            nxt = [b for b in ALPHABET if dfa.walk(state, bytes([b])) != DEAD]
            if dfa.accepting_list[state] and (not nxt or rng.random() < 0.25):
                out.append(text.decode())
                break
            if not nxt:
                break
            b = rng.choice(nxt)
            state, text = dfa.walk(state, bytes([b])), text + bytes([b])
    return out


bound = st.one_of(st.none(), st.integers(-2500, 2500))


@st.composite
def bounded(draw):
    kind = draw(st.sampled_from(["integer", "number"]))
    schema: dict = {"type": kind}
    for key, excl in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        v = draw(bound)
        if v is not None:
            schema[excl if draw(st.booleans()) else key] = v
    if draw(st.integers(0, 4)) == 0:
        schema["type"] = [kind, "null"]
    return schema


def _ends(schema: dict) -> tuple[int, int]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    return (-10**6 if lo is None else lo), (10**6 if hi is None else hi)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=bounded(), data=st.data(), seed=st.integers(0, 2**16))
def test_bounded_leaf_is_exact_both_ways(schema, data, seed):
    validator = jsonschema.Draft202012Validator(schema)
    lo, hi = _ends(schema)
    try:
        dfa = _dfa(schema)
    except UnsupportedGuideError as exc:  # only an empty range (or a single excluded point) is refused
        assert lo >= hi and "not enforced" in str(exc), (schema, exc)
        return
    for text in _walks(dfa, random.Random(seed), 25):  # every accepted string validates
        assert validator.is_valid(json.loads(text)), (schema, text)
    if isinstance(schema["type"], list):
        assert dfa.fullmatch(b"null")
    if lo > hi:
        return
    if "integer" in schema["type"]:  # values drawn inside the bounds, spelled as JSON writes them
        spelled = json.dumps(data.draw(st.integers(lo, hi)))
    else:
        x = data.draw(st.decimals(Decimal(lo), Decimal(hi), places=data.draw(st.integers(0, 4))))
        spelled = str(x)
    if validator.is_valid(json.loads(spelled)):
        assert dfa.fullmatch(spelled.encode()), (schema, spelled)


@pytest.mark.parametrize("text,valid", [("-0", True), ("0", True), ("100", True), ("101", False), ("-1", False),
                                        ("007", False), ("1e2", False)])
def test_integer_range_spellings(text, valid):
    dfa = _dfa({"type": "integer", "minimum": 0, "maximum": 100})
    assert dfa.fullmatch(text.encode()) is valid


def test_tool_schema_with_bounds_is_served_on_fsm_and_under_a_budget(smollm2_tokenizer, vocab):
    """A pydantic-style tool schema (ge/le/gt fields) compiles on fsm; token walks validate, and
    the budget rule's shortest completion is finite (it was refused: minimum is not enforced)."""
    schema = {"type": "object", "properties": {
        "quantity": {"type": "integer", "minimum": 1, "maximum": 500},
        "discount": {"type": "number", "minimum": 0, "maximum": 1},
        "rating": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0, "maximum": 5}, {"type": "null"}]},
        "offset": {"type": ["integer", "null"], "minimum": -40}},
        "required": ["quantity", "discount", "rating", "offset"], "additionalProperties": False}
    spec = GuideSpec.json_schema(schema, any_whitespace=False)
    guide = compile_guide(spec, vocab, "fsm")
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(7)
    decode = lambda ids: smollm2_tokenizer.decode(ids)  # noqa: E731
    texts = [t for t in (walk(guide, vocab, decode, rng, adversarial=n == 0, max_tokens=64) for n in range(12)) if t]
    assert texts
    for text in texts:
        assert validator.is_valid(json.loads(text)), text
    table = budget_table(compile_guide(budget_spec(spec), vocab))
    assert 0 < table.start < 64


@pytest.mark.parametrize("schema,reason", [
    ({"type": "number", "minimum": 0.5}, "minimum"),                       # a bound with a fraction
    ({"type": "integer", "minimum": 0, "multipleOf": 3}, "multipleOf"),    # another keyword on the leaf
    ({"type": "integer", "minimum": 0, "enum": [1, 2]}, "minimum"),        # the placeholder would drop the enum
])
def test_inexact_bounds_stay_refused_with_their_reason(vocab, schema, reason):
    with pytest.raises(UnsupportedGuideError) as err:
        compile_guide(GuideSpec.json_schema(schema), vocab, "fsm")
    assert reason in str(err.value)


@pytest.mark.parametrize("schema,invalid", [
    ({"type": "integer", "$ref": "#/$defs/a", "$defs": {"a": {"type": "number"}}}, "1.5"),
    ({"type": "integer", "$ref": "#/$defs/a", "$defs": {"a": {"minimum": 3}}}, "3.5"),
    ({"$ref": "#/$defs/a", "enum": ["x"], "$defs": {"a": {"type": "string", "maxLength": 0}}}, '"x"'),
])
def test_ref_beside_constraining_keywords_is_refused_not_half_lowered(schema, invalid):
    """outlines-core lowers one side of a ``$ref`` with siblings (the $ref over ``type``, ``enum``
    over the $ref): an instance invalid for the dropped side would pass. Refused, with the reason."""
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(invalid))
    try:
        dfa = _dfa(schema)
    except UnsupportedGuideError as exc:
        assert "$ref" in str(exc)
        return
    assert not dfa.fullmatch(invalid.encode()), f"fsm accepts {invalid} for {schema}"

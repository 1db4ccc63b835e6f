"""Issue 27.1: every walk over a client's schema has a budget counted in visits, not depth alone.

A 2.2 KB schema whose 30 ``$defs`` levels each ``allOf`` two references to the next level is 2^30
node visits for a walk that follows ``$ref``/``allOf`` (the closing policy, type inference). On the
code before the budget the closing walk doubled its work per level (16 levels 3 s, 20 levels > 25 s)
and ran in the api_server's early check on its event loop. Each test runs the walk on a daemon
thread with a timeout, so the old code fails the test instead of hanging the suite.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

import tokenrails as tr
from tokenrails.guided.errors import GuideLimitError
from tokenrails.guided.limits import DEFAULT_LIMITS, GuideLimits
from tokenrails.guided.schema_semantics import close_schema, infer_types
from tokenrails.guided.vocabulary import Vocabulary

WALL_S = 20.0  # generous (a shared 2-core machine); the budgeted walk takes well under a second


def allof_ref_chain(levels: int) -> dict:
    """Each level intersects two references to the next: 2 KB for 30 levels, 2^levels expansion."""
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
            for i in range(levels)}
    defs[f"d{levels}"] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def run_bounded(fn, timeout: float = WALL_S):
    """``(result or exception, seconds)`` of ``fn()`` on a daemon thread; fails past ``timeout``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            box["value"] = exc

    start = time.perf_counter()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s: the walk has no budget"
    return box["value"], time.perf_counter() - start


def probe_vocab() -> Vocabulary:
    return Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="budget-probe")


def test_the_30_level_chain_is_2_kb():
    assert 2000 < len(json.dumps(allof_ref_chain(30))) < 2400


@pytest.mark.parametrize("backend", ["auto", "llguidance"])
def test_allof_ref_chain_is_refused_with_a_typed_limit_quickly(backend):
    spec = tr.GuideSpec.json_schema(allof_ref_chain(30))
    vocab = probe_vocab()
    result, seconds = run_bounded(lambda: tr.compile_guide(spec, vocab, backend))
    assert isinstance(result, GuideLimitError), result
    assert "max_schema_visits" in str(result)
    assert seconds < 10


def test_closing_walk_is_budgeted_in_visits():
    result, _ = run_bounded(lambda: close_schema(allof_ref_chain(30)))
    assert isinstance(result, GuideLimitError) and result.limit == "max_schema_visits"


def test_the_visit_budget_is_a_configurable_limit():
    assert DEFAULT_LIMITS.max_schema_visits > 0
    small = allof_ref_chain(6)  # 2^6 expansion: fine by default
    closed = close_schema(small)
    assert closed["$defs"]["d6"]["additionalProperties"] is False
    with pytest.raises(GuideLimitError) as info:
        close_schema(small, max_visits=0)
    assert info.value.limit == "max_schema_visits"
    # the compile path reads it from GuideLimits
    limits = GuideLimits(max_schema_visits=0)
    spec = tr.GuideSpec.json_schema(allof_ref_chain(12))
    with pytest.raises(GuideLimitError):
        tr.compile_guide(spec, probe_vocab(), "llguidance", limits=limits)


def test_type_inference_walk_is_budgeted():
    # every node of a $ref chain asks whether its targets are typed (the chain is walked per node:
    # quadratic in the chain's length)
    def chain(n):
        defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}]} for i in range(n)}
        defs[f"d{n}"] = {"minLength": 1}
        return {"$defs": defs, "$ref": "#/$defs/d0"}

    with pytest.raises(GuideLimitError):
        infer_types(chain(200), max_visits=0)
    assert infer_types(chain(30))["$defs"]["d30"]["type"] == "string"  # within the default budget


def test_a_large_plain_schema_is_not_refused_for_its_size():
    # 5,000 nested nodes, no shared references: the budget grows with the document
    props = {f"p{i}": {"type": "object", "properties": {"x": {"type": "string"}}} for i in range(1500)}
    closed = close_schema({"type": "object", "properties": props}, max_visits=0)
    assert closed["properties"]["p7"]["additionalProperties"] is False


# ---- issue 27.2: shapes under every per-item limit whose compile took tens of seconds ---------
def test_grammar_literals_are_bounded_in_total():
    """15 literals of 16 KB each (each under max_literal_bytes) compiled 47 s on a tiny vocabulary."""
    grammar = "root ::= " + " | ".join(f'"{chr(97 + i) * 16000}"' for i in range(15))
    spec = tr.GuideSpec.grammar(grammar)
    result, seconds = run_bounded(lambda: tr.compile_guide(spec, probe_vocab(), "auto"))
    assert isinstance(result, GuideLimitError) and result.limit == "max_grammar_literal_bytes", result
    assert seconds < 10
    small = tr.GuideSpec.grammar('root ::= "' + "a" * 1000 + '" | "b"')
    tr.compile_guide(small, probe_vocab(), "auto")  # ordinary literals still compile


def test_structural_tags_fan_out_is_bounded():
    """3,000 tags compiled 17 s on a tiny vocabulary; a tag is an alternative like an anyOf branch."""
    tags = {"type": "structural_tag", "triggers": ["<f"], "structures": [
        {"begin": f"<f{i}>", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "end": f"</f{i}>"}
        for i in range(3000)]}
    spec = tr.spec_from_request(tags)
    result, seconds = run_bounded(lambda: tr.compile_guide(spec, probe_vocab(), "auto"))
    assert isinstance(result, GuideLimitError) and result.limit == "max_any_of", result
    assert seconds < 10


def test_a_regexs_repeats_are_bounded_in_total():
    """300 x [\\u0000-\\uffff]{0,9} is .{0,2700} spelled out (each repeat under max_repeat): fsm
    spent its whole deadline, llguidance ran out of lexer fuel on a real vocabulary, xgrammar took
    11 s there."""
    pattern = r"[\u0000-\uffff]{0,9}" * 300
    result, seconds = run_bounded(lambda: tr.compile_guide(tr.GuideSpec.regex(pattern), probe_vocab(), "auto"))
    assert isinstance(result, GuideLimitError) and result.limit == "max_repeat_total", result
    assert seconds < 5
    tr.compile_guide(tr.GuideSpec.regex(r"[a-z]{1,20}(-[0-9]{1,4}){3}"), probe_vocab(), "auto")

"""outlines-core's schema lowering cannot take the process down: large lowerings run in a worker
under an address-space limit and a deadline, small ones in-process under a proven size bound.

Before: arrays nested 31 deep made outlines-core ask for 6.5 GB and Rust aborted the interpreter
(SIGABRT); depth 20 took > 60 s and 2.3 GB.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tokenrails as tr
from tokenrails.guided.errors import GuideLimitError
from tokenrails.guided.fsm.lowering import lowered_size_estimate
from tokenrails.guided.fsm.schema import _lower_isolated

outlines_core = pytest.importorskip("outlines_core.json_schema")


def nested_arrays(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("depth", [20, 31])
def test_geometric_lowering_is_refused_not_fatal(vocab, depth):
    with pytest.raises(GuideLimitError):
        tr.compile_guide(tr.GuideSpec.json_schema(nested_arrays(depth)), vocab, "fsm")
    # the process and the worker are fine: the next request is served
    guide = tr.compile_guide(tr.GuideSpec.json_schema(nested_arrays(3)), vocab, "fsm")
    assert guide.matcher() is not None


def test_worker_lowers_exactly_what_outlines_core_lowers():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "array", "items": {"type": "string"}}
                                               for i in range(6)}}
    text = json.dumps(schema)
    assert _lower_isolated(text, None, tr.GuideLimits()) == outlines_core.build_regex_from_schema(text, None)


def test_worker_reports_outlines_errors_as_values():
    with pytest.raises(ValueError):
        _lower_isolated(json.dumps({"type": "unknown-type"}), None, tr.GuideLimits())


_leaf = st.sampled_from([{"type": "integer"}, {"type": "string"}, {"type": "boolean"}, {"enum": ["a", "bb"]},
                         {"type": "string", "pattern": "^[a-z]{2}$"}, {"type": "number"}])
schemas = st.recursive(_leaf, lambda c: st.one_of(
    st.builds(lambda items: {"type": "array", "items": items}, c),
    st.builds(lambda props, req: {"type": "object", "properties": props,
                                  "required": [k for k in props if k in req]},
              st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), c, min_size=1, max_size=4),
              st.sets(st.sampled_from(["a", "b", "c", "d", "e"]))),
    st.builds(lambda alts: {"anyOf": alts}, st.lists(c, min_size=1, max_size=3)),
), max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=schemas)
def test_size_estimate_is_an_upper_bound(schema):
    """What decides in-process lowering must never under-estimate outlines-core's regex."""
    estimate = lowered_size_estimate(schema)
    if estimate > 2_000_000:
        return  # would go to the worker anyway; not lowered here
    assert len(outlines_core.build_regex_from_schema(json.dumps(schema), None)) <= estimate

"""Bug 5 of issue 23: a client's backend hint changes which backend compiles, or is refused.

``guided_decoding_backend`` / ``structured_outputs.backend`` name the backend tried first;
``no-fallback`` and ``disable_fallback: true`` stop the fallback to the rest of the auto ladder.
On the old code both were validated into ``NormalizedRequest`` and read by nobody.
"""
from __future__ import annotations

import pytest

from tokenrails.compat import normalize_request, parse_request
from tokenrails.guided.errors import UnsupportedGuideError
from tokenrails.guided.registry import compile_guide

SCHEMA_FSM_REFUSES = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}},
                      "required": ["n"]}  # outlines' lowering would drop ``multipleOf``: fsm refuses it


def body(**fields):
    return {"messages": [{"role": "user", "content": "hi"}], **fields}


def test_a_regex_hint_routes_to_that_backend(vocab):
    assert compile_guide(normalize_request(body(guided_regex="[a-z]{2,5}")), vocab).backend == "fsm"
    for hint, backend in (("xgrammar", "xgrammar"), ("guidance", "llguidance"), ("outlines", "fsm")):
        spec = normalize_request(body(guided_regex="[a-z]{2,5}", guided_decoding_backend=hint))
        assert compile_guide(spec, vocab).backend == backend, hint


def test_the_hint_reaches_the_manager(vocab):
    from tokenrails.guided.manager import GuidedDecodingManager

    mgr = GuidedDecodingManager(vocab)
    try:
        plain = mgr.get_compiled(normalize_request({"regex": "[0-9]+"}))
        hinted = mgr.get_compiled(normalize_request({"regex": "[0-9]+", "backend": "xgrammar"}))
    finally:
        mgr.close()
    assert (plain.backend, hinted.backend) == ("fsm", "xgrammar")  # not the cached fsm guide


@pytest.mark.parametrize("request_obj", [
    body(guided_json=SCHEMA_FSM_REFUSES, guided_decoding_backend="outlines:no-fallback"),
    body(structured_outputs={"json": SCHEMA_FSM_REFUSES, "backend": "outlines", "disable_fallback": True}),
    {"json": SCHEMA_FSM_REFUSES, "backend": "outlines", "disable_fallback": True},
])
def test_no_fallback_means_that_backend_or_a_typed_error(vocab, request_obj):
    req = parse_request(request_obj)
    assert req.fallback is False
    with pytest.raises(UnsupportedGuideError):
        compile_guide(req.spec, vocab)


def test_with_fallback_a_refusing_hinted_backend_hands_over(vocab):
    spec = normalize_request(body(guided_json=SCHEMA_FSM_REFUSES, guided_decoding_backend="outlines"))
    assert compile_guide(spec, vocab).backend in ("xgrammar", "llguidance")


def test_auto_with_no_fallback_tries_only_autos_first_choice(vocab):
    spec = normalize_request({"regex": "[a-z]+", "backend": "auto:no-fallback"})
    assert spec.option("fallback") is False
    assert compile_guide(spec, vocab).backend == "fsm"
    hostile = normalize_request({"regex": "(a|b)*a(a|b){30}", "backend": "auto:no-fallback"})  # fsm: too many states
    with pytest.raises(Exception) as info:
        compile_guide(hostile, vocab)
    assert "llguidance" not in str(info.value)  # the ladder stopped at fsm


def test_a_pinned_engine_refuses_a_request_for_another_backend(vocab):
    spec = normalize_request(body(guided_regex="a+", guided_decoding_backend="guidance"))
    with pytest.raises(UnsupportedGuideError, match="llguidance"):
        compile_guide(spec, vocab, "fsm")
    assert compile_guide(spec, vocab, "llguidance").backend == "llguidance"


def test_backend_was_auto_makes_the_hint_non_binding(vocab):
    spec = normalize_request({"regex": "[a-z]+", "backend": "xgrammar", "backend_was_auto": True})
    assert spec.option("backend") is None
    assert compile_guide(spec, vocab).backend == "fsm"


def test_the_reasoning_setting_rides_on_the_normalized_request():
    req = parse_request({"type": "regex", "regex": "[0-9]+", "tokenrails_reasoning": "off"})
    assert req.reasoning == "off"
    assert parse_request({"type": "regex", "regex": "[0-9]+"}).reasoning is None

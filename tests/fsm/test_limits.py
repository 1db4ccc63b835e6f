"""Hostile patterns fail fast with typed limit errors; nothing hangs or exhausts memory."""
from __future__ import annotations

import time

import pytest

from tokenrails import GuideLimitError, GuideTimeoutError, InvalidGuideError
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.limits import GuideLimits

LIMITS = GuideLimits()


def _fails_fast(pattern, limits=LIMITS, seconds=5.0, error=GuideLimitError):
    start = time.perf_counter()
    with pytest.raises(error) as err:
        compile_regex(pattern, limits)
    assert time.perf_counter() - start < seconds
    return err.value


def test_exponential_dfa_hits_the_state_limit():
    err = _fails_fast(r"(a|b)*a(a|b){30}")
    assert err.limit == "max_dfa_states"
    err = _fails_fast(r"(a|b)*a(a|b){12}", LIMITS.replace(max_dfa_states=1000))
    assert err.limit == "max_dfa_states"
    compile_regex(r"(a|b)*a(a|b){12}", LIMITS)  # 8193 states: within the default limit


def test_repeat_bounds():
    assert _fails_fast(r"a{1,100000}").limit == "max_repeat"
    assert _fails_fast(r"x{10001}").limit == "max_repeat"  # the default: 10,000 (measured, limits.py)
    assert _fails_fast(r"x{1001}", LIMITS.replace(max_repeat=1000)).limit == "max_repeat"  # configurable


def test_nested_repeats_hit_the_automaton_size_limit():
    assert _fails_fast(r"(a{1000}){1000}").limit == "max_dfa_states"
    assert _fails_fast(r"((\w{100}){100}){100}").limit == "max_dfa_states"


def test_compile_deadline():
    err = _fails_fast(r"[^\"]{0,1000}b[a-z]{0,900}", LIMITS.replace(compile_timeout_s=0.01), error=GuideTimeoutError)
    assert err.limit == "compile_timeout_s"


def test_empty_language_is_invalid():
    with pytest.raises(InvalidGuideError):
        compile_regex(r"[^\x00-\U0010ffff]", LIMITS)
    with pytest.raises(InvalidGuideError):
        compile_regex("\ud800", LIMITS)  # a surrogate has no UTF-8 encoding

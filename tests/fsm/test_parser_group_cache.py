"""The parser's group cache (a plain group's text -> its AST) changes no result: same AST, same
limits (nesting, max_repeat), anchors never served from it."""
from __future__ import annotations

import re

import pytest

from tokenrails.guided.errors import GuideLimitError, UnsupportedGuideError
from tokenrails.guided.fsm import regex_parser as rp
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.limits import GuideLimits

STRING = r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"'


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(rp, "_GROUPS", {})
    monkeypatch.setattr(rp, "_GROUP_TEXTS", {})
    monkeypatch.setattr(rp, "_group_chars", 0)


def test_a_cached_group_gives_the_same_ast_and_language():
    pattern = rf"\{{{STRING}:{STRING}(,{STRING}:{STRING})*\}}"
    first = rp.parse_regex(pattern)
    assert rp._GROUPS  # the string body was cached on the way
    assert rp.parse_regex(pattern) == first
    dfa = compile_regex(pattern, GuideLimits(), check_length=False)
    for text in ('{"a":"b"}', '{"a":"b","c":"\\n"}', '{"a":b}', '{"a":"b",}'):
        assert dfa.fullmatch(text.encode()) == bool(re.fullmatch(pattern, text)), text


def test_nesting_limit_still_counts_a_cached_group():
    inner = "(" * 5 + "a" + ")" * 5
    rp.parse_regex(inner)
    depth = rp.MAX_NESTING - 4  # + the 5 inside: one more than the limit
    rp.parse_regex("(" * depth + "b" + ")" * depth)  # fits on its own
    with pytest.raises(GuideLimitError):
        rp.parse_regex("(" * depth + inner + ")" * depth)


def test_max_repeat_is_part_of_the_key():
    rp.parse_regex("(a{500})", max_repeat=1000)
    with pytest.raises(GuideLimitError):
        rp.parse_regex("(a{500})", max_repeat=100)


def test_groups_with_anchors_are_not_cached():
    rp.parse_regex("(^a)|b")
    assert not any(text.startswith("(^") for text in rp._GROUP_TEXTS.get("(^a)", []))
    with pytest.raises(UnsupportedGuideError):
        rp.parse_regex("x(^a)")


def test_the_cache_is_bounded_by_text(monkeypatch):
    monkeypatch.setattr(rp, "GROUP_CHARS_MAX", 40)
    for i in range(20):
        rp.parse_regex(f"(x{i}yz)")
    assert rp._group_chars <= 40 and 0 < len(rp._GROUPS) < 20
    assert rp.parse_regex("(x19yz)") == rp.parse_regex("x19yz")  # uncached: parsed as before


def test_non_capturing_groups_are_cached_and_flag_groups_are_not():
    email = r"(?:[a-z0-9]+(?:\.[a-z0-9]+)*)@(?:[a-z]+\.)+[a-z]{2,}"
    first = rp.parse_regex(email)
    assert any(text.startswith("(?:") for texts in rp._GROUP_TEXTS.values() for text in texts)
    assert rp.parse_regex(email) == first  # served from the cache: the same AST
    rp._GROUPS.clear()
    rp._GROUP_TEXTS.clear()
    assert rp.parse_regex(email) == first
    rp.parse_regex(r"(?s:.)(?a:\w)")  # scoped flags change what the body means: never cached
    assert not any(text.startswith(("(?s", "(?a")) for texts in rp._GROUP_TEXTS.values() for text in texts)
    dotall = compile_regex(r"(?s:.)", GuideLimits())
    assert dotall.fullmatch(b"\n") and not compile_regex(r"(?:.)", GuideLimits()).fullmatch(b"\n")
    rp.parse_regex("(?:^a)|b")
    with pytest.raises(UnsupportedGuideError):  # anchors inside a non-capturing group: not cached either
        rp.parse_regex("x(?:^a)")

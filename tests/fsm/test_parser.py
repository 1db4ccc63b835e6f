"""Regex front end: Python ``re`` semantics on a table of patterns, typed errors with positions."""
from __future__ import annotations

import re

import pytest

from tokenrails import GuideLimitError, InvalidGuideError, UnsupportedGuideError
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.fsm.regex_parser import RegexSyntaxError, parse_regex
from tokenrails.guided.limits import GuideLimits

LIMITS = GuideLimits()

SAMPLES = [
    "", "a", "b", "ab", "abc", "aaa", "a\n", "\n", " ", "\t", "1", "12", "123", "-", "]", "{", "}",
    "{2}", "a{", "a{,", "a{}", "é", "€", "😀", "日本", "٣", "١٢", "x_y", "\x00", "\x7f", "\x80", "ÿ",
    "a.b", "a-b", "\\", '"', "\x08", "a b", "\u2028", "\u3000", "\x1c", "aé😀", "abab", "ababc",
]

PATTERNS = [
    r"a|b*", r"(?:ab)+c?", r"a{2}", r"a{1,3}", r"a{2,}", r"a{,2}", r"a{}", r"a{", r"a{,}", r"a{x}", r"{",
    r"}", r"]", r"[]a]", r"[^]a]", r"[a-]", r"[-a]", r"[\]]", r"[\\]", r"[\d-]", r"[^\d]", r"\d+", r"\D",
    r"\w+", r"\W", r"\s", r"\S+", r"(?a)\w+", r"(?a:\d)+", r".", r".*", r"(?s).", r"(?s:.)b?", r"[^a]",
    r"[^\"\\]*", r"\x41|\u00e9|\U0001F600", r"\N{EURO SIGN}", r"\0", r"\012", r"\101", r"[\101-\103]+",
    r"[\b]", r"\a|\f|\v|\r|\n|\t", r"\.\*\+\?\(\)\[\]\{\}\|\^\$", r"\-", r"\/", r"\"", r"\ ",
    r"^a$", r"^(a|b)$", r"\Aab\Z", r"(^a|^b)c", r"a(b$|c$)", r"(?#comment)ab",
    r"a*?b+?c??d{1,2}?", r"(a|)", r"()", r"(|a)+", r"[a-c\s]+", r"[\w&&]", r"[😀-😂é]", r"[^\x00-\x7f]+",
    r"(a|b)*abb", r"((a|b)(c|d))*", r"[^a-zA-Z0-9]", r"[\u3000-\u303f]", r"\d{2}-\d{2}", r"x?y?z?",
]


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_matches_python_fullmatch(pattern):
    dfa = compile_regex(pattern, LIMITS)
    for s in SAMPLES:
        expect = re.fullmatch(pattern, s) is not None
        assert dfa.fullmatch(s.encode("utf-8")) == expect, (pattern, s)


def test_unicode_classes_agree_with_re_on_every_code_point():
    """\\d, \\w, \\s over all of Unicode (surrogates excluded): byte DFA == re.fullmatch."""
    for pattern in (r"\d", r"\w", r"\s"):
        dfa = compile_regex(pattern, LIMITS)
        for cp in range(0, 0x110000, 7):  # every 7th code point keeps this fast yet covers all planes
            if 0xD800 <= cp <= 0xDFFF:
                continue
            ch = chr(cp)
            assert dfa.fullmatch(ch.encode()) == (re.fullmatch(pattern, ch) is not None), (pattern, hex(cp))


def test_invalid_utf8_never_matches():
    dfa = compile_regex(r".*", LIMITS)
    assert dfa.fullmatch("aé😀".encode())
    for bad in (b"\x80", b"\xc3", b"\xed\xa0\x80", b"\xf5\x80\x80\x80", b"\xc0\xaf", b"a\xff"):
        assert not dfa.fullmatch(bad), bad


INVALID = [
    "(", "(a", "a)", ")", "[", "[a", "[]", "[a-", "*", "+a", "a**", "a{2}{3}", "a|*", "a{3,2}",
    "[z-a]", r"[\d-z]", r"[a-\d]", "\\", r"\q", r"\x4", r"\u12", r"\N{NOT A NAME}", r"(?P<1a>x)",
    r"(?P<a", "(?Z)", r"\777", "a(?s)", "(?", r"(?#x", r"[\9]", "(?-)a", r"\U00110000",
]


@pytest.mark.parametrize("pattern", INVALID)
def test_invalid_patterns_raise_invalid_with_python_position(pattern):
    with pytest.raises(re.error) as py:
        re.compile(pattern)
    with pytest.raises(InvalidGuideError) as ours:
        parse_regex(pattern)
    assert isinstance(ours.value, RegexSyntaxError)
    assert "position" in str(ours.value)
    assert ours.value.position == py.value.pos, (pattern, ours.value, py.value)


UNSUPPORTED = {
    r"a(?=b)": "lookahead", r"a(?!b)": "lookahead", r"(?<=a)b": "lookbehind", r"(?<!a)b": "lookbehind",
    r"\bword\b": "word boundary", r"a\B": "word boundary", r"(a)\1": "backreference",
    r"(?P<n>a)(?P=n)": "backreference", r"a*+": "possessive", r"(?>ab)": "atomic",
    r"(a)?(?(1)b|c)": "conditional", r"(?i)abc": "case-insensitive", r"(?x)a b": "verbose",
    r"a^b": "anchor", r"a$b": "anchor", r"(^a)*": "anchor",
}


@pytest.mark.parametrize("pattern,feature", sorted(UNSUPPORTED.items()))
def test_unsupported_constructs_are_named(pattern, feature):
    with pytest.raises(UnsupportedGuideError) as err:
        compile_regex(pattern, LIMITS)
    assert feature in str(err.value)
    assert err.value.backend == "fsm"


def test_repeat_bound_limit():
    with pytest.raises(GuideLimitError) as err:
        compile_regex("a{1,100000}", LIMITS)
    assert err.value.limit == "max_repeat"
    with pytest.raises(GuideLimitError):  # the default bound is 10,000 (measured, limits.py)
        compile_regex("a{10001}", LIMITS)
    compile_regex("a{5000}", LIMITS)  # served, as outlines serves it


def test_regex_length_limit():
    with pytest.raises(GuideLimitError) as err:
        compile_regex("a" * 50, LIMITS.replace(max_regex_length=10))
    assert err.value.limit == "max_regex_length"


def test_deep_nesting_is_a_limit_not_a_crash():
    with pytest.raises(GuideLimitError):
        compile_regex("(" * 500 + "a" + ")" * 500, LIMITS)


def test_pcre_style_named_group_is_accepted_as_a_group():
    """``(?<name>...)`` is rejected by Python 3.11's re; we accept it (PCRE/Rust syntax) as a group."""
    dfa = compile_regex(r"(?P<x>a)(?<y>b)?", LIMITS)
    assert dfa.fullmatch(b"a") and dfa.fullmatch(b"ab") and not dfa.fullmatch(b"b")


ANCHOR_CASES = ["^a$", r"\Aab\Z", "^(yes|no)$|^maybe$", "^$", "$^", "^", "$", "^|b$", "a^", "a$b", "(^a)", "^(a|^b)",
                "^a|b", "a$|^b$|c", "(^a|b)$", r"^\w+@\w+\.com$", "^^a$$", "$a", "a^b|c", "^(a)$"]


def _slow_strip(pattern: str):
    """The general anchor check on the raw parse (no outer-anchor shortcut)."""
    import tokenrails.guided.fsm.regex_parser as rp

    parser = rp._Parser(pattern, LIMITS.max_repeat)
    node = parser.parse()
    return rp._strip_anchors(node, True, True) if parser.anchors else node


def _outcome(fn, pattern):
    try:
        return fn(pattern)
    except Exception as exc:  # noqa: BLE001 -- compared below
        return (type(exc), str(exc))


def test_outer_anchor_shortcut_gives_the_general_result():
    for pattern in ANCHOR_CASES:
        assert _outcome(lambda p: parse_regex(p, LIMITS.max_repeat), pattern) == _outcome(_slow_strip, pattern), pattern


def test_outer_anchor_shortcut_on_random_patterns():
    from hypothesis import given, settings

    from .regex_strategies import anchored, regexes

    @given(anchored, regexes)
    @settings(max_examples=300, deadline=None)
    def check(pattern, other):
        for p in (pattern, f"^{other}|{pattern}", f"{pattern}|{other}$", f"({pattern})$"):
            assert _outcome(lambda q: parse_regex(q, LIMITS.max_repeat), p) == _outcome(_slow_strip, p), p

    check()

"""The C fast-path regex parser (``_dfa_native.compile_regex``) against the Python parser.

For every pattern the fast path either declines (None: the Python parser runs) or produces exactly
what ``flatten_ast(parse_regex(pattern))`` would (same program, same character sets in the same
order), hence the identical DFA. End to end, ``compile_regex`` with the fast path must return the
same tables as the pure-Python path (``TOKENRAILS_NATIVE=0``) and raise the same errors (type,
message, limit, value). The bench workloads must really take the fast path.
"""
from __future__ import annotations

import json
import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideLimitError, GuideTimeoutError
from tokenrails.guided.fsm import compiler
from tokenrails.guided.fsm.compiler import compile_regex
from tokenrails.guided.fsm.nfa import _charset_fragment, flatten_ast
from tokenrails.guided.fsm.regex_parser import parse_regex
from tokenrails.guided.fsm.unicode_classes import unicode_digit, unicode_space, unicode_word
from tokenrails.guided.limits import GuideLimits

from .regex_strategies import anchored, regexes
from tests.fsm.leaks import assert_flat_rss, needs_proc

mod = pytest.importorskip("tokenrails._dfa_native")
if not hasattr(mod, "compile_regex"):
    pytest.skip("stale _dfa_native build without the fast-path parser", allow_module_level=True)

LIMITS = GuideLimits()
SMALL = LIMITS.replace(max_dfa_states=40, max_repeat=50)

WORKLOADS = {
    "email": r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    "datetime": r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})",
    "ipv4": r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    "phone": r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}",
    "choice5": r"(positive|negative|neutral|mixed|unknown)",
}
SCHEMAS = {  # bench/fsm_vs_peers.py's JSON workloads
    "json_person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"}}, "required": ["name", "age", "email"]},
    "json_order": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"]}, "minItems": 1, "maxItems": 5},
        "status": {"enum": ["new", "paid", "shipped"]}}, "required": ["id", "items", "status"]},
    "json_event": {"type": "object", "properties": {
        "title": {"type": "string"}, "date": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}},
        "public": {"type": "boolean"}, "location": {"anyOf": [{"type": "null"}, {"type": "string"}]}},
        "required": ["title", "date", "tags", "public", "location"]},
}


def _install_tables() -> None:
    for index, table in enumerate((unicode_digit, unicode_word, unicode_space)):
        mod.set_class_ranges(index, table())


def _python_flat(pattern: str, max_repeat: int):
    try:
        return flatten_ast(parse_regex(pattern, max_repeat))
    except Exception as exc:  # noqa: BLE001 -- the caller checks the fast path declined
        return exc


def check_parse(pattern: str, max_repeat: int = 1000) -> bool:
    """The fast parse declines or equals the Python parse; returns whether it handled the pattern."""
    fast = mod.parse_regex_program(pattern, max_repeat)
    if fast is None:
        return False
    if isinstance(fast, int):  # tables missing: install, then it must answer
        _install_tables()
        fast = mod.parse_regex_program(pattern, max_repeat)
        assert not isinstance(fast, int)
        if fast is None:
            return False
    py = _python_flat(pattern, max_repeat)
    assert not isinstance(py, Exception), f"fast path accepted {pattern!r}, Python raised {py!r}"
    prog, sets = fast
    assert prog == py[0], pattern
    assert [_charset_fragment(r) for r in sets] == py[1], pattern
    return True


def _run(monkeypatch, native: bool, pattern, limits):
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1" if native else "0")
    try:
        return compile_regex(pattern, limits)
    except Exception as exc:  # noqa: BLE001 -- compared by the caller
        return exc
    finally:
        monkeypatch.setenv("TOKENRAILS_NATIVE", "1")


def check_compile(monkeypatch, pattern, limits=LIMITS) -> None:
    """compile_regex with the fast path == the pure-Python path: tables or error."""
    py = _run(monkeypatch, False, pattern, limits)
    fast = _run(monkeypatch, True, pattern, limits)
    if isinstance(py, Exception) or isinstance(fast, Exception):
        assert type(py) is type(fast), (pattern, py, fast)
        assert str(py) == str(fast), pattern
        assert getattr(py, "limit", None) == getattr(fast, "limit", None)
        assert getattr(py, "value", None) == getattr(fast, "value", None)
        return
    assert np.array_equal(py.trans, fast.trans), pattern
    assert np.array_equal(py.classmap, fast.classmap), pattern
    assert np.array_equal(py.accepting, fast.accepting), pattern


# ---- the fast path is really taken ---------------------------------------------------------------
def _no_python_parser(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("the Python parser ran: the fast path declined")

    monkeypatch.setattr(compiler, "parse_regex", boom)


def _json_regexes():
    core = pytest.importorskip("outlines_core.json_schema")
    return {name: core.build_regex_from_schema(json.dumps(schema)) for name, schema in SCHEMAS.items()}


# bench/fsm_compile_breakdown.py's VARIANTS: anchored user patterns, non-ASCII sets, a '{' literal
VARIANTS = [r"^\d{3}-\d{4}$", r"^[A-Z]+$", r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$", r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}\Z",
            r"^(yes|no)$|^maybe$", r"\w+", r'[^"\\]*', r".{1,5}", r"[é-ü]+", r"\d{3}", r"^\w+@\w+\.com$", r"a{b}c"]


@pytest.mark.parametrize("name", sorted(WORKLOADS) + sorted(SCHEMAS) + VARIANTS)
def test_bench_patterns_take_the_fast_path(monkeypatch, name):
    """The bench's workloads, outlines-lowered JSON regexes and variants compile without the
    Python parser, to the pure-Python path's DFA."""
    if name in WORKLOADS or name in SCHEMAS:
        pattern = WORKLOADS[name] if name in WORKLOADS else _json_regexes()[name]
        assert check_parse(pattern)
    else:
        pattern = name
    monkeypatch.setenv("TOKENRAILS_NATIVE", "0")
    expected = compile_regex(pattern, LIMITS)
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1")
    _no_python_parser(monkeypatch)
    got = compile_regex(pattern, LIMITS)
    assert np.array_equal(expected.trans, got.trans)
    assert np.array_equal(expected.classmap, got.classmap)
    assert np.array_equal(expected.accepting, got.accepting)


def test_native_off_never_calls_the_fast_path(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("fast path used with TOKENRAILS_NATIVE=0")

    monkeypatch.setattr(mod, "compile_regex", boom)
    monkeypatch.setenv("TOKENRAILS_NATIVE", "0")
    assert compile_regex(WORKLOADS["datetime"], LIMITS).fullmatch(b"2024-05-17T13:45:09.123+02:00")


# ---- random and adversarial patterns ---------------------------------------------------------------
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(anchored)
def test_generated_patterns(monkeypatch, pattern):
    check_parse(pattern)
    check_compile(monkeypatch, pattern)


META = "\\()[]{}|.*+?^$-,:<>=!#P0123456789dDwWsSxuUNbBAZntaf"
junk = st.text(alphabet=st.sampled_from(list(META) + ["é", "😀", "\ud800", " ", "\n", "\x00"]), max_size=14)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(junk)
def test_malformed_and_adversarial_strings(monkeypatch, pattern):
    check_parse(pattern, 50)
    check_compile(monkeypatch, pattern, SMALL)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(regexes, st.sampled_from(["*", "+", "?", "{2}", "{0,3}", "{2,}", "{,2}", "*?", "{1,2}?", "{3,1}", "{}",
                                 "{,}", "{x}", "*+", "**", "{2}{3}", "??"]))
def test_nested_quantifiers(monkeypatch, pattern, quant):
    for p in ("(" + pattern + ")" + quant, "(?:" + pattern + quant + ")" + quant, pattern + quant):
        check_parse(p)
        check_compile(monkeypatch, p, SMALL)


ESCAPE_CHARS = string.printable + "é€😀\u3000٣"


@pytest.mark.parametrize("c", list(ESCAPE_CHARS))
def test_every_escape_letter(monkeypatch, c):
    for p in ("\\" + c, "a\\" + c + "b", "[\\" + c + "]", "[^\\" + c + "x]", "[a-\\" + c + "]", "[\\" + c + "-z]",
              "\\" + c + "12", "\\" + c + "0041", "\\" + c + "0001F600", "\\" + c + "{LATIN SMALL LETTER A}",
              "[\\" + c + "4a]", "\\" + c + "ffffffff", "\\" + c + "zz"):
        check_parse(p)
        check_compile(monkeypatch, p)


EDGE_CASES = [
    "", "()", "(?:)", "a|", "|", "||a", "(|)", "a**", "a*?", "a+?b", "a{3", "a{3,", "a{,3}", "a{,}", "a{}", "{3}",
    "a{3}{2}", "a{2,1}", "a{1001}", "a{1000}", "a{0,1001}", "a{99999999999999999999}", "a{007}", "x{0}", "x{0,0}",
    "(a)(b)", "a)", "(a", "((a)", "[", "[]", "[]]", "[^]]", "[^]", "[a-]", "[-a]", "[a-\\d]", "[\\d-a]", "[z-a]",
    "[\\", "[a", "[a-", "]", "}", "a]b}", "\\", "a\\", ".", ".*", "[.]", "\\x4", "\\xg0", "\\u12", "\\U0011ffff",
    "\\U0010ffff", "\\ud800", "[\\ud800-\\udfff]", "é+", "😀{2}", "[😀-😂]+", "\\N{EM DASH}", "\\0", "\\1", "\\08",
    "[\\0]", "[\\8]", "[\\b]", "\\b", "^a$", "a^", "$", "(?i)a", "(?s).", "(?a)\\w", "(?P<n>a)", "(?<n>a)", "(?#c)a",
    "(?=a)", "(?!a)", "(?<=a)b", "(?>a)", "a++", "a?+", "(?P=n)", "(?x", "(?", "(?:a|b)*c",
    "[\\w\\s\\d]", "[^\\W\\S]", "\\D\\W\\S", "[\\D]", "[^\\D0-9]", "a{2}?", "a??b", "(a|b)*a(a|b){8}",
    "[^\\x00-\\U0010ffff]", "[^\\x00-\\x7f]", "[\\x00-\\x7f]", "[\\t\\n\\r\\f\\v\\a]", "\\[\\]\\{\\}\\(\\)",
]


@pytest.mark.parametrize("pattern", EDGE_CASES)
def test_edge_cases(monkeypatch, pattern):
    check_parse(pattern)
    check_compile(monkeypatch, pattern)
    check_compile(monkeypatch, pattern, SMALL)


@pytest.mark.parametrize("depth", [1, 50, 199, 200, 201, 400])
@pytest.mark.parametrize("opener", ["(", "(?:"])
def test_deep_nesting(monkeypatch, depth, opener):
    pattern = opener * depth + "a" + ")" * depth
    handled = check_parse(pattern)
    assert handled == (depth <= 200)
    check_compile(monkeypatch, pattern)


# ---- anchors ---------------------------------------------------------------------------------------
# Every anchor placement _strip_anchors accepts (left) and refuses or the parser rejects (right); the
# fast path must handle exactly the accepted ones (else it silently falls back to the Python parser).
ANCHOR_CASES = [
    "^$", "^", "$", "\\A", "\\Z", "\\A\\Z", "^^", "$$", "^$^$", "^a|b$", "^a$|^b$", "(^a)", "(a$)", "(^a$)", "((^a))b",
    "(?:^a|b)?c", "(?:a|b$)?", "a(?:b$|c$)", "(^a)?b", "(^a){0,1}b", "(^a){0}b", "x(a$){1}", "()^a", "(?:)^a$()",
    "^()a", "^(|)a", "(^)a", "(^)(^)a($)", "^(a|^b)", "(a|b$)$", "^\\d{3}-\\d{4}$", "^[A-Z]+$", "\\A[0-9]+\\Z",
    "^(?:[a-z]+\\.)*[a-z]+$", "^é+$", "^😀$", "^\\w+@\\w+$", "(^a|b)(c|d$)", "^a{2}$", "^.$",
    "a^", "$a", "a\\A", "\\Zb", "^*", "$+", "^?", "^{2}", "\\A*", "(^)*", "(?:^)+", "(^|a)*", "(a$)*", "(^a)+",
    "(^a){2}", "(^a){1,2}", "a(^b)", "(a$)b", "(^$)a", "a(^$)", "(^)b(^)", "a|b^c", "[^]", "[$]", "[^$]", "^[^^]$",
    "\\$^", "^\\^", "(?:^)", "a(?:^|b)", "(?i)^a", "^(?P<n>a)$", "^a(?=b)", "^\\b", "^a\\1", "^[",
]


def _python_accepts(pattern: str) -> bool:
    return not isinstance(_python_flat(pattern, 1000), Exception)


@pytest.mark.parametrize("pattern", ANCHOR_CASES)
def test_anchor_cases(monkeypatch, pattern):
    handled = check_parse(pattern)
    in_subset = not any(x in pattern for x in ("(?i)", "(?P", "(?=", "\\b", "\\1"))
    assert handled == (_python_accepts(pattern) and in_subset), pattern
    check_compile(monkeypatch, pattern)


_ANCHOR_TOKENS = st.sampled_from(["^", "$", "\\A", "\\Z"])


def _check_spliced(monkeypatch, pattern: str, inserts: list[tuple[int, str]]) -> None:
    """``pattern`` with each ``(position, text)`` inserted (clamped to its end), then parsed and
    compiled both ways."""
    for pos, tok in sorted(inserts, reverse=True):
        pos = min(pos, len(pattern))
        pattern = pattern[:pos] + tok + pattern[pos:]
    check_parse(pattern)
    check_compile(monkeypatch, pattern, SMALL)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(regexes, st.lists(st.tuples(st.integers(0, 40), _ANCHOR_TOKENS), min_size=1, max_size=3))
def test_anchors_anywhere(monkeypatch, pattern, inserts):
    """Anchors spliced in at random places (inside groups, classes, before quantifiers, ...)."""
    _check_spliced(monkeypatch, pattern, inserts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(regexes, st.sampled_from(["^", "\\A", ""]), st.sampled_from(["$", "\\Z", ""]))
def test_anchoring_keeps_the_fast_path(pattern, start, end):
    """Anchoring a pattern at its ends never makes the fast path decline it."""
    assert check_parse(start + pattern + end) == check_parse(pattern)
    assert check_parse("(?:" + start + pattern + end + ")") == check_parse(pattern)


# ---- '{' as a literal -----------------------------------------------------------------------------------
BRACE_CASES = ["{", "a{", "a{b", "a{b}c", "{}", "a{}", "a{,", "a{1", "a{1,", "a{1,2", "a{x}", "a{1x}", "a{,x}", "{a}",
               "a{ 1}", "a{1 }", "a{-1}", "{{", "a{{1}", "a{1}}", "[{]{2}", "({)", "(a{)+", "a|{", "{|}", "\\d{", "é{é",
               "a{٣}", "{0}", "{,}", "a{{", "^{$"]


@pytest.mark.parametrize("pattern", BRACE_CASES)
def test_brace_literals(monkeypatch, pattern):
    handled = check_parse(pattern)
    assert handled == _python_accepts(pattern), pattern
    check_compile(monkeypatch, pattern)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(regexes, st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["{", "}", "{1", "{,", "{2,3", "{x"])),
                         min_size=1, max_size=3))
def test_braces_anywhere(monkeypatch, pattern, inserts):
    _check_spliced(monkeypatch, pattern, inserts)


# ---- the C fragment cache -------------------------------------------------------------------------------
class _Counting:
    """A fragment function that counts its calls (a fresh object: its own cache entries)."""

    def __init__(self, fn=_charset_fragment):
        self.fn = fn
        self.calls = 0

    def __call__(self, ranges):
        self.calls += 1
        return self.fn(ranges)


BUILD = (1000, 1 << 20, 10**5, 60.0, 1 << 30)


def test_fragment_cache_skips_the_callback_and_gives_the_same_dfa():
    """The cache is process-wide and bounded (256 fragments; beyond that nothing more is cached),
    so what the tests before this one compiled can have filled it: the check runs in a fresh
    interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "from tests.fsm.test_fast_parser import check_fragment_cache; check_fragment_cache()"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def check_fragment_cache() -> None:
    """Compiling the same pattern again with the same fragment function never calls it again, and
    gives the same DFA (run by the test above in a fresh interpreter)."""
    _install_tables()
    pattern = "\\w+[^\"\\\\]*.{1,3}[é-ü]|😀[\\d٣]"
    fn = _Counting()
    first = mod.compile_regex(pattern, *BUILD, fn)
    assert fn.calls == 6  # \w, [^"\\], ., [é-ü], 😀, [\d٣] (\d is Unicode)
    entries = mod.fragment_cache_info()[0]
    for _ in range(3):
        again = mod.compile_regex(pattern, *BUILD, fn)
        assert fn.calls == 6
        assert all(a == b for a, b in zip(first, again))
    assert mod.fragment_cache_info()[0] == entries
    assert tuple(first) == tuple(mod.compile_regex(pattern, *BUILD, _charset_fragment))


def test_fragment_cache_is_per_function():
    """Another function's fragments are never served for this one (a bad one still raises)."""
    mod.compile_regex("é", *BUILD, _charset_fragment)
    with pytest.raises(TypeError):
        mod.compile_regex("é", *BUILD, lambda r: "nope")
    with pytest.raises(ValueError):  # nor is an invalid fragment cached
        mod.compile_regex("é", *BUILD, _Counting(lambda r: (2, ((0, 0, 300, 1),), 1)))
    bad = _Counting(lambda r: (2, ((0, 0, 300, 1),), 1))
    for _ in range(2):
        with pytest.raises(ValueError):
            mod.compile_regex("é", *BUILD, bad)
    assert bad.calls == 2


def test_fragment_cache_under_threads(monkeypatch):
    """Threads compiling non-ASCII sets at once (callbacks switch threads) get pure-Python DFAs."""
    import threading

    patterns = ["[à-ÿ]{1,3}", "[^\"\\\\]+é", "\\w\\s\\d", ".{2}€", "[Ā-ſ]|[Ѐ-ӿ]+", "(?:😀|😁)*[一-龥]"]
    monkeypatch.setenv("TOKENRAILS_NATIVE", "0")
    expected = {p: compile_regex(p, LIMITS) for p in patterns}
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1")
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(60):
            p = patterns[(i + k) % len(patterns)]
            got = compile_regex(p, LIMITS)
            if not (np.array_equal(got.trans, expected[p].trans) and np.array_equal(got.accepting, expected[p].accepting)):
                errors.append(p)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_fragment_cache_is_bounded_in_a_fresh_process():
    """Past its entry bound the cache stops growing; fragments still come from the callback and
    the programs still equal the Python parser's."""
    code = (
        "from tokenrails import _dfa_native as mod\n"
        "from tokenrails.guided.fsm.nfa import _charset_fragment, flatten_ast\n"
        "from tokenrails.guided.fsm.regex_parser import parse_regex\n"
        "args = (1000, 1 << 20, 10**5, 60.0, 1 << 30)\n"
        "calls = [0]\n"
        "def fn(r):\n"
        "    calls[0] += 1\n"
        "    return _charset_fragment(r)\n"
        "for i in range(300):\n"
        "    p = '[' + chr(0x100 + 3 * i) + '-' + chr(0x101 + 3 * i) + ']'\n"
        "    assert isinstance(mod.compile_regex(p, *args, fn), tuple)\n"
        "    assert mod.parse_regex_program(p, 1000)[0] == flatten_ast(parse_regex(p))[0]\n"
        "entries, size = mod.fragment_cache_info()\n"
        "assert entries == 256 and 0 < size <= 8 << 20, (entries, size)\n"
        "assert calls[0] == 300\n"
        "mod.compile_regex('[' + chr(0x100 + 3 * 299) + '-' + chr(0x101 + 3 * 299) + ']', *args, fn)\n"
        "assert calls[0] == 301 and mod.fragment_cache_info()[0] == 256\n"
        "mod.compile_regex('[' + chr(0x100) + '-' + chr(0x101) + ']', *args, fn)\n"
        "assert calls[0] == 301\n"
        "print('ok')\n"
    )
    _run_fresh(code)


def test_handles_the_common_subset():
    """Things the fast path must not decline (else it would silently fall back everywhere)."""
    for p in ["abc", "a|b|c", "(a|b)*", "(?:ab)+?", "[^\"\\\\]*", r"\d+\.\d*", r"\w\s\W\S\D", ".{2,5}", r"\x41\u00e9",
              r"\U0001F600", r"[\]\-\\]", "a{,3}", "[]a]", "[a-]", r"\t\n\r\f\v\a", "é😀", "}]", "^a$", r"\A\d+\Z",
              "^(a|b)$|^c$", "a{b}", "{"]:
        assert check_parse(p), p


def test_limit_errors_match(monkeypatch):
    check_compile(monkeypatch, "a{1001}")  # max_repeat: raised by the Python parser after the decline
    check_compile(monkeypatch, "(a|b)*a(a|b){12}", LIMITS.replace(max_dfa_states=100))  # state limit in C
    check_compile(monkeypatch, "(((a{1000}){1000}){1000})")  # expanded-size guard
    check_compile(monkeypatch, "[0-9]{1000}[a-z]{1000}", LIMITS.replace(max_dfa_states=500))  # NFA size
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1")
    _no_python_parser(monkeypatch)
    with pytest.raises(GuideTimeoutError):  # handled by the fast path, deadline in C
        compile_regex("(a|b)*a(a|b){18}", LIMITS.replace(compile_timeout_s=0.002, max_dfa_states=10**6))
    with pytest.raises(GuideLimitError) as err:
        compile_regex("(a|b)*a(a|b){12}", LIMITS.replace(max_dfa_states=100))
    assert err.value.limit == "max_dfa_states"


def test_non_str_and_bad_arguments():
    assert mod.parse_regex_program(b"abc", 10) is None
    assert mod.compile_regex(123, 10, 1024, 100, 1.0, 1 << 20, _charset_fragment) is None
    with pytest.raises(TypeError):
        mod.compile_regex("a", 10, 1024, 100, 1.0, 1 << 20, None)
    with pytest.raises(ValueError):
        mod.compile_regex("a", 10, -1, 100, 1.0, 1 << 20, _charset_fragment)
    with pytest.raises(TypeError):  # a bad fragment from the callback raises, never crashes
        mod.compile_regex("é", 10, 1024, 100, 1.0, 1 << 20, lambda r: "nope")
    with pytest.raises(ValueError):
        mod.compile_regex("é", 10, 1024, 100, 1.0, 1 << 20, lambda r: (2, ((0, 0, 300, 1),), 1))
    with pytest.raises(ValueError):
        mod.set_class_ranges(3, ())
    with pytest.raises(ValueError):  # not normalized
        mod.set_class_ranges(0, ((5, 9), (1, 2)))
    with pytest.raises(TypeError):
        mod.set_class_ranges(0, [[1, 2]])
    _install_tables()  # leave the real tables installed
    assert check_parse(r"\d\w\s")


@needs_proc
def test_no_memory_growth_over_repeated_calls():
    _install_tables()
    args = (1000, 1 << 20, 10**5, 60.0, 1 << 30)
    handled = "[^\"\\\\]{0,4}\\d+é|[a-z]{2,}" * 3
    declined_late = "[a-z]+(abc|\\w)*[é-ü]{2}(?i)x"  # declines after sets, nodes and a class were built

    anchored = "^(?:[^\"\\\\]{0,4}\\d+é$|\\A[a-z]{2,}$)|x{y"

    def work():
        assert isinstance(mod.compile_regex(handled, *args, _charset_fragment), tuple)
        assert isinstance(mod.compile_regex(anchored, *args, _charset_fragment), tuple)
        assert mod.compile_regex("^a(b^c)*d$" + handled, *args, _charset_fragment) is None  # refused anchor
        assert mod.compile_regex(declined_late, *args, _charset_fragment) is None
        assert mod.compile_regex("(a|b)*a(a|b){12}", 1000, 1 << 20, 100, 60.0, 1 << 30, _charset_fragment)[0] == 1
        assert mod.parse_regex_program(handled, 1000)[0]
        try:
            mod.compile_regex(handled, *args, lambda r: None)
        except TypeError:
            pass

    work()
    cached = mod.fragment_cache_info()
    assert_flat_rss(work)
    assert mod.fragment_cache_info() == cached


def test_first_use_of_class_escapes_in_a_fresh_process():
    """Without installed tables the fast path asks for them, compile_regex installs them and
    retries; the Python parser never runs and the DFA is the pure-Python one."""
    code = (
        "import os, numpy as np\n"
        "from tokenrails import _dfa_native as mod\n"
        "from tokenrails.guided.fsm import compiler\n"
        "from tokenrails.guided.limits import GuideLimits\n"
        "assert mod.parse_regex_program(r'\\d', 10) == 1 and mod.parse_regex_program(r'[\\s\\W]', 10) in (2, 4)\n"
        "orig = compiler.parse_regex\n"
        "compiler.parse_regex = lambda *a: (_ for _ in ()).throw(AssertionError('Python parser ran'))\n"
        "fast = compiler.compile_regex(r'\\d+[\\w-]\\s\\S\\D', GuideLimits())\n"
        "compiler.parse_regex = orig\n"
        "os.environ['TOKENRAILS_NATIVE'] = '0'\n"
        "pure = compiler.compile_regex(r'\\d+[\\w-]\\s\\S\\D', GuideLimits())\n"
        "assert all(np.array_equal(getattr(fast, k), getattr(pure, k)) for k in ('trans', 'classmap', 'accepting'))\n"
        "print('ok')\n"
    )
    _run_fresh(code)


def _run_fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter (nothing installed or cached yet); it prints ok."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "TOKENRAILS_NATIVE": "1"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]

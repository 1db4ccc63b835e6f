"""The C automaton builder (tokenrails._dfa_native) against the Python path it replaces.

Both number the minimal DFA canonically (0 dead, 1 start, BFS over classes) over the same byte
classes, so their tables must be *identical* arrays, not just equivalent automata. Also: the limit,
deadline, memory and empty-language outcomes map to the same exceptions; malformed input raises
(never crashes); repeated compiles do not grow memory; concurrent compiles (the GIL is released)
agree.
"""
from __future__ import annotations

import json
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideLimitError, GuideTimeoutError, InvalidGuideError
from tokenrails.guided.fsm.compiler import NFA_STATES_PER_DFA_STATE, compile_ast, compile_choices, compile_regex
from tokenrails.guided.fsm.compiler import compile_ast_native
from tokenrails.guided.fsm.deadline import Deadline
from tokenrails.guided.fsm.dfa import DEAD, START
from tokenrails.guided.fsm.native_builder import determinize, dfa_from_strings
from tokenrails.guided.fsm.nfa import ByteNFA
from tokenrails.guided.fsm.regex_ast import CharSet, Concat, Repeat
from tokenrails.guided.fsm.thompson import AST_TYPES, build_thompson, charset_fragment, flatten_ast
from tokenrails.guided.fsm.regex_parser import parse_regex
from tokenrails.guided.limits import GuideLimits

from .regex_strategies import anchored
from .test_compile_construction import CORPUS, _reference_minimal_form, dfa_form
from tests.fsm.leaks import assert_flat_rss, needs_proc

mod = pytest.importorskip("tokenrails._dfa_native")
LIMITS = GuideLimits()


def _set_native(monkeypatch, on: bool) -> None:
    monkeypatch.setenv("TOKENRAILS_NATIVE", "1" if on else "0")


def both(monkeypatch, fn, *args, **kwargs):
    """(python result or exception, native result or exception)."""
    out = []
    for on in (False, True):
        _set_native(monkeypatch, on)
        try:
            out.append(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 -- compared below
            out.append(exc)
    _set_native(monkeypatch, True)
    return out


def assert_identical(py, nat) -> None:
    if isinstance(py, Exception) or isinstance(nat, Exception):
        assert type(py) is type(nat), (py, nat)
        assert str(py) == str(nat)
        assert getattr(py, "limit", None) == getattr(nat, "limit", None)
        assert getattr(py, "value", None) == getattr(nat, "value", None)
        return
    assert py.trans.dtype == nat.trans.dtype == np.int32
    assert np.array_equal(py.classmap, nat.classmap)
    assert np.array_equal(py.accepting, nat.accepting)
    assert np.array_equal(py.trans, nat.trans)
    assert py.rows == nat.rows and py.forced == nat.forced and py.cls == nat.cls


JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                                      "email": {"type": "string", "format": "email"}},
     "required": ["name", "age", "email"]},
    {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "qty", "price"]}, "minItems": 1, "maxItems": 3},
        "status": {"enum": ["new", "paid", "shipped"]}}, "required": ["id", "items", "status"]},
]


def _json_regex(schema) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    return build_regex_from_schema(json.dumps(schema))


# ---- identical DFAs --------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", CORPUS + [r"", r"a{0}", r"(|a)", r"(a|b|)*", r"[^\x00-\x7f]{1,3}x?"])
def test_corpus_identical(monkeypatch, pattern):
    assert_identical(*both(monkeypatch, compile_regex, pattern, LIMITS))


@pytest.mark.parametrize("schema", JSON_SCHEMAS)
def test_json_lowered_identical(monkeypatch, schema):
    py, nat = both(monkeypatch, compile_regex, _json_regex(schema), LIMITS, check_length=False)
    assert not isinstance(nat, Exception) and nat.num_states > 100
    assert_identical(py, nat)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pattern=anchored)
def test_random_regexes_identical(monkeypatch, pattern):
    assert_identical(*both(monkeypatch, compile_regex, pattern, LIMITS))


texts = st.text(alphabet=st.sampled_from("ab-é😀x.\x00\xff"), max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choices=st.lists(texts, min_size=0, max_size=15))
def test_random_choices_identical(monkeypatch, choices):
    py, nat = both(monkeypatch, compile_choices, choices, LIMITS)
    assert_identical(py, nat)
    if not isinstance(nat, Exception):
        for s in choices + ["", "ab", "x"]:
            assert nat.fullmatch(s.encode()) == (s in choices)


def test_large_choice_set_identical(monkeypatch):
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    choices = [f"{words[i % 10]} {words[(i // 10) % 10]} #{i:03d}" for i in range(300)] + ["", "é😀"]
    assert_identical(*both(monkeypatch, compile_choices, choices, LIMITS))


def _random_byte_nfa(rng: random.Random) -> ByteNFA:
    n = rng.randint(1, 25)
    edges = []
    for _ in range(n):
        es = []
        for _ in range(rng.randint(0, 4)):
            lo = rng.choice([0, 10, 97, 98, 99, 128, 200, 255])
            hi = min(255, lo + rng.choice([0, 0, 1, 2, 30, 255]))
            es.append((lo, hi, rng.randrange(n)))
        edges.append(sorted(set(es)))
    return ByteNFA(edges, [rng.random() < 0.3 for _ in range(n)])


@pytest.mark.parametrize("seed", range(60))
def test_epsilon_free_nfas_identical_and_minimal(monkeypatch, seed):
    """Random (often nondeterministic, cyclic) epsilon-free NFAs: same DFA both ways, and minimal
    by the naive refinement reference."""
    nfa = _random_byte_nfa(random.Random(seed))
    py, nat = both(monkeypatch, determinize, nfa, 10_000, Deadline(60))
    assert_identical(py, nat)
    if not isinstance(nat, Exception):
        rows = [[nat.rows[s][nat.cls[b]] for b in range(256)] for s in range(nat.num_states)]
        assert dfa_form(nat) == _reference_minimal_form(rows, nat.accepting_list, START)


def test_thompson_program_matches_python_nfa():
    """flatten_ast + the C Thompson construction give the DFA of the Python ThompsonNFA."""
    for pattern in CORPUS:
        node = parse_regex(pattern, LIMITS.max_repeat)
        thompson, start, accept = build_thompson(node, 1 << 20, Deadline(60))
        via_lists = mod.determinize(thompson.eps, thompson.edges, start, [accept], 10**6, 60.0, 1 << 30)
        via_ast = mod.compile_ast(*flatten_ast(node), 1 << 20, 10**6, 60.0, 1 << 30)
        assert via_lists == via_ast, pattern


@given(anchored)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_tree_walk_gives_the_flattened_program(pattern):
    """compile_tree walks the AST in C into the program flatten_ast builds in Python: same result,
    including the expanded-size and state-limit outcomes."""
    try:
        node = parse_regex(pattern, LIMITS.max_repeat)
    except Exception:  # noqa: BLE001 -- the parser's refusals are tested elsewhere
        return
    for max_nfa, max_states in ((1 << 20, 10**6), (64, 32)):
        via_tree = mod.compile_tree(node, AST_TYPES, charset_fragment, max_nfa, max_states, 60.0, 1 << 30)
        assert via_tree == mod.compile_ast(*flatten_ast(node), max_nfa, max_states, 60.0, 1 << 30), pattern


def test_tree_walk_corpus_and_json():
    patterns = CORPUS + [_json_regex(s) for s in JSON_SCHEMAS]
    for pattern in patterns:
        node = parse_regex(pattern, LIMITS.max_repeat)
        via_tree = mod.compile_tree(node, AST_TYPES, charset_fragment, 1 << 20, 10**6, 60.0, 1 << 30)
        assert via_tree == mod.compile_ast(*flatten_ast(node), 1 << 20, 10**6, 60.0, 1 << 30), pattern


def test_tree_walk_rejects_what_is_not_an_ast():
    class Other:
        pass

    bad = [
        (Other(), AST_TYPES, charset_fragment, TypeError),
        (Concat((CharSet(((97, 97),)), Other())), AST_TYPES, charset_fragment, TypeError),
        (Concat([CharSet(((97, 97),))]), AST_TYPES, charset_fragment, TypeError),  # items not a tuple
        (Concat(()), AST_TYPES, charset_fragment, ValueError),                       # bad item count
        (Repeat(CharSet(((97, 97),)), -2, None), AST_TYPES, charset_fragment, ValueError),
        (Repeat(CharSet(((97, 97),)), 3, 2), AST_TYPES, charset_fragment, ValueError),
        (CharSet(((97, 97),)), AST_TYPES[:4], charset_fragment, TypeError),
        (CharSet(((97, 97),)), AST_TYPES, None, TypeError),
        (CharSet(((97, 97),)), AST_TYPES, lambda ranges: (1, (), 0), ValueError),    # bad fragment
        (CharSet(((97, 97),)), AST_TYPES, lambda ranges: 1 / 0, ZeroDivisionError),
    ]
    for node, types, fragment, exc in bad:
        with pytest.raises(exc):
            mod.compile_tree(node, types, fragment, 1000, 100, 1.0, 1 << 20)
    deep = CharSet(((97, 97),))
    for _ in range(5000):
        deep = Repeat(deep, 0, 1)
    with pytest.raises(ValueError):  # nested deeper than the builder takes: refused, not a crash
        mod.compile_tree(deep, AST_TYPES, charset_fragment, 1 << 20, 1000, 1.0, 1 << 30)


# ---- limits, deadline, memory, empty language ----------------------------------------------------
def test_state_limit_same_error(monkeypatch):
    py, nat = both(monkeypatch, compile_regex, r"(a|b)*a(a|b){12}", LIMITS.replace(max_dfa_states=500))
    assert isinstance(nat, GuideLimitError) and nat.limit == "max_dfa_states" and nat.value == 501
    assert_identical(py, nat)


def test_expanded_size_and_nfa_limits_same_error(monkeypatch):
    small = LIMITS.replace(max_dfa_states=100)
    for pattern in [r"(ab{100}){100}", r"(a{600}|b)"]:
        py, nat = both(monkeypatch, compile_regex, pattern, small)
        assert isinstance(nat, GuideLimitError), pattern
        assert_identical(py, nat)
    # a Thompson NFA over max_nfa states whose expanded size is below it (character sets expand to
    # several states each): the NFA-size guard
    node = parse_regex(r"[\u0100-\uffff]{300}", LIMITS.max_repeat)
    py, nat = both(monkeypatch, compile_ast, node, LIMITS.replace(max_dfa_states=256))
    assert isinstance(nat, GuideLimitError) and "automaton states" in str(nat)
    assert_identical(py, nat)


def test_choice_limit_same_error(monkeypatch):
    choices = [chr(65 + i % 26) * 50 + str(i) for i in range(100)]
    py, nat = both(monkeypatch, compile_choices, choices, LIMITS.replace(max_dfa_states=100))
    assert isinstance(nat, GuideLimitError)
    assert_identical(py, nat)


def test_empty_language_same_error(monkeypatch):
    for fn, arg in [(compile_choices, []), (determinize, ByteNFA([[(97, 97, 0)]], [False]))]:
        if fn is determinize:
            py, nat = both(monkeypatch, fn, arg, 100, Deadline(60))
        else:
            py, nat = both(monkeypatch, fn, arg, LIMITS)
        assert isinstance(nat, InvalidGuideError)
        assert_identical(py, nat)


def test_deadline_is_honoured():
    limits = LIMITS.replace(compile_timeout_s=0.002, max_dfa_states=10**6)
    with pytest.raises(GuideTimeoutError):  # 2**19 subset states: far more than 2 ms of work
        compile_regex(r"(a|b)*a(a|b){18}", limits)
    node = parse_regex(r"(a|b)*a(a|b){18}", LIMITS.max_repeat)
    assert mod.compile_ast(*flatten_ast(node), 1 << 20, 10**6, 0.0, 1 << 30)[0] == 2


def test_memory_bound_refuses():
    node = parse_regex(r"(a|b)*a(a|b){10}", LIMITS.max_repeat)
    with pytest.raises(GuideLimitError, match="working memory"):
        compile_ast_native(mod, node, 1 << 20, 10**6, Deadline(60), max_bytes=100_000)
    code, needed = mod.compile_ast(*flatten_ast(node), 1 << 20, 10**6, 60.0, 100_000)
    assert code == 3 and needed > 100_000
    assert mod.from_strings([b"abc" * 100], 10**6, 60.0, 1000)[0] == 3
    ok = compile_ast_native(mod, node, 1 << 20, 10**6, Deadline(60))  # the default bound suffices
    assert ok.num_states == 2**11 + 1


# ---- bad input never crashes --------------------------------------------------------------------
BAD_DETERMINIZE = [
    ([[]], [[(0, 0, 1)]], 0, [0]),          # edge target out of range
    ([[]], [[(5, 4, 0)]], 0, [0]),          # lo > hi
    ([[]], [[(0, 256, 0)]], 0, [0]),        # hi > 255
    ([[]], [[(-1, 3, 0)]], 0, [0]),
    ([[7]], [[]], 0, [0]),                  # epsilon target out of range
    ([[], []], [[]], 0, [0]),               # eps / edges length mismatch
    (None, [[]], 1, [0]),                   # start out of range
    (None, [[]], 0, [3]),                   # accepting out of range
    (None, [], 0, []),                      # no states
    (None, [[(0, 0)]], 0, [0]),             # edge arity
    (None, [[[0, 0, 0]]], 0, [0]),          # edge type
    (None, [None], 0, [0]),
    (None, "abc", 0, [0]),
    ("x", [[]], 0, [0]),
    (None, [[(0, 0, 2**40)]], 0, [0]),
]


@pytest.mark.parametrize("args", BAD_DETERMINIZE)
def test_determinize_rejects_bad_input(args):
    with pytest.raises((ValueError, TypeError, OverflowError)):
        mod.determinize(*args, 100, 1.0, 1 << 20)


FRAG = (2, ((0, 97, 97, 1),), 1)
BAD_AST = [
    ([], [FRAG]),                 # empty program
    ([0], [FRAG]),                # truncated
    ([0, 1], [FRAG]),             # fragment id out of range
    ([0, 0, 4], [FRAG]),          # trailing entries
    ([9], [FRAG]),                # unknown kind
    ([1, 0], [FRAG]),             # concat of nothing
    ([1, 3, 0, 0], [FRAG]),       # concat with missing children
    ([3, 2, 1, 4], [FRAG]),       # max < min
    ([3, -1, 2, 4], [FRAG]),      # negative min
    ([0, 0], [(2, ((0, 97, 97, 0),), 1)]),   # edge into the fragment start
    ([0, 0], [(2, ((0, 97, 97, 2),), 1)]),   # edge target out of range
    ([0, 0], [(1, (), 0)]),                  # fragment too small
    ([0, 0], [(2, ((0, 98, 97, 1),), 1)]),   # lo > hi
    ([0, 0], [(2, [(0, 97, 97, 1)], 1)]),    # edges not a tuple
    ([0, 0], [(2, ((0, 97, 97),), 1)]),      # edge arity
    ([0, 0], "frags"),
    ("prog", [FRAG]),
    ([1, 1] * 5000 + [4], []),               # nested too deeply
]


@pytest.mark.parametrize("prog,frags", BAD_AST)
def test_compile_ast_rejects_bad_input(prog, frags):
    with pytest.raises((ValueError, TypeError, OverflowError)):
        mod.compile_ast(prog, frags, 1000, 100, 1.0, 1 << 20)


def test_from_strings_rejects_bad_input():
    for bad in (["abc"], [b"a", None], "abc", [bytearray(b"a")]):
        with pytest.raises(TypeError):
            mod.from_strings(bad, 100, 1.0, 1 << 20)
    with pytest.raises(TypeError):
        mod.determinize(None, [[]], 0)


small_ints = st.integers(min_value=-2, max_value=6)


@settings(max_examples=300, deadline=None)
@given(prog=st.lists(small_ints, max_size=12),
       frags=st.lists(st.tuples(small_ints, st.lists(st.tuples(small_ints, small_ints, small_ints, small_ints),
                                                       max_size=3).map(tuple), small_ints), max_size=3))
def test_compile_ast_fuzz_never_crashes(prog, frags):
    try:
        result = mod.compile_ast(prog, frags, 1000, 100, 1.0, 1 << 20)
    except (ValueError, TypeError):
        return
    assert isinstance(result, tuple) and len(result) in (2, 5)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4), edges=st.lists(st.lists(st.tuples(small_ints, small_ints, small_ints), max_size=3), max_size=5),
       eps=st.one_of(st.none(), st.lists(st.lists(small_ints, max_size=2), max_size=5)),
       start=small_ints, acc=st.lists(small_ints, max_size=3))
def test_determinize_fuzz_never_crashes(n, edges, eps, start, acc):
    try:
        result = mod.determinize(eps, edges, start, acc, 100, 1.0, 1 << 20)
    except (ValueError, TypeError):
        return
    assert isinstance(result, tuple) and len(result) in (2, 5)


# ---- resources ----------------------------------------------------------------------------------
@needs_proc
def test_no_memory_growth_over_repeated_compiles():
    pattern = _json_regex(JSON_SCHEMAS[0])
    node = parse_regex(pattern, LIMITS.max_repeat)
    prog, frags = flatten_ast(node)
    exploding = flatten_ast(parse_regex(r"(a|b)*a(a|b){12}", LIMITS.max_repeat))
    choices = [f"choice {i}".encode() for i in range(50)]

    def work():
        mod.compile_ast(prog, frags, 1 << 20, 10**5, 60.0, 1 << 30)
        assert mod.compile_ast(*exploding, 1 << 20, 100, 60.0, 1 << 30)[0] == 1        # limit path
        assert mod.compile_ast(*exploding, 1 << 20, 10**5, 60.0, 10_000)[0] == 3       # memory path
        mod.from_strings(choices, 10**5, 60.0, 1 << 30)
        try:
            mod.compile_ast([0, 5], frags, 1000, 100, 1.0, 1 << 20)
        except ValueError:
            pass

    assert_flat_rss(work)


def test_concurrent_compiles_agree():
    patterns = [_json_regex(JSON_SCHEMAS[1])] + CORPUS[:8]
    expected = {p: compile_regex(p, LIMITS, check_length=False) for p in patterns}
    errors: list[BaseException] = []

    def run():
        try:
            for _ in range(5):
                for p in patterns:
                    d = compile_regex(p, LIMITS, check_length=False)
                    assert np.array_equal(d.trans, expected[p].trans)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ---- the DFA object's lazy rows -----------------------------------------------------------------
def test_lazy_rows_and_walk(monkeypatch):
    _set_native(monkeypatch, True)
    dfa = compile_regex(r"[a-z]+@[a-z]+\.(com|org)", LIMITS)
    assert dfa.walk(START, b"ab@cd.com") != DEAD and dfa.fullmatch(b"ab@cd.org")
    assert not dfa.fullmatch(b"ab@cd.net")
    partial = [r for r in dfa._row_cache if r is not None]
    assert 0 < len(partial) < dfa.num_states  # only the visited rows were converted
    assert dfa.rows == dfa.trans.tolist()
    assert dfa.walk(START, b"x@y.com") == compile_regex(r"[a-z]+@[a-z]+\.(com|org)", LIMITS).walk(START, b"x@y.com")
    forced = dfa.forced
    assert len(forced) == dfa.num_states and forced[DEAD] == -1
    at = dfa.walk(START, b"ab@cd.c")  # only "om" can follow
    assert forced[at] == ord("o")


def test_choices_helper_uses_native_by_default():
    assert dfa_from_strings([b"cats", b"dogs"], 100, Deadline(60)).num_states == 8
    assert NFA_STATES_PER_DFA_STATE >= 1

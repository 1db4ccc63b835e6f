"""The fast construction paths (sparse subset construction, block-splitter Hopcroft, direct acyclic
DFA for choices) build exactly the minimal DFA: compared, in canonical form, with a brute-force
textbook reference (subset construction over all 256 bytes + naive Moore refinement).

Minimal DFAs of one language are unique up to isomorphism, so the canonical forms (BFS numbering
over bytes 0..255, dead state omitted) must be identical, state counts included.
"""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideLimitError, InvalidGuideError
from tokenrails.guided.fsm.compiler import compile_ast, compile_choices, compile_regex
from tokenrails.guided.fsm.deadline import Deadline
from tokenrails.guided.fsm.dfa import DEAD, START, DFA
from tokenrails.guided.fsm.dfa_fallback import hopcroft, prune_dead_ends
from tokenrails.guided.fsm.native_builder import dfa_from_strings
from tokenrails.guided.fsm.nfa import ByteNFA
from tokenrails.guided.fsm.thompson import build_nfa
from tokenrails.guided.fsm.regex_parser import parse_regex
from tokenrails.guided.limits import GuideLimits

from .regex_strategies import anchored

LIMITS = GuideLimits()


# ---- reference: textbook constructions, no byte classes, no sparse rows -------------------------
def _reference_nfa_dfa(nfa: ByteNFA) -> tuple[list[list[int]], list[bool]]:
    """Subset construction over all 256 bytes; state 0 = the empty set."""
    keys: dict[frozenset, int] = {frozenset(): 0, frozenset({0}): 1}
    order = [frozenset(), frozenset({0})]
    rows: list[list[int]] = []
    acc: list[bool] = []
    i = 0
    while i < len(order):
        key = order[i]
        i += 1
        acc.append(any(nfa.accepting[p] for p in key))
        row = []
        for b in range(256):
            nxt = frozenset(t for p in key for lo, hi, t in nfa.edges[p] if lo <= b <= hi)
            j = keys.get(nxt)
            if j is None:
                j = keys[nxt] = len(order)
                order.append(nxt)
            row.append(j)
        rows.append(row)
    return rows, acc


def _reference_minimal_form(rows: list[list[int]], acc: list[bool], start: int) -> tuple:
    """Naive Moore refinement of the trimmed DFA, then the canonical form."""
    n = len(rows)
    live = [bool(a) for a in acc]
    changed = True
    while changed:  # co-reachability by fixpoint
        changed = False
        for s in range(n):
            if not live[s] and any(live[t] for t in rows[s]):
                live[s] = changed = True
    if not live[start]:
        return ()
    block = [(1 + int(acc[s])) if live[s] else 0 for s in range(n)]
    while True:
        sigs: dict[tuple, int] = {}
        new = [sigs.setdefault((block[s], tuple(block[t] for t in rows[s])), len(sigs)) for s in range(n)]
        if len(sigs) == len(set(block)):
            break
        block = new
    dead = {s for s in range(n) if not live[s]}
    return _canonical(lambda s, b: rows[s][b], lambda s: acc[s], start, lambda s: s in dead, block)


def _canonical(step, accepts, start, is_dead, block=None) -> tuple:
    """BFS over bytes 0..255 from the start; states identified by ``block`` (default: identity)."""
    key = (lambda s: block[s]) if block is not None else (lambda s: s)
    ids = {key(start): 0}
    order = [start]
    form = []
    for s in order:
        row = []
        for b in range(256):
            t = step(s, b)
            if is_dead(t):
                row.append(-1)
                continue
            j = ids.get(key(t))
            if j is None:
                j = ids[key(t)] = len(order)
                order.append(t)
            row.append(j)
        form.append((bool(accepts(s)), tuple(row)))
    return tuple(form)


def dfa_form(dfa: DFA) -> tuple:
    return _canonical(lambda s, b: dfa.rows[s][dfa.cls[b]], lambda s: dfa.accepting_list[s], START,
                      lambda s: s == DEAD)


def reference_form(pattern: str) -> tuple:
    nfa = build_nfa(parse_regex(pattern, LIMITS.max_repeat), 1 << 20, Deadline(60))
    rows, acc = _reference_nfa_dfa(nfa)
    return _reference_minimal_form(rows, acc, 1)


def _is_minimal(dfa: DFA) -> None:
    assert dfa.num_states == len(dfa_form(dfa)) + 1  # every state reachable, one dead state
    rows = [[dfa.rows[s][dfa.cls[b]] for b in range(256)] for s in range(dfa.num_states)]
    assert len(_reference_minimal_form(rows, dfa.accepting_list, START)) == dfa.num_states - 1


# ---- regexes ----------------------------------------------------------------------------------
CORPUS = [
    r"a", r"ab|ac", r"(a|b)*a(a|b){4}", r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(\.[0-9]{1,3})?(Z|[+-][0-9]{2}:[0-9]{2})",
    r"((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])",
    r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}", r"\w+", r"\d{2,3}|\s", r"[^\"\\]{0,5}x",
    r"(ab|a)(bc|c)*", r"x*y*x*", r"(a*b*)*c", r"(?s).{0,3}", r"[é€😀]+|é", r"(a|ab)(c|bcd)(d*)",
    r"(\w|\.)+@\w+", r"(?:[^a]|a[^b])*", r"[\U00010000-\U0010ffff]{2}", r"\D\W\S",
]


@pytest.mark.parametrize("pattern", CORPUS)
def test_corpus_matches_reference_minimal_dfa(pattern):
    dfa = compile_regex(pattern, LIMITS)
    assert dfa_form(dfa) == reference_form(pattern)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=anchored)
def test_random_regexes_match_reference_minimal_dfa(pattern):
    try:
        dfa = compile_regex(pattern, LIMITS)
    except InvalidGuideError:  # empty language: the reference must agree
        assert reference_form(pattern) == ()
        return
    assert dfa_form(dfa) == reference_form(pattern)


def test_json_lowered_regexes_are_minimal():
    from outlines_core.json_schema import build_regex_from_schema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                               "n": {"type": "integer"}, "ok": {"type": "boolean"}},
              "required": ["name", "n"]}
    dfa = compile_regex(build_regex_from_schema(json.dumps(schema)), LIMITS, check_length=False)
    _is_minimal(dfa)


# ---- Hopcroft on random automata ----------------------------------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_hopcroft_equals_naive_refinement_on_random_dfas(seed):
    rng = random.Random(seed)
    n, k = rng.randint(2, 40), rng.randint(1, 6)
    rows = [[]]
    for _ in range(1, n):
        row, c = [], 0
        while c < k:
            hi = rng.randint(c, k - 1)
            t = rng.choice([DEAD, *range(1, n)])
            if t != DEAD:
                row.append((c, hi, t))
            c = hi + 1
        rows.append(row)
    accepting = [False] + [rng.random() < 0.3 for _ in range(1, n)]
    accepting[rng.randrange(1, n)] = True
    try:
        pruned, alive = prune_dead_ends(rows, accepting)
    except InvalidGuideError:
        return
    block_of = hopcroft(pruned, accepting, alive, Deadline(60))
    dense = [[DEAD] * k for _ in range(n)]
    for s, row in enumerate(pruned):
        for lo, hi, t in row:
            dense[s][lo:hi + 1] = [t] * (hi - lo + 1)
    # block equality == naive Moore equivalence, on every pair of states
    block = [1 + int(accepting[s]) if alive[s] else 0 for s in range(n)]
    while True:
        sigs: dict[tuple, int] = {}
        new = [sigs.setdefault((block[s], tuple(block[t] for t in dense[s])), len(sigs)) for s in range(n)]
        if len(sigs) == len(set(block)):
            break
        block = new
    for a in range(n):
        for b in range(n):
            assert (block_of[a] == block_of[b]) == (block[a] == block[b]), (seed, a, b)


# ---- choices ------------------------------------------------------------------------------------
def _alternation(choices: list[str]) -> str:
    return "(?:" + "|".join("".join("\\" + c if c in ".^$*+?()[]{}|\\-" else c for c in s) for s in choices) + ")"


words = st.lists(st.sampled_from(["a", "b", "ab", "é", "😀", "x", "", "-", "."]), max_size=4).map("".join)


@settings(max_examples=150, deadline=None)
@given(choices=st.lists(words, min_size=1, max_size=12))
def test_choice_dfa_equals_alternation_dfa(choices):
    direct = compile_choices(choices, LIMITS)
    assert dfa_form(direct) == dfa_form(compile_regex(_alternation(choices), LIMITS))
    for s in choices + ["", "ab", "aé", "xx"]:
        assert direct.fullmatch(s.encode()) == (s in choices)


def test_choice_dfa_shares_suffixes_and_is_minimal():
    choices = [f"{w} {v} #{i:03d}" for i, (w, v) in enumerate((w, v) for w in "abcdefghij" for v in "klmnopqrst")]
    dfa = compile_choices(choices, LIMITS)
    _is_minimal(dfa)
    assert dfa_form(dfa) == dfa_form(compile_regex(_alternation(choices), LIMITS))
    cats = dfa_from_strings([b"cats", b"dogs"], 100, Deadline(60))
    assert cats.num_states == 1 + 7  # c-a-t / d-o-g share "s" and the final state


def test_choice_limits():
    from tokenrails import GuideLimitError

    with pytest.raises(GuideLimitError):
        dfa_from_strings([bytes([65 + i % 26]) * 50 + str(i).encode() for i in range(100)], 100, Deadline(60))
    with pytest.raises(InvalidGuideError):
        dfa_from_strings([], 100, Deadline(60))


# ---- limits on the new paths --------------------------------------------------------------------
def test_unminimized_fallback_is_exact(monkeypatch):
    import tokenrails.guided.fsm.dfa_fallback as dfa_mod

    monkeypatch.setenv("TOKENRAILS_NATIVE", "0")  # the Python path's cutoff (the native builder always minimizes)
    pattern = r"(ab|a)(bc|c)*x{0,3}"
    minimal = compile_regex(pattern, LIMITS)
    monkeypatch.setattr(dfa_mod, "MINIMIZE_MAX_TRANSITIONS", 0)
    big = compile_regex(pattern, LIMITS)
    assert big.num_states > minimal.num_states  # really skipped minimization
    assert dfa_form(minimal) == _reference_minimal_form(
        [[big.rows[s][big.cls[b]] for b in range(256)] for s in range(big.num_states)], big.accepting_list, START)


def test_subset_and_minimization_respect_the_deadline():
    from tokenrails import GuideTimeoutError

    with pytest.raises(GuideTimeoutError):  # small NFA, 2**15 subset states: the subset loop times out
        compile_regex(r"(a|b)*a(a|b){14}", LIMITS.replace(compile_timeout_s=0.002))
    with pytest.raises(GuideTimeoutError):
        compile_choices([f"{i:06d}" for i in range(5000)], LIMITS.replace(compile_timeout_s=0.0))


# ---- parser caches ------------------------------------------------------------------------------
def test_parser_caches_do_not_change_the_ast():
    import tokenrails.guided.fsm.regex_parser as rp

    patterns = CORPUS + [r'"[^"\\]*"(,"[^"\\]*")*', r"(?a:[\w])[\w]", r"(?a)[\w]+", r"[\w]+", r"a]b}c", r"[]a][]a]x",
                         r"\d+\.\d{2,}(?a:\d+\w?)\d*\s", r"(?a)\d+\.\w{3}", r"\0a\012\0", r"\0\01\1234",
                         r"a{2}b{2}a{2,}a{,2}a{}a{,}a{2,3}?[ ]?[ ]*?x{0}", r"\{\}\[\]\\\"\é\n\t+",
                         r"(ab)?(ab)*(ab){2}", r"a{02}a{2}a{0002,0003}"]
    warm = [parse_regex(p, LIMITS.max_repeat) for p in patterns]  # fills the caches
    again = [parse_regex(p, LIMITS.max_repeat) for p in patterns]
    for cache in (rp._LITERALS, rp._CLASSES, rp._CLASS_TEXTS, *rp._ESCAPES, rp._REPEATS, rp._BRACES):
        cache.clear()
    cold = [parse_regex(p, LIMITS.max_repeat) for p in patterns]
    assert warm == again == cold
    for pattern, node in zip(patterns, cold):  # and one compile each, uncached, is the same language
        assert compile_regex(pattern, LIMITS).trans.tolist() == compile_ast(node, LIMITS).trans.tolist()


def test_escape_and_quantifier_caches_keep_context():
    """Escapes and quantifiers are served from their caches only where their text alone decides
    their meaning: the ASCII flag, octal digits, anchors, limits and errors still apply."""
    from tokenrails import UnsupportedGuideError
    from tokenrails.guided.fsm.regex_parser import RegexSyntaxError

    assert compile_regex(r"\d", LIMITS).fullmatch("٣".encode())          # Unicode digit
    assert not compile_regex(r"(?a)\d", LIMITS).fullmatch("٣".encode())  # \d cached above: ASCII here
    assert compile_regex(r"(?a:\d)\d", LIMITS).fullmatch("3٣".encode())
    assert compile_regex(r"\0", LIMITS).fullmatch(b"\x00")
    assert compile_regex(r"\012", LIMITS).fullmatch(b"\n")  # not \0 then "12"
    parse_regex(r"\Aa")
    with pytest.raises(UnsupportedGuideError):  # \A is an anchor wherever it stands
        parse_regex(r"a\A")
    parse_regex(r"a{3,5}")
    with pytest.raises(GuideLimitError):  # the bounds are cached, the limit is checked per parse
        parse_regex(r"a{3,5}", max_repeat=4)
    with pytest.raises(RegexSyntaxError):
        parse_regex(r"a{5,3}")
    with pytest.raises(RegexSyntaxError, match="multiple repeat"):
        parse_regex(r"[ ]?*")
    assert compile_regex(r"a{}", LIMITS).fullmatch(b"a{}")  # "{}" is a literal
    assert compile_regex(r"[ ]?", LIMITS).fullmatch(b"") and compile_regex(r"[ ]?", LIMITS).fullmatch(b" ")


def test_class_cache_respects_the_ascii_flag():
    unicode_w = compile_regex(r"[\w]", LIMITS)
    ascii_w = compile_regex(r"(?a)[\w]", LIMITS)
    assert unicode_w.fullmatch("é".encode()) and not ascii_w.fullmatch("é".encode())
    assert compile_regex(r"[\w]", LIMITS).fullmatch("é".encode())  # cached after the ASCII parse
    scoped = compile_regex(r"(?a:[\w])[\w]", LIMITS)  # same class text, two flag states, one pattern
    assert scoped.fullmatch("aé".encode()) and not scoped.fullmatch("éa".encode())


def test_gc_is_paused_during_compile_and_restored():
    import gc

    from tokenrails.guided.gc_pause import gc_paused as no_gc

    assert gc.isenabled()
    with pytest.raises(ValueError):
        with no_gc():
            assert not gc.isenabled()
            with no_gc():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the inner exit keeps it paused
            raise ValueError
    assert gc.isenabled()
    gc.disable()
    try:
        compile_regex("a+b", LIMITS)
        assert not gc.isenabled()  # not re-enabled when it was off on entry
    finally:
        gc.enable()

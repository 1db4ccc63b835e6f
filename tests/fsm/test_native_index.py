"""The C trie walker (``tokenrails._fsm_native``) against the numpy walker and a brute-force oracle.

Every row must be bit-identical between the two walkers (every state of every DFA here); a
per-token oracle (``dfa.walk`` over each token's bytes) checks both on sampled states; the C
objects must refuse malformed input with ValueError instead of reading out of bounds.
"""
from __future__ import annotations

import re
import threading
import warnings

import numpy as np
import pytest

from tokenrails.guided.errors import GuideError
import torch
from hypothesis import HealthCheck, given, settings

from tokenrails import GuideSpec, Vocabulary, compile_guide, native
from tokenrails.guided.fsm.compiler import compile_choices, compile_regex
from tokenrails.guided.fsm.dfa import DEAD, DFA
from tokenrails.guided.fsm.token_index import TokenIndex, eos_row
from tokenrails.guided.fsm.token_trie import build_token_trie, token_trie
from tokenrails.guided.limits import GuideLimits
from tests.fsm.regex_strategies import anchored

fsm_native = native.load("fsm")
pytestmark = pytest.mark.skipif(fsm_native is None, reason="tokenrails._fsm_native is not built")

LIMITS = GuideLimits()
PATTERNS = [
    r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    r".*",
    r"(.|\n){0,5}x",
    r"[^\x00-\x7f]+",          # multi-byte UTF-8 only
    r"[é€😀-😂]{1,3}[0-9]",
    r"[^\"\\\x00-\x1F\x7F-\x9F]*",
    r"\w+\s\d{2,4}",
    r"(yes|no|maybe)",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"日本語|naïve|café",
]
CHOICES = [["positive", "negative", "neutral"], ["a", "ab", "abc", " a", "\u00e9t\u00e9", "😀"]]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["x", "yz"]}}},
          "required": ["name", "age"]}


def both(dfa: DFA, vocab: Vocabulary) -> tuple[TokenIndex, TokenIndex]:
    trie = token_trie(vocab)
    return TokenIndex(dfa, vocab, trie, use_native=True), TokenIndex(dfa, vocab, trie, use_native=False)


def assert_all_states_equal(dfa: DFA, vocab: Vocabulary) -> None:
    fast, ref = both(dfa, vocab)
    assert fast.native and not ref.native
    for s in range(dfa.num_states):
        a, b = fast.row(s), ref.row(s)
        assert a.dtype == b.dtype == torch.int32 and a.shape == b.shape == (fast.words,)
        assert torch.equal(a, b), (s, torch.nonzero(a != b)[:5].tolist())
        assert fast.allows_everything(s) == ref.allows_everything(s)


def oracle_row(dfa: DFA, vocab: Vocabulary, state: int) -> np.ndarray:
    """Per-token definition: a grammar token is allowed iff walking its bytes stays alive; EOS iff accepting."""
    bits = np.zeros((vocab.vocab_size + 31) // 32 * 32, dtype=bool)
    if state != DEAD:
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in vocab.special_ids and dfa.walk(state, b) != DEAD:
                bits[i] = True
    if dfa.accepting_list[state]:
        bits[list(vocab.eos_ids)] = True
    return np.packbits(bits, bitorder="little").view("<i4")


def json_regex() -> str:
    from tokenrails.guided.fsm.schema import schema_to_regex

    return schema_to_regex(GuideSpec.json_schema(SCHEMA))


# ---- native == numpy, every state ----------------------------------------------------------------
@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_state_matches_numpy(vocab, pattern):
    assert_all_states_equal(compile_regex(pattern, LIMITS), vocab)


@pytest.mark.parametrize("choices", CHOICES)
def test_choice_states_match_numpy(vocab, choices):
    assert_all_states_equal(compile_choices(choices, LIMITS), vocab)


def test_json_schema_states_match_numpy(vocab):
    pytest.importorskip("outlines_core")
    dfa = compile_regex(json_regex(), LIMITS, check_length=False)
    assert dfa.num_states > 50
    assert_all_states_equal(dfa, vocab)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pattern=anchored)
def test_random_regexes_match_numpy(vocab, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            re.compile(pattern)
        except re.error:
            return
    try:
        dfa = compile_regex(pattern, LIMITS)
    except GuideError:  # a typed refusal (empty language, a limit): anything else is a compiler bug
        return
    assert_all_states_equal(dfa, vocab)


@pytest.mark.parametrize("pattern", [PATTERNS[0], PATTERNS[4], r"\w+\s\d{2,4}"])
def test_rows_equal_per_token_oracle(vocab, pattern):
    dfa = compile_regex(pattern, LIMITS)
    fast, _ = both(dfa, vocab)
    for s in list(range(min(dfa.num_states, 4))) + [dfa.num_states - 1]:
        assert np.array_equal(fast.row(s).numpy(), oracle_row(dfa, vocab, s)), s


# ---- a synthetic vocabulary with every awkward case ---------------------------------------------------
def awkward_vocab() -> Vocabulary:
    """Duplicate bytes (3 ids), empty tokens, specials sharing bytes with grammar tokens, NUL bytes,
    prefix chains, a long token, padding beyond the tokenizer, and ids past a word boundary."""
    toks = [b"<eos>", b"a", b"ab", b"abc", b"a", b"", b"b", b"\x00", b"a\x00", b"ab", b"<pad>", b"\xc3\xa9",
            b"\xc3", b"\xa9", b"x" * 70, b"xy", b"a", b" ", b"  ", b"\xff"]
    toks += [bytes([65 + i % 26]) * (1 + i % 3) for i in range(40)]
    return Vocabulary(token_bytes=toks, eos_ids=(0, 17), special_ids=frozenset({10, 12}), vocab_size=len(toks) + 37)


@pytest.mark.parametrize("pattern", [r"a*b?c?", r"[a\x00]+", r"é|\xff?x{2,80}y?", r".*", r"[ A-Z]+", r"b"])
def test_awkward_vocabulary(pattern):
    vocab = awkward_vocab()
    dfa = compile_regex(pattern, LIMITS)
    fast, ref = both(dfa, vocab)
    for s in range(dfa.num_states):
        want = oracle_row(dfa, vocab, s)
        assert np.array_equal(fast.row(s).numpy(), want), (pattern, s)
        assert np.array_equal(ref.row(s).numpy(), want), (pattern, s)


def test_preorder_trie_shape():
    """Every grammar token ends at exactly one node (duplicates chained) whose root path spells it."""
    vocab = awkward_vocab()
    trie = build_token_trie(vocab)
    depth, byte, tok, nxt = trie.dfs_depth, trie.dfs_byte, trie.dfs_tok, trie.dfs_tok_next
    path: list[int] = []
    seen: dict[int, bytes] = {}
    prefixes = []
    for i in range(depth.size):
        del path[depth[i] - 1:]
        path.append(int(byte[i]))
        prefixes.append(bytes(path))
        t = int(tok[i])
        while t >= 0:
            assert t not in seen
            seen[t] = bytes(path)
            t = int(nxt[t])
    grammar = {i: b for i, b in enumerate(vocab.token_bytes) if b and i not in vocab.special_ids}
    assert seen == grammar
    assert prefixes == sorted(set(prefixes))  # distinct prefixes, in sorted (= pre-) order
    assert set(prefixes) == {b[:k] for b in grammar.values() for k in range(1, len(b) + 1)}
    assert trie.native().num_nodes == depth.size


# ---- fixed costs, caching, threads ---------------------------------------------------------------------
def test_identical_rows_are_stored_once(vocab):
    dfa = compile_regex(r"x[0-9]{3}y|z[0-9]{3}w", LIMITS)  # SmolLM2 has single-digit tokens only
    fast, _ = both(dfa, vocab)
    fast.precompute()
    rows = [fast.row(s) for s in range(1, dfa.num_states)]
    distinct = {tuple(r.tolist()) for r in rows}
    assert len({id(r) for r in rows}) == len(distinct) < len(rows)


def test_eos_row_is_per_vocabulary(vocab):
    row = eos_row(vocab)
    assert row is eos_row(vocab)
    ids = {i for i in range(vocab.vocab_size) if (int(row[i // 32]) >> (i % 32)) & 1}
    assert ids == set(vocab.eos_ids)


def test_concurrent_first_visits_agree(vocab):
    dfa = compile_regex(PATTERNS[0] + "|" + PATTERNS[6], LIMITS)
    fast, ref = both(dfa, vocab)
    states = list(range(dfa.num_states)) * 3
    errors: list[BaseException] = []

    def work(order):
        try:
            for s in order:
                assert torch.equal(fast.row(s), ref.row(s))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(states[k::2] + states[: k],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fast.cached_states == dfa.num_states


def test_native_switch(vocab, monkeypatch):
    dfa = compile_regex("abc", LIMITS)
    assert TokenIndex(dfa, vocab).native
    monkeypatch.setenv(native.NATIVE_ENV, "0")
    assert not TokenIndex(dfa, vocab).native
    with pytest.raises(RuntimeError):
        TokenIndex(dfa, vocab, use_native=True)


# ---- malformed input is refused -------------------------------------------------------------------------
def _trie_args(**change):
    args = dict(node_byte=np.array([97, 98, 99], np.uint8), node_depth=np.array([1, 2, 1], np.int32),
                node_tok=np.array([0, 1, -1], np.int32), tok_next=np.full(4, -1, np.int32), num_bits=32)
    args.update(change)
    return args


@pytest.mark.parametrize("change", [
    dict(node_depth=np.array([2, 2, 1], np.int32)),           # first node not at depth 1
    dict(node_depth=np.array([1, 3, 1], np.int32)),           # skips a level
    dict(node_depth=np.array([1, 0, 1], np.int32)),
    dict(node_tok=np.array([0, 4, -1], np.int32)),            # id beyond tok_next
    dict(node_tok=np.array([0, -2, -1], np.int32)),
    dict(tok_next=np.array([0, -1, -1, -1], np.int32)),       # self-cycle
    dict(tok_next=np.array([-1, 0, -1, -1], np.int32)),       # backwards (could cycle)
    dict(tok_next=np.array([9, -1, -1, -1], np.int32)),
    dict(num_bits=33),
    dict(num_bits=0),
    dict(tok_next=np.full(40, -1, np.int32)),                 # more ids than bits
    dict(node_depth=np.array([1, 2], np.int32)),              # length mismatch
    dict(node_depth=np.array([1, 2, 1], np.int64)),           # wrong item size
])
def test_trie_refuses_malformed_input(change):
    with pytest.raises((ValueError, TypeError)):
        fsm_native.Trie(**_trie_args(**change))


def test_walker_and_fill_refuse_malformed_input():
    trie = fsm_native.Trie(**_trie_args())
    assert trie.num_nodes == 3 and trie.max_depth == 2
    good = dict(trie=trie, trans=np.array([[0, 0], [2, 1], [0, 2]], np.int32), num_states=3, num_classes=2,
                classmap=np.zeros(256, np.int32), accepting=np.array([0, 0, 1], np.uint8),
                eos_ids=np.array([3], np.int32), vocab_size=4)
    w = fsm_native.Walker(**good)
    out = np.empty(1, np.int32)
    w.fill(1, out)
    bad = [
        dict(trans=np.array([[0, 0], [3, 1], [0, 2]], np.int32)),   # target state out of range
        dict(trans=np.array([[0, 0], [-1, 1], [0, 2]], np.int32)),
        dict(trans=np.zeros(5, np.int32)),
        dict(classmap=np.full(256, 2, np.int32)),                  # class out of range
        dict(classmap=np.zeros(255, np.int32)),
        dict(accepting=np.zeros(2, np.uint8)),
        dict(eos_ids=np.array([32], np.int32)),
        dict(vocab_size=33),
        dict(num_classes=0, trans=np.zeros(0, np.int32)),
        dict(trie=object()),
    ]
    for change in bad:
        with pytest.raises((ValueError, TypeError)):
            fsm_native.Walker(**{**good, **change})
    for state in (-1, 3, 1 << 40):
        with pytest.raises((ValueError, OverflowError)):
            w.fill(state, out)
    with pytest.raises(ValueError):
        w.fill(1, np.empty(2, np.int32))       # wrong row width
    with pytest.raises((ValueError, TypeError)):
        w.fill(1, np.empty(1, np.int32)[::1].view(np.int16))
    with pytest.raises((ValueError, TypeError, BufferError)):
        w.fill(1, bytes(4))                     # read-only


def test_precompute_caches_the_rows_fill_computes_and_refuses_bad_states(vocab):
    """The warm-up's batched call caches exactly the rows one ``fill`` per state computes, and checks
    every state before computing anything."""
    dfa = compile_guide(GuideSpec.regex(r"[a-z]+@[a-z]+\.(com|org)|\d{3}"), vocab, backend="fsm").dfa
    index = TokenIndex(dfa, vocab, use_native=True)
    walker, words = index.walker, index.words
    for bad_states in (np.array([1, dfa.num_states], np.int32), np.array([-1, 1], np.int32)):
        with pytest.raises(ValueError):
            walker.precompute(bad_states)
        assert walker.cached_states == 0
    with pytest.raises(ValueError):  # states of the wrong width
        walker.precompute(np.array([1], np.int64))
    states = np.arange(dfa.num_states, dtype=np.int32)[::-1].copy()
    walker.precompute(states)
    assert walker.cached_states == dfa.num_states
    for state in states.tolist():
        raw = np.empty(words, np.int32)
        _, full = walker.fill(state, raw)
        got = np.full(words, -1, np.int32)
        assert walker.fill_into(state, got.ctypes.data, words) is (not full)
        assert np.array_equal(got, raw), state


def _all_rows(dfa, vocab):
    """Every state's row through fill_into (into garbage-filled, wider targets) next to the raw walk."""
    index = TokenIndex(dfa, vocab, use_native=True)
    walker, words = index.walker, index.words
    for state in list(range(dfa.num_states)) * 2:  # second pass: cached rows
        raw = np.empty(words, np.int32)
        _, full = walker.fill(state, raw)
        wide = np.full(words + 3, 0x5A5A5A5A, np.int32)
        masked = walker.fill_into(state, wide.ctypes.data, words + 3)
        assert np.array_equal(wide[:words], raw), state
        assert not wide[words:].any()
        assert masked is (not full) and walker.allows_everything(state) is full
    return index


@pytest.mark.parametrize("pattern", PATTERNS + [r"[^\"]*", r"(.|\n)*"])
def test_cached_rows_equal_the_walk(vocab, pattern):
    """Sparse rows (id lists) and packed rows write the same bits as the raw walk, every time."""
    dfa = compile_regex(pattern, LIMITS)
    index = _all_rows(dfa, vocab)
    walker = index.walker
    assert walker.cached_states == dfa.num_states
    assert walker.distinct_rows <= dfa.num_states
    assert walker.row_bytes <= walker.distinct_rows * index.words * 4


def test_rows_of_both_kinds_are_stored(vocab):
    """A tight state is kept as an id list (far smaller than a packed row), an open one packed."""
    words = (vocab.vocab_size + 31) // 32
    tight = TokenIndex(compile_regex(r"[0-9]", LIMITS), vocab, use_native=True)
    tight.ensure(1)
    assert 0 < tight.walker.row_bytes < words * 4 // 8
    wide = TokenIndex(compile_regex(r"[^\"]", LIMITS), vocab, use_native=True)
    wide.ensure(1)
    assert wide.walker.row_bytes == words * 4


def test_eos_only_fill(vocab):
    index = TokenIndex(compile_regex("abc", LIMITS), vocab, use_native=True)
    out = np.full(index.words, -1, np.int32)
    assert index.walker.fill_into(-1, out.ctypes.data, index.words) is True
    assert np.array_equal(out, eos_row(vocab).numpy())


def test_advance_equals_the_python_step(vocab):
    """The native step over a token's bytes equals ``dfa.walk`` over ``grammar_bytes`` for every id,
    including specials, EOS and ids beyond the vocabulary (all dead)."""
    from tokenrails.guided.fsm.matcher import grammar_bytes

    dfa = compile_regex(PATTERNS[0] + "|" + PATTERNS[6] + "|" + PATTERNS[4], LIMITS)
    walker = TokenIndex(dfa, vocab, use_native=True).walker
    data = grammar_bytes(vocab)
    for state in range(dfa.num_states):
        for t in range(vocab.vocab_size):
            want = DEAD if data[t] is None else dfa.walk(state, data[t])
            assert walker.advance(state, t) == want, (state, t)
        for t in (-1, -(1 << 40), vocab.vocab_size, len(data) + 5, 1 << 40, 1 << 80):
            assert walker.advance(state, t) == DEAD
    for state in (-1, dfa.num_states):
        with pytest.raises(ValueError):
            walker.advance(state, 0)
    with pytest.raises(TypeError):
        walker.advance(1, "a")


def test_fill_into_refuses_bad_targets(vocab):
    index = TokenIndex(compile_regex("abc", LIMITS), vocab, use_native=True)
    walker, words = index.walker, index.words
    out = np.zeros(words, np.int32)
    with pytest.raises(ValueError, match="this vocabulary needs"):
        walker.fill_into(1, out.ctypes.data, words - 1)
    with pytest.raises(ValueError):
        walker.fill_into(1, 0, words)                       # null address
    with pytest.raises(ValueError):
        walker.fill_into(1, out.ctypes.data + 2, words)     # misaligned
    for state in (-2, 5, 1 << 40):
        with pytest.raises((ValueError, OverflowError)):
            walker.fill_into(state, out.ctypes.data, words)
    assert not out.any()

"""llguidance native batch fill (one LLExecutor call per group) == per-row fill, bit for bit."""
from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("llguidance")

from tokenrails import GuideSpec, Vocabulary, allocate_token_bitmask, compile_guide
from tokenrails.guided.backends.llguidance_backend import LLGuidanceMatcher
from tests.guided.helpers import allowed_ids

SPECS = [
    GuideSpec.json_schema({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                            "n": {"type": "integer"}}, "required": ["name"]}),
    GuideSpec.json_schema({"type": "array", "items": {"enum": ["red", "green", 7]}, "maxItems": 3}),
    GuideSpec.regex(r"[a-z]{2,6}(-[0-9]{1,3})?"),
    GuideSpec.choice(["alpha", "beta", "gamma delta"]),
    GuideSpec.json_object(),
]


def _random_state(guide, vocab, rng: random.Random) -> LLGuidanceMatcher:
    """A matcher advanced by random allowed tokens; sometimes terminated or in llguidance's error state."""
    m = guide.matcher()
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    for _ in range(rng.randrange(0, 12)):
        m.fill_next_token_bitmask(bm, 0)
        ids = allowed_ids(bm[0], vocab.vocab_size).tolist()
        tok = rng.choice(ids)
        assert m.accept_token(tok)
        if m.is_terminated():
            break
    if rng.random() < 0.15 and not m.is_terminated():
        m.fill_next_token_bitmask(bm, 0)
        allowed = set(allowed_ids(bm[0], vocab.vocab_size).tolist())
        bad = next(t for t in range(vocab.num_tokens) if t not in allowed and t not in vocab.special_ids)
        assert not m._m.consume_token(bad) and m._m.is_error()  # llguidance's error state
    return m


@pytest.mark.parametrize("seed", range(6))
def test_batch_fill_equals_per_row_fill(vocab, seed):
    rng = random.Random(seed)
    guides = [compile_guide(s, vocab, "llguidance") for s in SPECS]
    n = rng.choice([2, 5, 16, 33])
    matchers = [_random_state(rng.choice(guides), vocab, rng) for _ in range(n)]
    height = n + 3
    rows = rng.sample(range(height), n)  # scattered, unordered target rows
    garbage = torch.randint(-2**31, 2**31 - 1, (height, (vocab.vocab_size + 31) // 32), dtype=torch.int32,
                            generator=torch.Generator().manual_seed(seed))
    expect, got = garbage.clone(), garbage.clone()
    for m, r in zip(matchers, rows):
        m.fill_next_token_bitmask(expect, r)
    LLGuidanceMatcher.batch_fill(matchers, got, rows)
    assert torch.equal(expect, got)
    # untouched rows stay untouched
    for r in set(range(height)) - set(rows):
        assert torch.equal(got[r], garbage[r])
    # filling does not advance anything: a second batch fill gives the same masks
    again = garbage.clone()
    LLGuidanceMatcher.batch_fill(matchers, again, rows)
    assert torch.equal(again, got)


def test_batch_fill_fails_closed_when_only_a_special_token_could_continue():
    """Tiny vocabulary where ``b`` exists only inside the special token ``ab``: after ``a`` the
    grammar cannot continue with grammar tokens, so the row must be EOS only (llguidance errors
    during the fill); other rows never contain special or padding ids. Batch == per row."""
    toks = [b"a", b"x", b"ab", b"<s>", b"</s>"] + [bytes([c]) for c in b"cdefgh"]
    vocab = Vocabulary(toks, eos_ids=(4,), special_ids=frozenset({2, 3}), vocab_size=40)
    g = compile_guide(GuideSpec.regex("ab|c+"), vocab, "llguidance")
    g2 = compile_guide(GuideSpec.regex("(ab)+|x+"), vocab, "llguidance")
    ms = [g.matcher() for _ in range(3)] + [g2.matcher() for _ in range(3)]
    assert ms[1].accept_token(toks.index(b"c"))
    assert ms[2].accept_token(toks.index(b"a"))  # dead end: only "ab" (special) would fit
    assert ms[4].accept_token(toks.index(b"x"))
    assert ms[5].accept_token(toks.index(b"a"))
    bm1 = torch.full((7, 2), -1, dtype=torch.int32)
    bm2 = bm1.clone()
    rows = [5, 0, 3, 1, 6, 4]
    for m, r in zip(ms, rows):
        m.fill_next_token_bitmask(bm1, r)
    LLGuidanceMatcher.batch_fill(ms, bm2, rows)
    assert torch.equal(bm1, bm2)
    got = {i: set(allowed_ids(bm2[r], 40).tolist()) for i, r in enumerate(rows)}
    assert got[2] == {4}  # EOS only
    assert got[0] == {0, 5} and got[1] == {4, 5} and got[4] == {1, 4}
    assert all(not a & {2, 3} and max(a) < len(toks) for a in got.values())


def test_batch_fill_falls_back_for_repeated_rows_and_odd_bitmasks(vocab):
    g = compile_guide(SPECS[2], vocab, "llguidance")
    ms = [g.matcher(), g.matcher()]
    ms[1].accept_token(vocab.token_bytes.index(b"ab"))
    bm = allocate_token_bitmask(2, vocab.vocab_size)
    LLGuidanceMatcher.batch_fill(ms, bm, [1, 1])  # last writer wins, like the per-row loop
    ref = allocate_token_bitmask(2, vocab.vocab_size)
    ms[1].fill_next_token_bitmask(ref, 1)
    assert torch.equal(bm[1], ref[1])
    # a column slice of a wider tensor: rows are contiguous, the whole is not -> per-row path
    wide = torch.full((4, bm.shape[1] * 2), -1, dtype=torch.int32)[:, : bm.shape[1]]
    LLGuidanceMatcher.batch_fill(ms, wide, [2, 0])
    ms[0].fill_next_token_bitmask(ref, 0)
    assert torch.equal(wide[2], ref[0]) and torch.equal(wide[0], ref[1])


def test_special_and_padding_ids_are_removed_even_if_the_parser_allows_them():
    """Parsers built from grammars that name special/padding ids directly (``<[id]>``; tokenrails
    refuses such client grammars): both fill paths AND them away, and a row left empty is EOS only."""
    import llguidance as llg

    toks = [b"a", b"x", b"ab", b"<s>", b"</s>"] + [bytes([c]) for c in b"cdefgh"]
    vocab = Vocabulary(toks, eos_ids=(4,), special_ids=frozenset({2, 3}), vocab_size=40)
    g = compile_guide(GuideSpec.regex("x"), vocab, "llguidance")
    tok = vocab.backend_cache["llguidance:tables"][0]
    larks = ['start: <[3]> | "x"', "start: <[3]>", 'start: <[38]> | "x"', "start: <[2]> | <[38]>", 'start: "a"']
    expect = [{1}, {4}, {1}, {4}, {0}]
    ms = []
    for lark in larks:
        m = g.matcher()
        m._m = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_lark(lark), log_level=0)
        ms.append(m)
    rows = [3, 0, 4, 1, 2]
    per_row = torch.full((5, 2), -1, dtype=torch.int32)
    for m, r in zip(ms, rows):
        m.fill_next_token_bitmask(per_row, r)
    batch = torch.full((5, 2), -1, dtype=torch.int32)
    LLGuidanceMatcher.batch_fill(ms, batch, rows)
    assert torch.equal(per_row, batch)
    for r, want in zip(rows, expect):
        assert set(allowed_ids(batch[r], 40).tolist()) == want

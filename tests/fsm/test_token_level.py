"""Token level on the real SmolLM2 vocabulary: acceptance == re.fullmatch, masks == outlines-core,
adversarial samplers end in a full match, rollback is bit-exact, multi-byte characters split
across tokens."""
from __future__ import annotations

import random
import re
import warnings
from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideError, apply_token_bitmask_inplace

from tests.fsm.conftest import allowed_ids, fill, mask_to_ids
from tests.fsm.regex_strategies import anchored, texts


def _tokens_for(tokenizer, vocab, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    if b"".join(vocab.token_bytes[i] for i in ids) != text.encode("utf-8"):
        return None  # tokenizer normalization changed the text
    if any(i in vocab.special_ids for i in ids):
        return None
    return ids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pattern=anchored, samples=st.lists(texts, min_size=1, max_size=3), data=st.data())
def test_token_by_token_acceptance_equals_fullmatch(fsm_compile, smollm2_tokenizer, vocab, pattern, samples, data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compiled = re.compile(pattern)
        except re.error:
            return
    guide = fsm_compile(pattern)
    positive = data.draw(st.from_regex(compiled, fullmatch=True).filter(
        lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)))
    for text in [positive] + samples:
        ids = _tokens_for(smollm2_tokenizer, vocab, text)
        if ids is None:
            continue
        m = guide.matcher()
        ok = True
        for t in ids:
            allowed = t in allowed_ids(m, vocab)
            accepted = m.accept_token(t)
            assert allowed == accepted, (pattern, text, t)  # the mask and accept agree
            if not accepted:
                ok = False
                break
        full = ok and m.is_accepting()
        assert full == (compiled.fullmatch(text) is not None), (pattern, text, ids)
        eos_ok = m.accept_token(vocab.eos_ids[0]) if ok else False
        assert eos_ok == full


# ---- outlines-core oracle -----------------------------------------------------------------
OC_PATTERNS = [
    r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    r"\d{4}-\d{2}-\d{2}",
    r"(yes|no|maybe)",
    r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*"',
    r"[A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"(café|naïve|日本語|😀+)",
]
OC_TEXTS = [
    "john.doe@example.com", "2024-02-29", "maybe", '"hi \\"there\\" ünï 😀"', "Alice Smith", "-12.5",
    "naïve", "日本語", "😀😀😀",
]


@pytest.fixture(scope="module")
def oc_vocabulary(vocab):
    outlines_core = pytest.importorskip("outlines_core")
    eos = vocab.eos_ids[0]
    mapping: dict[bytes, list[int]] = {}
    for i, b in enumerate(vocab.token_bytes):
        if b and i not in vocab.special_ids:
            mapping.setdefault(b, []).append(i)
    return outlines_core.Vocabulary(eos, mapping)


@pytest.mark.parametrize("pattern", OC_PATTERNS)
def test_masks_equal_outlines_core_on_ordinary_tokens(fsm_compile, smollm2_tokenizer, vocab, oc_vocabulary, pattern):
    """At every non-accepting step of valid outputs, our allowed set == outlines-core's.

    Differences by design (docs/fsm.md): outlines-core knows one EOS id, so EOS is compared
    separately; and its regex-automata DFA uses leftmost-first match semantics, which drops
    continuations once a match is complete (after ``a@b.cc`` it forbids ``.``, although
    ``a@b.cc.dd`` fully matches; after ``-12`` it forbids ``.5``). We follow ``re.fullmatch``, so in accepting states outlines'
    set must be a subset of ours and every extra token must extend to a real full match.
    """
    import outlines_core

    index = outlines_core.Index(pattern, oc_vocabulary)
    guide = fsm_compile(pattern)
    eos = vocab.eos_ids[0]
    texts = [t for t in OC_TEXTS if re.fullmatch(pattern, t)]
    assert texts, pattern
    for text in texts:
        ids = _tokens_for(smollm2_tokenizer, vocab, text)
        assert ids is not None
        ref = outlines_core.Guide(index)
        m = guide.matcher()
        for step, t in enumerate(ids + [None]):
            ours = allowed_ids(m, vocab)
            theirs = set(ref.get_tokens())
            assert (eos in ours) == (eos in theirs) == m.is_accepting()
            if m.is_accepting():
                assert theirs - {eos} <= ours - {eos}, (pattern, text, step)
                prefix = b"".join(vocab.token_bytes[x] for x in ids[:step])
                for extra in sorted(ours - theirs - {eos})[:20]:
                    assert _completes(guide, prefix + vocab.token_bytes[extra], pattern)
            else:
                assert ours - {eos} == theirs - {eos}, (pattern, text, step, sorted(ours ^ theirs)[:10])
            if t is None:
                break
            assert m.accept_token(t)
            if t not in theirs:  # outlines stopped at a completed match (leftmost-first)
                assert re.fullmatch(pattern, text)
                break
            ref.advance(t, return_tokens=False)


def _completes(guide, data: bytes, pattern: str) -> bool:
    """Some shortest completion of ``data`` fully matches ``pattern`` under ``re`` (checked by re)."""
    dfa = guide.dfa
    dist = _distance_to_accept(dfa)
    state = dfa.walk(1, data)
    out = bytearray(data)
    while not dfa.accepting_list[state]:
        b = min(range(256), key=lambda x: (dist[dfa.rows[state][dfa.cls[x]]] is None, dist[dfa.rows[state][dfa.cls[x]]] or 0))
        out.append(b)
        state = dfa.rows[state][dfa.cls[b]]
    return re.fullmatch(pattern, out.decode("utf-8")) is not None


# ---- adversarial samplers -----------------------------------------------------------------
SAMPLER_PATTERNS = [
    r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
    r"(?:\d{1,3}\.){3}\d{1,3}",
    r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}",
    r'"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt]){0,12}"',
    r"(ab|c)*d[^x]{2}é?",
    r"[^a-z]{3,5}",
    r".{1,6}",
]


def _distance_to_accept(dfa):
    """Bytes needed from each DFA state to reach acceptance (reverse BFS)."""
    preds = [[] for _ in range(dfa.num_states)]
    for s, row in enumerate(dfa.rows):
        for t in set(row):
            preds[t].append(s)
    dist = [None] * dfa.num_states
    queue = deque(s for s in range(dfa.num_states) if dfa.accepting_list[s])
    for s in queue:
        dist[s] = 0
    while queue:
        t = queue.popleft()
        for s in preds[t]:
            if dist[s] is None:
                dist[s] = dist[t] + 1
                queue.append(s)
    return dist


def _run_sampler(guide, vocab, choose, max_steps=40):
    """Sample until EOS; ``choose(allowed, step, matcher)`` picks; returns (tokens, masks)."""
    m = guide.matcher()
    eos = set(vocab.eos_ids)
    out, masks = [], []
    dist = _distance_to_accept(guide.dfa)
    for step in range(400):
        row = fill(m, vocab)
        masks.append(row)
        allowed = mask_to_ids(row, vocab.vocab_size)
        assert allowed, "a live state must allow some token"
        if step >= max_steps:  # finish: go towards acceptance
            if allowed & eos:
                t = min(allowed & eos)
            else:
                t = min((dist[guide.dfa.walk(m.state, vocab.token_bytes[c])], c) for c in allowed - eos)[1]
        else:
            t = choose(allowed, step, m)
        assert m.accept_token(t), t
        out.append(t)
        if t in eos:
            assert m.is_terminated()
            return out, masks
    raise AssertionError("sampler did not terminate")


@pytest.mark.parametrize("pattern", SAMPLER_PATTERNS)
def test_adversarial_samplers_end_in_a_full_match(fsm_compile, vocab, pattern):
    guide = fsm_compile(pattern)
    eos = set(vocab.eos_ids)
    rng = random.Random(0)
    logits = torch.randn(vocab.vocab_size, generator=torch.Generator().manual_seed(1))

    def lowest_id(allowed, step, m):
        return min(allowed)

    def worst_non_eos(allowed, step, m):  # prefer non-EOS to make the output long
        non = allowed - eos
        return max(non) if non else min(allowed)

    def lowest_logit(allowed, step, m):
        masked = logits.clone().unsqueeze(0)
        bm = torch.zeros(1, (vocab.vocab_size + 31) // 32, dtype=torch.int32)
        m.fill_next_token_bitmask(bm, 0)
        apply_token_bitmask_inplace(masked, bm)
        masked[masked == float("-inf")] = float("inf")
        t = int(masked.argmin())
        assert t in allowed
        return t

    def random_choice(allowed, step, m):
        return rng.choice(sorted(allowed))

    for choose in (lowest_id, worst_non_eos, lowest_logit, random_choice):
        tokens, masks = _run_sampler(guide, vocab, choose)
        data = b"".join(vocab.token_bytes[t] for t in tokens if t not in eos)
        text = data.decode("utf-8")  # the DFA only admits valid UTF-8
        assert re.fullmatch(pattern, text), (pattern, choose.__name__, text)
        _check_rollback_bit_exact(guide, vocab, tokens, masks)


def _check_rollback_bit_exact(guide, vocab, tokens, masks):
    m = guide.matcher()
    for t in tokens:
        assert m.accept_token(t)
    assert m.is_terminated()
    # roll back one token at a time: the mask at each position is bit-identical
    for k in range(len(tokens), 0, -1):
        m.rollback(1)
        assert not m.is_terminated()
        assert torch.equal(fill(m, vocab), masks[k - 1]), k
    # forward again after a full rollback, then a multi-token rollback
    for t in tokens:
        assert m.accept_token(t)
    n = min(3, len(tokens))
    m.rollback(n)
    assert torch.equal(fill(m, vocab), masks[len(tokens) - n])


# ---- multi-byte characters ----------------------------------------------------------------
def _byte_tokens(vocab):
    """Single-byte tokens by byte value (byte-level BPE has all 256)."""
    out = {}
    for i, b in enumerate(vocab.token_bytes):
        if len(b) == 1 and i not in vocab.special_ids:
            out.setdefault(b[0], i)
    return out


@pytest.mark.parametrize("pattern,text", [
    (r'"[^"\\]*"', '"é€😀"'), (r".{3}", "é€😀"), (r"[^a]+", "日本😀"), (r"[^\x00-\x7f]{2}", "ÿ😀"),
])
def test_tokens_ending_mid_character(fsm_compile, vocab, pattern, text):
    """Feed multi-byte characters one byte token at a time: every partial state stays live and only
    valid continuation bytes are allowed."""
    guide = fsm_compile(pattern)
    bt = _byte_tokens(vocab)
    m = guide.matcher()
    data = text.encode("utf-8")
    assert all(b in bt for b in data)
    for i, b in enumerate(data):
        allowed = allowed_ids(m, vocab)
        assert bt[b] in allowed, (i, b)
        if i and 0x80 <= b <= 0xBF and data[i - 1] >= 0xC0:  # right after a lead byte
            # ASCII bytes cannot continue a character
            assert not any(bt[a] in allowed for a in range(0x80) if a in bt), i
        assert m.accept_token(bt[b])
    assert m.is_accepting()
    assert re.fullmatch(pattern, text)


def test_negated_class_admits_every_multibyte_character(fsm_compile, vocab):
    guide = fsm_compile(r'"[^"\\]*"')
    m = guide.matcher()
    assert m.accept_token(_byte_tokens(vocab)[ord('"')])
    allowed = allowed_ids(m, vocab)
    for i, b in enumerate(vocab.token_bytes):
        if not b or i in vocab.special_ids:
            continue
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            continue  # partial characters are covered above
        expected = re.fullmatch(r'[^"\\]*"?', s) is not None
        assert (i in allowed) == expected, (i, b)


def test_guide_errors_are_typed(fsm_compile):
    with pytest.raises(GuideError):
        fsm_compile("(a")

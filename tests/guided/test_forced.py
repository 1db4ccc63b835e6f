"""The forced-token rule (guided/forced.py) against an independent replay, on real grammars.

Oracle: walking the returned tokens through a second matcher, each token is either the only id
the mask allows (bits read by ``helpers.allowed_ids``, not by the code under test) or part of the
canonical tokenization of the forced string at the point where that string began. After the call
the matcher is exactly where it was: same mask, same forced string, same history depth.
"""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided.forced import forced_tokens, single_allowed_token

from .helpers import adversarial_decode, allowed_ids, decode_text

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["crimson", "green", "cobalt blue"]},
                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                               "maxItems": 2}},
     "required": ["color", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                 "ok": {"type": "boolean"}},
                                "required": ["id", "ok"], "additionalProperties": False}, "maxItems": 3},
]
SPECS = [GuideSpec.json_schema(json.dumps(s), any_whitespace=False) for s in SCHEMAS] + [
    GuideSpec.json_schema(json.dumps(SCHEMAS[0])),  # any whitespace: far less is forced
    GuideSpec.regex(r"(alpha|beta)-[0-9]{2}\.done"),
    GuideSpec.choice(["internationalization", "internal", "interval"]),
]


@pytest.fixture(scope="module")
def guides(vocab):
    return [compile_guide(s, vocab) for s in SPECS]


@pytest.fixture(scope="module")
def encode(smollm2_tokenizer):
    return lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)


def _walk_to(matcher, vocab, seed: int, steps: int) -> None:
    """Advance ``matcher`` by up to ``steps`` adversarially chosen allowed tokens (never EOS)."""
    gen = torch.Generator().manual_seed(seed)
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    for _ in range(steps):
        matcher.fill_next_token_bitmask(bm, 0)
        ids = [int(t) for t in allowed_ids(bm[0], vocab.vocab_size) if int(t) not in vocab.eos_ids]
        if not ids or matcher.is_terminated():
            return
        assert matcher.accept_token(ids[int(torch.randint(len(ids), (1,), generator=gen))])


def _snapshot(matcher, vocab):
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bm, 0)
    return bm.clone(), matcher.find_jump_forward_string(), matcher.is_terminated()


def _check_against_replay(guide, vocab, prefix: list[int], run, encode) -> None:
    """Every returned token is a one-token mask or the canonical tokenization of a forced string."""
    m = guide.matcher()
    for t in prefix:
        assert m.accept_token(t)
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    pending: list[int] = []  # the rest of the current forced string's tokenization
    singles = 0
    for tok in run.tokens:
        m.fill_next_token_bitmask(bm, 0)
        allowed = allowed_ids(bm[0], vocab.vocab_size).tolist()
        if pending and pending[0] not in allowed:
            pending = []  # the grammar refused the rest of that tokenization: the rule started over
        if pending:  # inside a forced string: its tokenization goes on (a one-token mask or not)
            assert tok == pending.pop(0), "not the forced string's canonical tokenization"
            assert tok in allowed
        elif len(allowed) == 1:
            assert tok == allowed[0]
            singles += 1
        else:
            text = m.find_jump_forward_string()
            assert text, "a token was returned where the grammar has a choice"
            pending = [int(t) for t in encode(text)]
            assert tok == pending.pop(0), "not the forced string's canonical tokenization"
            assert tok in allowed
        assert tok not in vocab.eos_ids
        assert m.accept_token(tok)
    assert singles == run.single


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(SPECS) - 1), seed=st.integers(0, 10_000), steps=st.integers(0, 30),
       limit=st.integers(1, 24), with_text=st.booleans())
def test_forced_tokens_match_replay_and_leave_state_unchanged(guides, vocab, encode, which, seed, steps,
                                                              limit, with_text):
    guide = guides[which]
    m = guide.matcher()
    prefix = []
    _walk_to(m, vocab, seed, steps)
    # the prefix actually accepted: replay it through a second walk with the same seed
    m2 = guide.matcher()
    gen = torch.Generator().manual_seed(seed)
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    for _ in range(steps):
        m2.fill_next_token_bitmask(bm, 0)
        ids = [int(t) for t in allowed_ids(bm[0], vocab.vocab_size) if int(t) not in vocab.eos_ids]
        if not ids or m2.is_terminated():
            break
        tok = ids[int(torch.randint(len(ids), (1,), generator=gen))]
        assert m2.accept_token(tok)
        prefix.append(tok)
    before = _snapshot(m, vocab)
    run = forced_tokens(m, limit, encode=encode if with_text else None)
    after = _snapshot(m, vocab)
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    assert len(run) <= limit
    if not with_text:
        assert run.single == len(run)
    _check_against_replay(guide, vocab, prefix, run, encode)
    # the history depth is unchanged: rolling the prefix back reaches the start state
    if prefix:
        m.rollback(len(prefix))
        assert torch.equal(_snapshot(m, vocab)[0], _snapshot(guide.matcher(), vocab)[0])


def test_json_object_start_forces_key_text(guides, vocab, encode):
    """After ``{`` of a schema with required keys the key name is forced; numbers are a choice."""
    m = guides[0].matcher()
    run = forced_tokens(m, 32, encode=encode)
    text = decode_text(vocab, list(run.tokens))
    assert text.startswith('{"name"'), text
    assert run.single < len(run)  # most of it is text, not one-token masks
    loose = forced_tokens(guides[3].matcher(), 32, encode=encode)  # any whitespace after '{'
    assert decode_text(vocab, list(loose.tokens)) == "{"


def test_choice_common_prefix_then_stop(guides, vocab, encode):
    """``internationalization|internal|interval``: ``inter`` is forced, then the grammar chooses."""
    m = guides[5].matcher()
    run = forced_tokens(m, 32, encode=encode)
    assert decode_text(vocab, list(run.tokens)) in ("inter", "int")  # canonical tokenization, as far as accepted
    assert run.tokens and run.single == 0


def test_completed_output_forces_nothing_and_never_eos(guides, vocab, encode):
    m = guides[4].matcher()
    for t in encode("beta-42.done"):
        assert m.accept_token(t)
    assert forced_tokens(m, 8, encode=encode).tokens == ()  # only EOS is left: never proposed
    assert not m.is_terminated()


def test_single_allowed_token_reads_bits_exactly(vocab):
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    bm.zero_()
    for tok in (0, 31, 32, 12345, vocab.vocab_size - 1):
        bm.zero_()
        bm[0, tok // 32] = torch.tensor(1 << (tok % 32), dtype=torch.int64).to(torch.int32)
        assert single_allowed_token(bm[0], vocab.vocab_size) == tok
    bm[0, 0] |= 1
    assert single_allowed_token(bm[0], vocab.vocab_size) is None  # two tokens
    bm.zero_()
    bm[0, 5] = 3
    assert single_allowed_token(bm[0], vocab.vocab_size) is None  # two bits in one word
    bm.zero_()
    assert single_allowed_token(bm[0], vocab.vocab_size) is None

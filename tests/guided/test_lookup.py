"""Lookup drafts (guided/lookup.py): after the forced run, the tokens that followed the row's last
tokens in its prompt and output, each allowed by the grammar.

Oracles: a brute-force scan for the most recent earlier occurrence of the last n tokens (the index
must name the same continuation, built at once or token by token, across its rebuilds); the
grammar itself (every drafted token accepted by a fresh matcher walk; the first token it refuses
ends the draft); the matcher's own state (its mask and its accepting walk unchanged afterwards);
and the verifier's masks without the proposal's notes (equal with them, lookup positions included).
"""
from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided import lookup
from tokenrails.guided.forced import forced_tokens
from tokenrails.guided.lookup import LookupIndex, continue_run
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "city", "age"], "additionalProperties": False}


def _oracle_follow(tokens: list[int], tail: list[int], m: int) -> list[int]:
    """The tokens after the most recent occurrence (with a follower) of tail's last n tokens,
    n = 3, 2, 1 (longest first), by scanning."""
    for n in lookup.ORDERS:
        if len(tail) < n:
            continue
        key = tail[-n:]
        for at in range(len(tokens) - 1, n - 1, -1):  # at: the follower's index
            if tokens[at - n:at] == key:
                return tokens[at:at + m]
    return []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(0, 6), max_size=30), output=st.lists(st.integers(0, 6), max_size=30),
       tail=st.lists(st.integers(0, 6), max_size=4), m=st.integers(1, 5))
def test_the_index_names_the_continuation_of_the_most_recent_occurrence(prompt, output, tail, m):
    index = LookupIndex(prompt)
    index.sync(output[: len(output) // 2])  # incrementally, in two catch-ups
    index.sync(output)
    tokens = prompt + output
    assert index.tokens == tokens
    probe = (tokens + tail)[-4:] if tail else tokens[-3:]
    assert index.follow(probe, m) == _oracle_follow(tokens, probe, m)
    assert LookupIndex(tokens).follow(probe, m) == _oracle_follow(tokens, probe, m)  # built at once


def test_the_index_stays_bounded_and_keeps_its_newest_tokens(monkeypatch):
    monkeypatch.setattr(lookup, "MAX_TOKENS", 64)
    rnd = random.Random(3)
    index = LookupIndex([rnd.randrange(9) for _ in range(40)])
    seq = list(index.tokens)
    for _ in range(500):
        tok = rnd.randrange(9)
        index.append(tok)
        seq.append(tok)
        assert len(index.tokens) <= 64
        assert seq[-len(index.tokens):] == index.tokens
        tail = seq[-3:]
        assert index.follow(tail, 3) == _oracle_follow(index.tokens, tail, 3)


def _run(m, k, index, encode):
    then = lambda mat, out, masks: continue_run(mat, out, masks, index=index, max_tokens=k, encode=encode)  # noqa: E731
    return forced_tokens(m, k, encode=encode, then=then)


def _state(m, vocab):
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    m.fill_next_token_bitmask(bm, 0)
    return bm.clone(), m.is_terminated()


@pytest.fixture
def encode(smollm2_tokenizer):
    return lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)


def _written(spec, vocab, encode, prompt: str, written: str):
    """A matcher and a lookup index (over ``prompt``) that have both taken ``written``."""
    m = compile_guide(spec, vocab).matcher()
    index = LookupIndex(encode(prompt), vocab.token_bytes)
    for tok in encode(written):
        assert m.accept_token(tok)
        index.append(tok)
    return m, index


def test_values_are_drafted_from_the_prompt_and_the_matcher_is_left_unchanged(vocab, encode, smollm2_tokenizer):
    m, index = _written(GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False), vocab, encode,
                        'Extract: {"name": "Ada Lovelace", "city": "London", "age": 36}\nJSON:', '{"name": "')
    before = _state(m, vocab)
    forced_only = forced_tokens(m, 8, encode=encode)
    run = _run(m, 8, index, encode)
    assert _state(m, vocab)[1] == before[1] and torch.equal(_state(m, vocab)[0], before[0])
    assert forced_only.tokens == ()  # a string value: nothing forced
    assert smollm2_tokenizer.decode(list(run.tokens)).startswith("Ada Lovelace")
    assert len(run.masks) == len(run.tokens) + 1 and all(x is None for x in run.masks)  # the verifier fills them
    # every drafted token is the grammar's: a fresh walk accepts them all
    assert m.validate_tokens(list(run.tokens)) == len(run.tokens)


def test_a_refused_lookup_token_ends_the_draft(vocab, encode):
    m, index = _written(GuideSpec.regex(r"[a-z]+ [a-z]+"), vocab, encode, "hello world again hello world 42 x", "hello")
    run = _run(m, 6, index, encode)
    follow = index.follow(index.tokens[-2:], 6)  # what the lookup names: " world", " 42", ...
    assert len(follow) > len(run.tokens) >= 1
    assert list(run.tokens) == follow[: len(run.tokens)]
    refused = follow[len(run.tokens)]  # the first token the grammar refuses ends the draft
    assert m.validate_tokens(list(run.tokens) + [refused]) == len(run.tokens)
    assert m.validate_tokens(list(run.tokens)) == len(run.tokens)


def test_a_forced_key_ends_with_the_quote_token_the_row_wrote_after_keys(vocab, encode, smollm2_tokenizer):
    """The forced text after a key stops at its closing quote; the row writes ``":`` there."""
    guide = compile_guide(GuideSpec.json_schema(json.dumps(PERSON)), vocab)  # any whitespace: ":" not forced
    m = guide.matcher()
    index = LookupIndex(encode("Extract the person."), vocab.token_bytes)
    written = encode('{"name": "Ada", "')
    for tok in written:
        assert m.accept_token(tok)
        index.append(tok)
    quote = encode('"')[0]
    forced_only = forced_tokens(m, 4, encode=encode)
    assert forced_only.tokens[-1] == quote  # the canonical tokenization of the forced `city"`
    run = _run(m, 4, index, encode)
    assert smollm2_tokenizer.decode(list(run.tokens)).startswith('city":')
    assert run.tokens[: len(forced_only) - 1] == forced_only.tokens[:-1]
    assert m.validate_tokens(list(run.tokens)) == len(run.tokens)


SCHEMAS = [PERSON, {"type": "object", "properties": {
    "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
    "ok": {"type": "boolean"}}, "required": ["id", "tags", "ok"], "additionalProperties": False}]


@pytest.mark.parametrize("schema", range(len(SCHEMAS)))
def test_drafts_are_the_grammar_s_and_the_verifier_masks_equal_a_plain_walk(vocab, encode, schema):
    """Random walks: every proposal is a valid continuation that starts with the forced run, its
    known masks are the grammar's, and the verifier fills the lookup positions exactly as it does
    without the proposal's notes."""
    spec = GuideSpec.json_schema(json.dumps(SCHEMAS[schema]), any_whitespace=False)
    mgr = GuidedDecodingManager(vocab)
    row = GuidedRow("s", schema, spec)
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    prompt = encode(json.dumps({"name": "Ada Lovelace", "city": "Paris", "age": 36, "id": 7, "tags": ["red", "blue"],
                                "ok": True}))
    rnd = random.Random(schema)
    lookups = 0
    for _ in range(60):
        run = mgr.forced_tokens(row, 4, encode=encode, propose=True, lookup=lambda: prompt)
        m = mgr.sequence("s", schema).resolve()
        if m.is_terminated():
            break
        before = _state(m, vocab)
        plain = forced_tokens(m, 4, encode=encode)
        lookups += len(run) > len(plain)
        assert m.validate_tokens(list(run.tokens)) == len(run.tokens)
        swapped = len(plain) and len(run) >= len(plain) and run.tokens[len(plain) - 1] != plain.tokens[-1]
        assert run.tokens[: len(plain) - (1 if swapped else 0)] == plain.tokens[: len(plain) - (1 if swapped else 0)]
        # the verifier: with the proposal noted, and again without (a plain walk filling every position)
        drafts = [list(run.tokens)]
        noted = torch.zeros((1 + len(run), vocab.vocab_size))
        mgr.fill_and_apply_spec(noted, [row], drafts)
        walked = torch.zeros((1 + len(run), vocab.vocab_size))
        mgr.fill_and_apply_spec(walked, [row], drafts)
        assert torch.equal(torch.isfinite(noted), torch.isfinite(walked))
        assert torch.equal(_state(m, vocab)[0], before[0])
        # advance: the drafts up to a random cut, then a random allowed token
        take = list(run.tokens[: rnd.randint(0, len(run))])
        m.fill_next_token_bitmask(bm, 0)
        if take:
            assert not mgr.accept_tokens_spec([take], [row])[0].failed
        m.fill_next_token_bitmask(bm, 0)
        logits = torch.zeros((1, vocab.vocab_size))
        mgr.fill_and_apply(logits, [row])
        ids = [t for t in torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() if t not in vocab.eos_ids]
        if not ids:
            break
        pick = rnd.choice(ids) if rnd.random() < 0.3 else min(ids, key=lambda t: -len(vocab.token_bytes[t]))
        if mgr.accept_tokens([pick], [row])[0].failed:
            break
    assert lookups >= 3


def test_no_lookup_drafts_while_thinking_then_from_prompt_and_thoughts(vocab, encode, smollm2_tokenizer):
    """A thinking section is the model's own text: nothing is drafted there, although the prompt
    names a continuation; once the answer began, lookup drafts come from prompt and thoughts."""
    from tokenrails.guided.reasoning import ReasoningConfig

    mgr = GuidedDecodingManager(vocab)
    spec = GuideSpec.json_schema(json.dumps(PERSON), any_whitespace=False)
    row = GuidedRow("t", 0, spec, reasoning=ReasoningConfig.from_markers("</think>", "<think>"))
    prompt = encode('Write {"name": "Ada Lovelace", "city": "London", "age": 36} again.')
    thoughts = encode('Copy {"name": "Ada')
    for tok in thoughts:  # each of these has a continuation in the prompt
        assert mgr.forced_tokens(row, 4, encode=encode, propose=True, lookup=lambda: prompt).tokens == ()
        assert not mgr.accept_tokens([tok], [row])[0].failed
    for tok in encode("</think>") + encode('{"name": "'):
        assert not mgr.accept_tokens([tok], [row])[0].failed
    run = mgr.forced_tokens(row, 4, encode=encode, propose=True, lookup=lambda: prompt)
    text = smollm2_tokenizer.decode(list(run.tokens))
    assert text.startswith("Ada</think"), text  # the most recent occurrence: the thoughts' own "Ada" and what followed

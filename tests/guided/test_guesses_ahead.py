"""Guesses made beside the forward (``GuidedDecodingManager.forced_after`` / ``guessed_run``).

Oracles: the proposal made inline once the row really accepted the guessed tokens (a guess's
forced run equals it token for token and mask for mask; with lookup on, a guess is a valid
continuation the grammar accepts and starts with that forced run); the grammar's mask where the
bonus is sampled (every allowed token guessed for when it allows few, none outside it); the row's
state, untouched by guessing (its mask, history and error); and ``guessed_run``, which hands out a
guess only for the exact tokens it assumed.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

from tokenrails import GuideSpec, allocate_token_bitmask
from tokenrails.guided.forced import forced_tokens
from tokenrails.guided.guesses import BONUS_CANDIDATES
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow
from tokenrails.guided.budget import budget_spec

from .helpers import allowed_ids

RECORD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "kind": {"enum": ["cat", "dog"]},
    "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "ok": {"type": "boolean"}},
    "required": ["name", "kind"], "additionalProperties": False}
PROMPT = json.dumps({"name": "Ada", "kind": "cat", "age": 36, "tags": ["x"], "ok": True})


@pytest.fixture
def encode(smollm2_tokenizer):
    return lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)


def _mask(mgr, row, vocab):
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    return torch.isfinite(logits[0])


@pytest.mark.parametrize("lookup", [False, True])
def test_each_guess_is_the_proposal_made_after_its_tokens(vocab, encode, lookup):
    mgr = GuidedDecodingManager(vocab)
    spec = GuideSpec.json_schema(json.dumps(RECORD), any_whitespace=False)
    rnd = random.Random(int(lookup))
    guessed = few = checked = 0
    for trial in range(6):
        row = GuidedRow(("g", trial), 0, spec)
        mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
        prompt = encode(PROMPT)
        for _ in range(40):
            run = mgr.forced_tokens(row, 4, encode=encode, propose=True, lookup=(lambda: prompt) if lookup else False)
            st = mgr.sequence(("g", trial), 0)
            m = st.resolve()
            if m.is_terminated():
                break
            before = (_mask(mgr, row, vocab), list(st.history), st.error)
            guesses = mgr.forced_after(row, run.tokens, 4, encode=encode, lookup=lookup)
            assert torch.equal(_mask(mgr, row, vocab), before[0])  # state untouched
            assert list(st.history) == before[1] and st.error is before[2]
            # the bonus position: the forced token if any, else the few allowed tokens (+ lookup's)
            walked = 0
            for t in run.tokens:
                assert m.accept_token(t)
                walked += 1
            bm = allocate_token_bitmask(1, vocab.vocab_size)
            bonus_forced = forced_tokens(m, 1, encode=encode).tokens
            m.fill_next_token_bitmask(bm, 0)
            allowed = [t for t in allowed_ids(bm[0], vocab.vocab_size).tolist() if t not in vocab.eos_ids]
            terminated = m.is_terminated()
            if walked:
                m.rollback(walked)
            bonuses = [g[1][-1] for g in guesses]
            assert all(g[1][:-1] == tuple(run.tokens) for g in guesses)
            assert set(bonuses) <= set(allowed)
            if not terminated:
                if bonus_forced:
                    assert bonuses == [bonus_forced[0]]
                elif len(allowed_ids(bm[0], vocab.vocab_size)) <= BONUS_CANDIDATES:  # EOS counted
                    assert set(allowed) <= set(bonuses)
                    few += 1
            guessed += bool(guesses)
            # advance as the engine would: the drafts (all, or up to a cut), then a bonus
            take = list(run.tokens) if rnd.random() < 0.8 else list(run.tokens[: rnd.randint(0, len(run))])
            if take:
                assert not mgr.accept_tokens_spec([take], [row])[0].failed
            ids = [t for t in allowed_ids_after(mgr, row, vocab) if t not in vocab.eos_ids]
            if not ids:
                break
            pick = rnd.choice(bonuses) if bonuses and len(take) == len(run) and rnd.random() < 0.7 else rnd.choice(ids)
            if mgr.accept_tokens([pick], [row])[0].failed:
                break
            used = mgr.guessed_run(row, guesses)
            expected_here = len(take) == len(run) and pick in bonuses
            assert (used is not None) == expected_here
            if used is not None:
                checked += 1
                now = mgr.forced_tokens(row, 4, encode=encode)  # the inline proposal, forced part
                if lookup:  # lookup tokens are looked up as the index stood before: a valid continuation
                    assert used.tokens[: len(now)] == now.tokens or len(now) == 0
                    assert st.resolve().validate_tokens(list(used.tokens)) == len(used.tokens)
                else:
                    assert used.tokens == now.tokens and used.single == now.single
                    assert [x if not hasattr(x, "shape") else x.tolist() for x in used.masks] == [
                        x if not hasattr(x, "shape") else x.tolist() for x in now.masks]
    assert guessed >= 10 and checked >= 5 and few >= 2, (guessed, checked, few)


def allowed_ids_after(mgr, row, vocab):
    return torch.isfinite(_logits(mgr, row, vocab)).nonzero().reshape(-1).tolist()


def _logits(mgr, row, vocab):
    logits = torch.zeros((1, vocab.vocab_size))
    mgr.fill_and_apply(logits, [row])
    return logits[0]


def test_a_guess_past_the_row_s_budget_does_not_end_the_row(vocab, encode):
    """Guessing walks tokens the row has not written: its max_tokens budget must not count them
    (the row's own fill ends a row past its budget; a guess only reads the grammar)."""
    mgr = GuidedDecodingManager(vocab)
    spec = budget_spec(GuideSpec.regex(r"[a-z]{1,12}(,[a-z]{1,12}){0,3}"))
    row = GuidedRow("b", 0, spec, max_tokens=5)
    mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
    guesses = mgr.forced_after(row, encode("abc,def,ghi"), 4, encode=encode)
    assert mgr.sequence("b", 0).error is None
    assert all(g[1][:-1] == tuple(encode("abc,def,ghi")) for g in guesses)

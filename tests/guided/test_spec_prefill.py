"""Verification masks filled before the logits exist (``fill_spec`` / ``apply_filled_spec``).

Oracle: ``fill_and_apply_spec`` on the same rows and drafts, run on a copy of the logits (bit for
bit the same masked logits and statuses), for proposed runs (only their positions masked) and for
other drafts (every position), over random walks of two JSON grammars. Masks that no longer fit
(a row advanced since, other drafts, another batch) are refused, nothing applied.
"""
from __future__ import annotations

import json
import random

import torch

from tokenrails import GuideSpec
from tokenrails.guided.manager import GuidedDecodingManager, GuidedRow

RECORD = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "kind": {"enum": ["cat", "dog"]},
    "age": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "kind", "age"], "additionalProperties": False}
TOOL = {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}, "required": ["name", "arguments"], "additionalProperties": False}


def _rows(vocab):
    mgr = GuidedDecodingManager(vocab)
    specs = [GuideSpec.json_schema(json.dumps(s), any_whitespace=False) for s in (RECORD, TOOL)]
    rows = [GuidedRow(("p", i), 0, specs[i % 2]) for i in range(4)]
    mgr.fill_and_apply(torch.zeros((4, vocab.vocab_size)), rows)
    return mgr, rows


def _logits(batch, width, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch * (1 + width), vocab.vocab_size), generator=g)


def test_masks_filled_ahead_equal_the_fill_at_verification(vocab, smollm2_tokenizer):
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    mgr, rows = _rows(vocab)
    batch_rows = [rows[0], None, rows[1], rows[2], rows[3]]  # an unguided row among them
    rnd = random.Random(0)
    checked = 0
    for step in range(25):
        runs = [mgr.forced_tokens(r, 4, encode=encode, propose=True) if r is not None and step % 3 else None
                for r in batch_rows]
        width = 4
        drafts = []
        for r, run in zip(batch_rows, runs):
            if run is not None:  # the proposer's run, then fillers (the engine's block)
                drafts.append(list(run.tokens) + [0] * (width - len(run.tokens)))
            else:  # drafts no proposer noted: every position masked
                drafts.append([rnd.randrange(vocab.vocab_size) for _ in range(width)])
        ahead = mgr.fill_spec(batch_rows, [list(run.tokens) if run is not None else d
                                           for run, d in zip(runs, drafts)])
        logits = _logits(len(batch_rows), width, vocab, step)
        want = logits.clone()
        for r, run in zip(batch_rows, runs):  # the inline path sees the same notes
            if r is not None and run is not None:
                mgr.forced_tokens(r, 4, encode=encode, propose=True)
        got = mgr.apply_filled_spec(logits, ahead, batch_rows, drafts)
        statuses = mgr.fill_and_apply_spec(want, batch_rows, drafts)
        assert got is not None
        assert torch.equal(logits, want)
        assert [(s.state, s.valid_drafts) if s else None for s in got] == \
            [(s.state, s.valid_drafts) if s else None for s in statuses]
        checked += 1
        # advance every row: its run, then one allowed token
        for r, run in zip(batch_rows, runs):
            if r is None:
                continue
            if run is not None and run.tokens:
                mgr.accept_tokens_spec([list(run.tokens)], [r])
            probe = torch.zeros((1, vocab.vocab_size))
            mgr.fill_and_apply(probe, [r])
            ids = [t for t in torch.isfinite(probe[0]).nonzero().reshape(-1).tolist() if t not in vocab.eos_ids]
            if ids:
                mgr.accept_tokens([rnd.choice(ids[:20])], [r])
    assert checked >= 10


def test_masks_that_no_longer_fit_are_refused(vocab, smollm2_tokenizer):
    encode = lambda text: smollm2_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    mgr, rows = _rows(vocab)
    runs = [mgr.forced_tokens(r, 4, encode=encode, propose=True) for r in rows]
    drafts = [list(run.tokens) + [0] * (4 - len(run)) for run in runs]
    ahead = mgr.fill_spec(rows, [list(run.tokens) for run in runs])
    logits = _logits(4, 4, vocab, 1)
    before = logits.clone()
    # another batch (rows in another order), other drafts: refused
    assert mgr.apply_filled_spec(logits, ahead, rows[::-1], drafts[::-1]) is None
    longest = max(range(4), key=lambda i: len(runs[i]))
    assert len(runs[longest]) > 0
    other = [list(d) for d in drafts]
    other[longest][0] = (other[longest][0] + 1) % vocab.vocab_size
    assert mgr.apply_filled_spec(logits, ahead, rows, other) is None
    # a row advanced since the fill: refused
    mgr.accept_tokens_spec([list(runs[longest].tokens)], [rows[longest]])
    assert mgr.apply_filled_spec(logits, ahead, rows, drafts) is None
    assert torch.equal(logits, before)

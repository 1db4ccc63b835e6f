"""Per-step fill deadline and empty rows in every fill path (issue 16).

A backend whose mask takes longer than ``GuideLimits.max_fill_seconds`` fails that row alone with
``GuideTimeoutError`` (EOS only from then on, the fill is never repeated); a mask that allows
nothing ends its row instead of leaving an all -inf row, in the speculative path too. The slow and
empty matchers are test doubles around a real xgrammar matcher, registered as a backend.
"""
from __future__ import annotations

import time

import torch

from tokenrails import GuideLimits, GuideSpec, GuidedDecodingManager
from tokenrails.guided.backend import CompiledGuide, GuideBackend, Matcher
from tokenrails.guided.errors import GuideTimeoutError
from tokenrails.guided.manager import GuidedRow, StepStatus
from tokenrails.guided.registry import compile_guide, register_backend, unregister_backend

SLOW_PATTERN = "slow[a-z]*"
EMPTY_AFTER = "dead"  # the double's mask is empty once this text was accepted


class _Wrapped(Matcher):
    """A real xgrammar matcher; slow to fill for SLOW_PATTERN, empty after EMPTY_AFTER."""

    def __init__(self, inner: Matcher, vocab, slow: float, fills: list):
        self.inner, self.vocab, self.slow, self.fills = inner, vocab, slow, fills
        self.text = b""

    def fill_next_token_bitmask(self, bitmask, index=0):
        self.fills.append(self)
        if self.slow:
            time.sleep(self.slow)
        if EMPTY_AFTER.encode() in self.text:
            bitmask[index].zero_()
            return True
        return self.inner.fill_next_token_bitmask(bitmask, index)

    def accept_token(self, token_id):
        ok = self.inner.accept_token(token_id)
        if ok:
            self.text += self.vocab.token_bytes[token_id]
        return ok

    def rollback(self, num_tokens):
        self.inner.rollback(num_tokens)

    def is_terminated(self):
        return self.inner.is_terminated()

    def reset(self):
        self.inner.reset()
        self.text = b""

    def find_jump_forward_string(self):
        return ""


class _Guide(CompiledGuide):
    backend = "wrapped-test"

    def __init__(self, spec, vocab, inner, slow, fills):
        super().__init__(spec, vocab)
        self.inner, self.slow, self.fills = inner, slow, fills

    def matcher(self):
        return _Wrapped(self.inner.matcher(), self.vocab, self.slow, self.fills)


class _Backend(GuideBackend):
    name = "wrapped-test"
    kinds = frozenset({"regex"})
    fills: list = []

    def compile(self, spec):
        inner = compile_guide(spec, self.vocab, backend="xgrammar")
        return _Guide(spec, self.vocab, inner, 0.6 if spec.pattern == SLOW_PATTERN else 0.0, self.fills)


def _manager(vocab, **limits):
    register_backend("wrapped-test", _Backend)
    return GuidedDecodingManager(vocab, backend="wrapped-test", limits=GuideLimits(**limits))


def _allowed(logits_row):
    return (~torch.isinf(logits_row)).nonzero().flatten().tolist()


def test_a_row_past_the_fill_deadline_ends_alone(vocab):
    mgr = _manager(vocab, max_fill_seconds=0.3)
    try:
        rows = [GuidedRow("slow", 0, GuideSpec.regex(SLOW_PATTERN)),
                GuidedRow("fast", 0, GuideSpec.regex("[a-z]+")), None]
        for r in rows[:2]:
            mgr.get_compiled(r.spec)
        logits = torch.zeros((3, vocab.vocab_size))
        statuses = mgr.fill_and_apply(logits, rows)
        assert statuses[0].state is StepStatus.ERROR and isinstance(statuses[0].error, GuideTimeoutError)
        assert statuses[0].error.limit == "max_fill_seconds"
        assert _allowed(logits[0]) == list(vocab.eos_ids)
        assert statuses[1].state is StepStatus.OK and len(_allowed(logits[1])) > 100
        assert not torch.isinf(logits[2]).any()  # the unguided row is untouched
        # the slow row is never filled again: later steps cost nothing for it
        _Backend.fills.clear()
        logits = torch.zeros((3, vocab.vocab_size))
        statuses = mgr.fill_and_apply(logits, rows)
        assert all(not m.slow for m in _Backend.fills)
        assert _allowed(logits[0]) == list(vocab.eos_ids) and statuses[1].state is StepStatus.OK
    finally:
        mgr.close()
        unregister_backend("wrapped-test")


def test_the_deadline_is_configurable(vocab):
    mgr = _manager(vocab, max_fill_seconds=5.0)
    try:
        row = GuidedRow("slow", 0, GuideSpec.regex(SLOW_PATTERN))
        mgr.get_compiled(row.spec)
        (st,) = mgr.fill_and_apply(torch.zeros((1, vocab.vocab_size)), [row])
        assert st.state is StepStatus.OK
    finally:
        mgr.close()
        unregister_backend("wrapped-test")


def test_empty_mask_in_a_speculative_step_ends_the_row_not_the_batch(vocab, smollm2_tokenizer):
    mgr = _manager(vocab)
    try:
        spec = GuideSpec.regex("[a-z]+")
        rows = [GuidedRow("e", 0, spec), GuidedRow("ok", 0, spec)]
        dead = smollm2_tokenizer.encode(EMPTY_AFTER, add_special_tokens=False)
        for t in dead:  # row 0 reaches the state whose mask is empty
            (st,) = mgr.accept_tokens([t], [rows[0]])
            assert st.state is StepStatus.OK
        drafts = [smollm2_tokenizer.encode("ab", add_special_tokens=False)] * 2
        k = len(drafts[0])
        logits = torch.zeros((2 * (1 + k), vocab.vocab_size))
        statuses = mgr.fill_and_apply_spec(logits, rows, drafts)
        assert statuses[0].state is StepStatus.ERROR
        for j in range(1 + k):  # every verification row of the dead block: EOS only, never all -inf
            assert _allowed(logits[j]) == list(vocab.eos_ids)
        assert statuses[1].state is StepStatus.OK and statuses[1].valid_drafts == k
        assert not torch.isinf(logits[1 + k:]).all(dim=1).any()
    finally:
        mgr.close()
        unregister_backend("wrapped-test")

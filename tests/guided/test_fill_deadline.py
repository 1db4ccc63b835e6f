"""Per-step fill deadline and empty rows in every fill path (issue 16).

A backend whose mask costs more than ``GuideLimits.max_fill_seconds`` of CPU fails that row alone
with ``GuideTimeoutError`` (EOS only from then on, the fill is never repeated); a fill whose wall
time a busy machine stretched (its thread off the CPU, a wait for the row's compile) is served. A
mask that allows nothing ends its row instead of leaving an all -inf row, in the speculative path
too. The slow, stalled and empty matchers are test doubles around a real xgrammar matcher,
registered as a backend.
"""
from __future__ import annotations

import re
import time

import torch

from tokenrails import GuideLimits, GuideSpec, GuidedDecodingManager
from tokenrails.guided.backend import CompiledGuide, GuideBackend, Matcher
from tokenrails.guided.errors import GuideTimeoutError
from tokenrails.guided.manager import GuidedRow, StepStatus
from tokenrails.guided.reasoning import ReasoningConfig
from tokenrails.guided.registry import compile_guide, register_backend, unregister_backend

SLOW_PATTERN = "slow[a-z]*"  # a hostile grammar: each fill burns 0.4 s of CPU
STALLED_PATTERN = "wait[a-z]*"  # each fill's thread is off the CPU for 0.4 s (a loaded machine)
LATE_PATTERN = "late[a-z]*"  # its compile takes 0.4 s of wall time (a loaded machine)
EMPTY_AFTER = "dead"  # the double's mask is empty once this text was accepted


def _burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time (what an expensive native mask does)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Wrapped(Matcher):
    """A real xgrammar matcher; slow to fill for SLOW_PATTERN, empty after EMPTY_AFTER."""

    def __init__(self, inner: Matcher, vocab, slow: float, fills: list, stall: float = 0.0):
        self.inner, self.vocab, self.slow, self.fills, self.stall = inner, vocab, slow, fills, stall
        self.text = b""

    def fill_next_token_bitmask(self, bitmask, index=0):
        self.fills.append(self)
        _burn(self.slow)
        time.sleep(self.stall)
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
        return _Wrapped(self.inner.matcher(), self.vocab, self.slow, self.fills,
                        stall=0.4 if self.spec.pattern == STALLED_PATTERN else 0.0)


class _Backend(GuideBackend):
    name = "wrapped-test"
    kinds = frozenset({"regex"})
    fills: list = []

    def compile(self, spec):
        if spec.pattern == LATE_PATTERN:
            time.sleep(0.4)
        inner = compile_guide(spec, self.vocab, backend="xgrammar")
        return _Guide(spec, self.vocab, inner, 0.4 if spec.pattern == SLOW_PATTERN else 0.0, self.fills)


def _manager(vocab, **limits):
    register_backend("wrapped-test", _Backend)
    return GuidedDecodingManager(vocab, backend="wrapped-test", limits=GuideLimits(**limits))


def _allowed(logits_row):
    return (~torch.isinf(logits_row)).nonzero().flatten().tolist()


def test_a_row_past_the_fill_deadline_ends_alone(vocab):
    mgr = _manager(vocab, max_fill_seconds=0.2)
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


def _decode(mgr, rows, vocab, tokens):
    """``tokens`` then EOS on every row through fill_and_apply / accept_tokens, each allowed by
    its mask; returns the last statuses."""
    eos = list(vocab.eos_ids)[0]
    for tok in list(tokens) + [eos]:
        logits = torch.zeros((len(rows), vocab.vocab_size))
        for st in mgr.fill_and_apply(logits, rows):
            assert st.state is StepStatus.OK, st.error
        assert not torch.isinf(logits[:, tok]).any(), f"token {tok} masked"
        statuses = mgr.accept_tokens([tok] * len(rows), rows)
    return statuses


def test_a_fill_a_busy_machine_stretched_is_served(vocab, smollm2_tokenizer):
    """Each fill's thread is off the CPU for 0.4 s (other processes' turns, the GIL), its grammar
    costs microseconds: the row is served to the end under a 0.2 s limit, alone and filled in a
    group with another row."""
    mgr = _manager(vocab, max_fill_seconds=0.2)
    try:
        text = "wait"
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        for rows in ([GuidedRow("busy", 0, GuideSpec.regex(STALLED_PATTERN))],
                     [GuidedRow("busy", 1, GuideSpec.regex(STALLED_PATTERN)),
                      GuidedRow("fast", 1, GuideSpec.regex("[a-z]+"))]):
            statuses = _decode(mgr, rows, vocab, ids)
            assert all(st.state is StepStatus.TERMINATED for st in statuses), statuses
        assert re.fullmatch(STALLED_PATTERN, text)
    finally:
        mgr.close()
        unregister_backend("wrapped-test")


def test_a_thinking_rows_first_fill_waits_for_its_compile_unbilled(vocab, smollm2_tokenizer):
    """A think-first row the model may open or answer directly needs its grammar's row in its
    first step: that fill waits for the compile (0.4 s here, seconds on a loaded machine), which
    has its own deadline and is not the fill's cost. The row is served, thinking then answering."""
    mgr = _manager(vocab, max_fill_seconds=0.2)
    try:
        cfg = ReasoningConfig.from_markers("</think>", "<think>", optional=True)
        row = GuidedRow("think", 0, GuideSpec.regex(LATE_PATTERN), reasoning=cfg)
        text = "<think>hm</think>late"
        (st,) = _decode(mgr, [row], vocab, smollm2_tokenizer.encode(text, add_special_tokens=False))
        assert st.state is StepStatus.TERMINATED, st.error
        assert re.fullmatch(LATE_PATTERN, text.split("</think>", 1)[1])
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

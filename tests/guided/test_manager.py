"""GuidedDecodingManager: lifecycle, caching, mixed batches, fail-closed rows."""
import json
import threading
import time

import jsonschema
import pytest
import torch

from tokenrails import (
    GuidedDecodingManager,
    GuideLimits,
    GuideSpec,
    GuideTimeoutError,
    InvalidGuideError,
    UnsupportedGuideError,
)
from tokenrails.guided.backend import CompiledGuide, GuideBackend
from tokenrails.guided.manager import GuidedRow, StepStatus
from tokenrails.guided.registry import register_backend, unregister_backend

from .helpers import decode_text

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


@pytest.fixture
def mgr(vocab):
    m = GuidedDecodingManager(vocab, backend="xgrammar", fill_threads=2, parallel_fill_threshold=4)
    yield m
    m.close()


def run_batch(mgr, vocab, rows, steps=300, seed=0, worst=True):
    """Drive a whole batch with random logits; returns per-row ids and final statuses."""
    gen = torch.Generator().manual_seed(seed)
    n = len(rows)
    outs = [[] for _ in range(n)]
    done = [False] * n
    last = [None] * n
    for _ in range(steps):
        logits = torch.randn((n, vocab.vocab_size), generator=gen)
        before = logits.clone()
        active = [r if not done[i] else None for i, r in enumerate(rows)]
        statuses = mgr.fill_and_apply(logits, active)
        for i, r in enumerate(active):
            if r is None:  # unguided and finished rows: untouched bit-for-bit
                assert torch.equal(logits[i].view(torch.int32), before[i].view(torch.int32))
        finite = torch.isfinite(logits)
        pick = torch.where(finite, logits, torch.inf).argmin(-1) if worst else logits.argmax(-1)
        statuses = mgr.accept_tokens(pick, active)
        for i, st in enumerate(statuses):
            if active[i] is None:
                continue
            last[i] = st
            if st.state is StepStatus.OK:
                outs[i].append(int(pick[i]))
            else:
                done[i] = True
        if all(done[i] or rows[i] is None for i in range(n)):
            break
    return outs, last


def test_mixed_batch_valid_outputs_and_untouched_unguided_rows(mgr, vocab):
    specs = [GuideSpec.json_schema(SCHEMA, any_whitespace=False), None, GuideSpec.regex(r"[a-c]{2,5}"), GuideSpec.choice(["alpha", "beta"]), None]
    rows = [GuidedRow("s", i, s) if s is not None else None for i, s in enumerate(specs)]
    outs, last = run_batch(mgr, vocab, rows)
    jsonschema.validate(json.loads(decode_text(vocab, outs[0])), SCHEMA)
    assert 2 <= len(decode_text(vocab, outs[2])) <= 5
    assert decode_text(vocab, outs[3]) in ("alpha", "beta")
    assert all(last[i].state is StepStatus.TERMINATED for i in (0, 2, 3))
    m = mgr.request_metrics("s", 0)
    assert m["tokens"] > 0 and m["grammar_per_token_s"] > 0


def test_bad_spec_fails_only_its_row(mgr, vocab):
    rows = [GuidedRow("a", 0, GuideSpec.regex("(unclosed")), GuidedRow("a", 1, GuideSpec.regex("[xy]{3}")), None]
    logits = torch.randn(3, vocab.vocab_size)
    statuses = mgr.fill_and_apply(logits, rows)
    assert statuses[0].state is StepStatus.ERROR and isinstance(statuses[0].error, InvalidGuideError)
    assert statuses[1].state is StepStatus.OK and statuses[2] is None
    # the failed row may only end: EOS is its single finite logit
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)
    assert torch.isfinite(logits[1]).sum() > 0
    with pytest.raises(InvalidGuideError):
        mgr.matcher_for("a", 0, GuideSpec.regex("(unclosed"))
    assert mgr.stats()["compile_failures"] == 1
    # the negative cache answers a repeat without compiling again
    mgr.fill_and_apply(torch.randn(1, vocab.vocab_size), [GuidedRow("b", 0, GuideSpec.regex("(unclosed"))])
    assert mgr.stats()["compile_failures"] == 1


def test_rejected_token_fails_closed(mgr, vocab):
    row = GuidedRow("r", 0, GuideSpec.regex("[0-9]+"))
    mgr.fill_and_apply(torch.randn(1, vocab.vocab_size), [row])
    bad = vocab.token_bytes.index(b"z")
    (st,) = mgr.accept_tokens([bad], [row])
    assert st.state is StepStatus.REJECTED and st.error.token_id == bad
    logits = torch.randn(1, vocab.vocab_size)
    (st,) = mgr.fill_and_apply(logits, [row])
    assert st.failed
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)
    assert mgr.stats()["rejections"] == 1


def test_new_spec_on_same_sequence_gets_a_fresh_matcher(mgr, vocab):
    first = mgr.matcher_for("sess", 0, GuideSpec.choice(["a"]))
    assert first.accept_token(vocab.token_bytes.index(b"a")) and first.accept_token(vocab.eos_ids[0])
    assert first.is_terminated()
    second = mgr.matcher_for("sess", 0, GuideSpec.choice(["b"]))
    assert second is not first and not second.is_terminated()
    assert mgr.stats()["active_matchers"] == 1


def test_ten_thousand_sessions_leave_nothing_behind(vocab):
    limits = GuideLimits(cache_max_entries=8)
    mgr = GuidedDecodingManager(vocab, backend="xgrammar", limits=limits)
    specs = [GuideSpec.regex(f"[a-z]{{{i}}}") for i in range(1, 21)]
    for s in range(10_000):
        spec = specs[s % len(specs)]
        for seq in range(2):
            mgr.matcher_for(s, seq, spec)
        mgr.end_session(s)
    st = mgr.stats()
    assert st["active_matchers"] == 0 and st["active_sessions"] == 0
    assert st["cache_entries"] <= 8
    mgr.close()


class _SlowGuide(CompiledGuide):
    backend = "slow"

    def matcher(self):
        raise AssertionError("never reached")


class _SlowBackend(GuideBackend):
    name = "slow-test"
    kinds = frozenset({"regex"})
    release = threading.Event()

    def compile(self, spec):
        self.release.wait(10)
        return _SlowGuide(spec, self.vocab)


def test_compile_timeout_is_per_request(vocab):
    register_backend("slow-test", _SlowBackend)
    mgr = GuidedDecodingManager(vocab, backend="slow-test", limits=GuideLimits(compile_timeout_s=0.2))
    try:
        start = time.monotonic()
        with pytest.raises(GuideTimeoutError) as info:
            mgr.get_compiled(GuideSpec.regex("a"))
        assert time.monotonic() - start < 2
        assert info.value.limit == "compile_timeout_s"
        assert mgr.stats()["timeouts"] == 1
    finally:  # never leave a test backend where other tests (e.g. `tokenrails check`) would find it
        _SlowBackend.release.set()
        mgr.close()
        unregister_backend("slow-test")


def test_prefetch_overlaps_and_then_hits_the_cache(mgr):
    spec = GuideSpec.json_schema(SCHEMA)
    mgr.prefetch(spec)
    mgr.prefetch(spec)  # idempotent while in flight
    g1 = mgr.get_compiled(spec)
    g2 = mgr.get_compiled(spec)
    assert g1 is g2
    st = mgr.stats()
    assert st["compiles"] == 1 and st["cache_hits"] >= 1 and st["compiles_in_flight"] == 0


def test_unsupported_spec_reports_unsupported(mgr, vocab):
    rows = [GuidedRow("u", 0, GuideSpec.json_schema({"type": "array", "uniqueItems": True}))]
    (st,) = mgr.fill_and_apply(torch.randn(1, vocab.vocab_size), rows)
    assert isinstance(st.error, UnsupportedGuideError)


def test_bitmask_buffer_is_reused(mgr, vocab):
    rows = [GuidedRow("z", i, GuideSpec.regex("[a-z]+")) for i in range(4)]
    mgr.fill_and_apply(torch.randn(4, vocab.vocab_size), rows)
    buf = mgr.step.buffer.host
    for _ in range(3):
        mgr.fill_and_apply(torch.randn(4, vocab.vocab_size), rows)
    assert mgr.step.buffer.host is buf


def test_operator_policy_refuses_a_kind_for_that_row_only(vocab):
    from tokenrails import GuidePolicy, GuidePolicyError

    mgr = GuidedDecodingManager(vocab, backend="xgrammar", policy=GuidePolicy.json_schema_only())
    rows = [GuidedRow("p", 0, GuideSpec.regex("[a-z]+")), GuidedRow("p", 1, GuideSpec.json_schema(SCHEMA))]
    logits = torch.randn(2, vocab.vocab_size)
    statuses = mgr.fill_and_apply(logits, rows)
    assert isinstance(statuses[0].error, GuidePolicyError) and statuses[0].error.rule == "allowed_kinds"
    assert statuses[1].state is StepStatus.OK
    assert torch.isfinite(logits[0]).nonzero().reshape(-1).tolist() == list(vocab.eos_ids)
    mgr.close()


def test_auto_reports_a_limit_when_the_request_is_too_big_for_every_backend(vocab):
    from tokenrails import GuideLimitError, compile_guide

    limits = GuideLimits(max_enum_values=3)
    with pytest.raises(GuideLimitError) as info:
        compile_guide(GuideSpec.choice(["a", "b", "c", "d", "e"]), vocab, limits=limits)
    assert info.value.limit == "max_enum_values"


@pytest.mark.parametrize("rows,threshold,expect", [(8, 4, 3), (3, 4, 1), (8, 64, 1)])
def test_fill_threads_go_to_the_native_fill_above_the_threshold(vocab, monkeypatch, rows, threshold, expect):
    """``fill_threads``/``parallel_fill_threshold`` reach the backend's batch fill (they were
    documented but unused); the masks do not depend on them."""
    from tokenrails.guided.backends.xgrammar_backend import XGrammarMatcher

    seen = []
    original = XGrammarMatcher.batch_fill.__func__

    def spy(cls, matchers, bitmask, idx, threads=1):
        seen.append(threads)
        return original(cls, matchers, bitmask, idx, threads)

    monkeypatch.setattr(XGrammarMatcher, "batch_fill", classmethod(spy))
    masks = []
    for fill_threads in (expect, 1):
        m = GuidedDecodingManager(vocab, backend="xgrammar", fill_threads=fill_threads,
                                  parallel_fill_threshold=threshold)
        spec = GuideSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
        batch = [GuidedRow(f"s{i}", 0, spec) for i in range(rows)]
        logits = torch.zeros((rows, vocab.vocab_size))
        m.fill_and_apply(logits, batch)
        masks.append(torch.isinf(logits))
        m.close()
    assert seen[0] == expect
    assert torch.equal(masks[0], masks[1])

"""``GuidedDecodingManager.poll``: the readiness check an engine asks before a sequence joins its
batch (it starts the compile, never waits), and ``end_session_soon`` of one sequence."""
from __future__ import annotations

import time

import pytest
import torch

from tokenrails import GuidedDecodingManager, GuideLimits, GuideSpec, GuideTimeoutError
from tokenrails.guided import manager as core
from tokenrails.guided.sequence import GuidedRow


def _slow(monkeypatch, seconds: float) -> None:
    real = core.compile_guide

    def compile_guide(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "compile_guide", compile_guide)


def test_poll_starts_the_compile_and_never_waits(vocab, monkeypatch):
    _slow(monkeypatch, 3.0)
    mgr = GuidedDecodingManager(vocab, backend="fsm")
    spec = GuideSpec.regex("[0-9]{3}")
    t0 = time.monotonic()
    assert mgr.poll(spec) is False
    assert time.monotonic() - t0 < 1.5  # a poll that waited would take the compile's 3 s
    while not mgr.poll(spec):
        time.sleep(0.02)
    assert mgr.stats()["compiles"] == 1 and mgr.compiled([GuidedRow("s", 0, spec)])
    mgr.close()


def test_a_compile_past_its_deadline_is_ready_and_fails_the_row(vocab, monkeypatch):
    _slow(monkeypatch, 1.0)
    mgr = GuidedDecodingManager(vocab, backend="fsm", limits=GuideLimits(compile_timeout_s=0.2))
    spec = GuideSpec.regex("[a-z]{3}")
    assert mgr.poll(spec) is False
    time.sleep(0.3)
    assert mgr.poll(spec) is True  # joins now, to fail closed
    logits = torch.zeros(1, vocab.vocab_size)
    (status,) = mgr.fill_and_apply(logits, [GuidedRow("s", 0, spec)])
    assert isinstance(status.error, GuideTimeoutError)
    mgr.close()


def test_end_session_soon_of_one_sequence(vocab):
    mgr = GuidedDecodingManager(vocab, backend="fsm")
    spec = GuideSpec.regex("[0-9]+")
    mgr.fill_rows([GuidedRow("s", 1, spec), GuidedRow("s", 2, spec)])
    mgr.end_session_soon("s", 1)
    assert mgr.stats()["active_matchers"] == 1 and mgr.sequence("s", 2) is not None
    mgr.end_session_soon("s")
    assert mgr.stats()["active_matchers"] == 0 and mgr.stats()["active_sessions"] == 0
    mgr.close()


def test_a_request_fails_at_its_own_deadline_while_the_compile_serves_others(vocab, monkeypatch):
    """A request that spent most of its time before reaching the manager (its own deadline, on
    its spec object) is failed then, by poll and by its state's grammar, without waiting for the
    compile's full deadline; an equal spec from another request still gets the compiled guide."""
    from tokenrails.guided.compile_timeouts import with_deadline

    _slow(monkeypatch, 1.5)
    mgr = GuidedDecodingManager(vocab, backend="fsm", limits=GuideLimits(compile_timeout_s=30))
    late = with_deadline(GuideSpec.regex("[a-c]{4}"), time.monotonic() + 0.3)
    other = GuideSpec.regex("[a-c]{4}")
    t0 = time.monotonic()
    assert mgr.poll(late) is False and mgr.poll(other) is False
    while not mgr.poll(late):
        time.sleep(0.02)
    failed_after = time.monotonic() - t0
    assert failed_after < 1.2, f"the request waited {failed_after:.2f} s past its own 0.3 s"
    logits = torch.zeros(1, vocab.vocab_size)
    (status,) = mgr.fill_and_apply(logits, [GuidedRow("late", 0, late)])
    assert isinstance(status.error, GuideTimeoutError)
    assert time.monotonic() - t0 < 1.2  # failed closed at once, not after the compile
    assert mgr.poll(other) is False  # the compile goes on for the other request
    while not mgr.poll(other):
        time.sleep(0.02)
    (ok,) = mgr.fill_and_apply(torch.zeros(1, vocab.vocab_size), [GuidedRow("other", 0, other)])
    assert ok.error is None
    mgr.close()

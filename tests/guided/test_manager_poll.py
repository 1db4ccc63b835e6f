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
    _slow(monkeypatch, 0.5)
    mgr = GuidedDecodingManager(vocab, backend="fsm")
    spec = GuideSpec.regex("[0-9]{3}")
    t0 = time.monotonic()
    assert mgr.poll(spec) is False
    assert time.monotonic() - t0 < 0.2
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

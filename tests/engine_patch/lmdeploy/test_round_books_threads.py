"""The LMDeploy manager's round books (``_rounds``, ``_begun``, ``_failed``) are written by the
event loop (``end_session``, ``clear``) and by the worker threads that prepare rows
(``note_round``, ``fail_rounds``). Every read-modify-write and every walk of them is under one lock:
without it a session ending while rows are noted raises "dictionary changed size during
iteration" on the loop, or leaves a round of an ended session in the books."""
from __future__ import annotations

import contextlib
import sys
import threading

import pytest

pytest.importorskip("lmdeploy")

from tokenrails.guided.errors import InvalidGuideError

SESSIONS = 40
ROUNDS = 60


def _hammer(mgr) -> list[BaseException]:
    """Writers note rounds and failures of many sessions while the 'loop' ends sessions; the
    switch interval is tiny so threads interleave inside each walk."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
                stop.set()
        return run

    def writer(offset: int):
        for r in range(ROUNDS):
            if stop.is_set():
                return
            for s in range(SESSIONS):
                mgr.note_round(s, (offset, r))
            mgr.fail_rounds({(s, (offset, r)): InvalidGuideError("x") for s in range(0, SESSIONS, 7)})

    def loop():
        for r in range(ROUNDS):
            if stop.is_set():
                return
            for s in range(SESSIONS):
                mgr.end_session(s)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=guarded(lambda o=o: writer(o))) for o in range(2)]
        threads.append(threading.Thread(target=guarded(loop)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors


def _manager(smollm2_tokenizer, vocab):
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    return LMDeployGuidedManager(smollm2_tokenizer, vocab.vocab_size, vocab=vocab)


def test_round_books_survive_sessions_ending_while_rows_are_noted(smollm2_tokenizer, vocab):
    mgr = _manager(smollm2_tokenizer, vocab)
    assert _hammer(mgr) == []
    for s in range(SESSIONS):
        mgr.end_session(s)
    assert not mgr.view.rounds and not mgr.view.begun and not mgr.view.failed


def test_the_hammer_finds_the_race_without_the_lock(smollm2_tokenizer, vocab):
    """The test above can fail: with the books' lock replaced by a no-op the same hammer breaks."""
    mgr = _manager(smollm2_tokenizer, vocab)
    mgr._books = contextlib.nullcontext()
    for _ in range(20):  # it breaks on the first try here; tries to spare for a slower machine
        errors = _hammer(mgr)
        if errors:
            break
    assert errors and isinstance(errors[0], RuntimeError), errors

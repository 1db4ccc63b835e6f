"""The LMDeploy manager's round bookkeeping is shared by the event loop (clean-up calls) and the
worker threads that prepare rows: ending a session while rows of others are noted or prepared
must neither raise nor lose a round."""
from __future__ import annotations

import sys
import threading

import pytest

from tokenrails import GuideSpec
from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

SESSIONS = 2000


@pytest.fixture
def manager(vocab):
    mgr = LMDeployGuidedManager(None, None, vocab=vocab, backend="fsm")
    yield mgr
    mgr.core().close()


@pytest.fixture
def busy_switching():
    """Switch threads as often as the interpreter allows: the races below need a switch inside a
    dict walk, which a loaded machine makes as likely as this."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_ending_sessions_while_rounds_are_noted(manager, busy_switching):
    for s in range(SESSIONS):  # a busy engine: many live rounds
        manager.note_round(f"live-{s}", (0, 1))
    errors: list[BaseException] = []
    stop = threading.Event()

    def noting(worker: int):
        try:
            for s in range(SESSIONS):
                if stop.is_set():
                    return
                manager.note_round(f"new-{worker}-{s}", (0, 1))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    def ending():
        try:
            for s in range(SESSIONS):
                if stop.is_set():
                    return
                manager.end_session(f"live-{s}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=noting, args=(w,)) for w in range(3)] + [threading.Thread(target=ending)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    rounds = manager._rounds
    assert not any(k[0].startswith("live-") for k in rounds)  # every ended session is gone
    assert sum(k[0].startswith("new-") for k in rounds) == 3 * SESSIONS  # no new round lost
    assert manager.stats()["tracked_rounds"] == 3 * SESSIONS


def test_ending_sessions_while_reasoning_rows_are_prepared(think_vocab, busy_switching):
    """Reasoning rows are started (``_begun``) from worker threads while the loop ends sessions."""
    from tokenrails.engine_patch.lmdeploy.step.strategies import LMDeployRow
    from tokenrails.engine_patch.reasoning_settings import parse_setting

    manager = LMDeployGuidedManager(None, None, vocab=think_vocab, backend="fsm")
    spec = GuideSpec.regex("[0-9]{2}")
    manager.core().get_compiled(spec)
    setting = parse_setting("<think>,</think>")
    for s in range(SESSIONS):
        manager.prepare_row(LMDeployRow(f"live-{s}", (0, 1), spec, setting=setting))
    errors: list[BaseException] = []

    def preparing(worker: int):
        try:
            for s in range(SESSIONS // 4):
                manager.prepare_row(LMDeployRow(f"new-{worker}-{s}", (0, 1), spec, setting=setting))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def ending():
        try:
            for s in range(SESSIONS):
                manager.end_session(f"live-{s}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=preparing, args=(w,)) for w in range(2)] + [threading.Thread(target=ending)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    manager.core().close()
    assert errors == []
    begun = manager._begun
    assert not any(k[0].startswith("live-") for k in begun)
    assert sum(k[0].startswith("new-") for k in begun) == 2 * (SESSIONS // 4)

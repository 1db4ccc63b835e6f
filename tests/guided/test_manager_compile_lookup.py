"""The manager's compile lookup: a guide is compiled once however the cache and the compile race,
a closed manager fails requests with a typed error, and its counters are exact under threads."""
from __future__ import annotations

import threading
import time

import pytest

from tokenrails import GuidedDecodingManager, GuideLimitError, GuideLimits, GuideSpec
from tokenrails.guided.errors import GuideError

from .test_compile_pool import RELEASE, blocking_backend  # noqa: F401 - the fixture


def _digits() -> GuideSpec:
    return GuideSpec.regex("[0-9]{3}")


def test_a_guide_larger_than_the_whole_cache_is_compiled_once(vocab):
    mgr = GuidedDecodingManager(vocab, backend="fsm", limits=GuideLimits(cache_max_bytes=1))
    spec = _digits()
    assert mgr.get_compiled(spec).memory_bytes > 1  # larger than the cache's whole budget
    for seq in range(6):  # six sequences of the same spec, one after another
        matcher = mgr.matcher_for("s", seq, spec)
        assert matcher.accept_token(vocab.token_bytes.index(b"7"))
    assert mgr.stats()["compiles"] == 1
    mgr.close()


def test_a_compile_finishing_between_two_looks_is_not_started_again(vocab, monkeypatch):
    """The compile publishes (and its oversize guide leaves the cache) before the caller looks for
    it in flight: the caller must take the compiled guide, not start over in a loop."""
    mgr = GuidedDecodingManager(vocab, backend="fsm", limits=GuideLimits(cache_max_bytes=1))
    starts = []
    original = mgr.prefetch

    def prefetch_then_finish(spec):
        starts.append(spec.key)
        if len(starts) > 20:
            raise AssertionError("get_compiled keeps starting the same compile")
        original(spec)
        deadline = time.monotonic() + 10
        while spec.key in mgr._inflight and time.monotonic() < deadline:
            time.sleep(0.001)

    monkeypatch.setattr(mgr, "prefetch", prefetch_then_finish)
    guide = mgr.get_compiled(_digits())
    assert guide.matcher().accept_token(vocab.token_bytes.index(b"1"))
    assert mgr.stats()["compiles"] == 1
    mgr.close()


def test_a_closed_manager_refuses_with_a_typed_error(vocab):
    mgr = GuidedDecodingManager(vocab, backend="fsm")
    mgr.close()
    spec = _digits()
    mgr.prefetch(spec)  # the engine prefetches every request it sees: no crash
    with pytest.raises(GuideLimitError, match="closed") as info:
        mgr.get_compiled(spec)
    assert info.value.limit == "closed"
    with pytest.raises(GuideError, match="closed"):
        mgr.matcher_for("s", 0, spec)
    assert mgr.stats()["compiles_in_flight"] == 0


def test_a_compile_queued_when_the_manager_closes_fails_typed(vocab, blocking_backend):  # noqa: F811
    mgr = GuidedDecodingManager(vocab, backend=blocking_backend, compile_workers=1,
                                limits=GuideLimits(compile_timeout_s=20))
    mgr.prefetch(GuideSpec.regex("hostile-slot"))  # takes the only compile thread
    queued = GuideSpec.regex("[ab]{2}")
    mgr.prefetch(queued)
    mgr.close()  # cancels the queued compile
    with pytest.raises(GuideLimitError, match="closed"):
        mgr.get_compiled(queued)
    assert queued.key not in mgr._inflight
    RELEASE.set()


def test_a_spec_refused_for_abandoned_compiles_compiles_once_they_end(vocab, blocking_backend):  # noqa: F811
    limits = GuideLimits(compile_timeout_s=0.2, max_abandoned_compiles=1)
    mgr = GuidedDecodingManager(vocab, backend=blocking_backend, limits=limits)
    with pytest.raises(GuideError):
        mgr.get_compiled(GuideSpec.regex("hostile-x"))  # times out, abandoned
    benign = GuideSpec.regex("[cd]{2}")
    with pytest.raises(GuideLimitError, match="max_abandoned_compiles"):
        mgr.get_compiled(benign)
    RELEASE.set()
    deadline = time.monotonic() + 10
    while mgr._pool.abandoned and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mgr._pool.abandoned == 0
    # the refusal was about the pool, not the spec: it compiles now
    assert mgr.get_compiled(benign).matcher().accept_token(vocab.token_bytes.index(b"c"))
    assert mgr.stats()["compiles_in_flight"] == 0
    mgr.close()


class _SwitchingDict(dict):
    """A dict whose reads give the other threads a turn: the switch a free-threaded interpreter (or
    a finalizer run by an allocation) can make between an increment's read and its write."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        time.sleep(0)
        return value


def test_cache_hit_counts_are_exact_under_threads(vocab):
    mgr = GuidedDecodingManager(vocab, backend="fsm")
    spec = _digits()
    mgr.get_compiled(spec)
    mgr.counters = _SwitchingDict(mgr.counters)
    threads, per_thread = 8, 200
    barrier = threading.Barrier(threads)

    def hit():
        barrier.wait()
        for _ in range(per_thread):
            mgr.get_compiled(spec)

    workers = [threading.Thread(target=hit) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert mgr.counters["cache_hits"] == threads * per_thread
    mgr.close()

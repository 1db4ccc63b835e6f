"""Background warm-up of small DFAs: every reachable row lands in the cache, bit-identical to the
lazily computed one; large DFAs and the numpy walker stay lazy; the switch turns it off."""
from __future__ import annotations

import gc

import pytest
import torch

from tokenrails import GuideSpec, compile_guide
from tokenrails.guided.fsm import token_index
from tokenrails.guided.fsm.token_index import PRECOMPUTE_ENV, TokenIndex

def _native_available() -> bool:
    from tokenrails import native

    return native.load("fsm") is not None


pytestmark = pytest.mark.skipif(not _native_available(), reason="warm-up needs the native walker")


@pytest.fixture(autouse=True)
def _warmup_on(monkeypatch):
    monkeypatch.setenv(PRECOMPUTE_ENV, "1")  # opt-in
    monkeypatch.setattr(token_index, "EAGER_MAX_STATES", 0)  # compile caches only the start row

PATTERNS = [r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", r"(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}",
            r"[a-z]+@[a-z]+\.(com|org)"]


def test_warmup_is_off_by_default(vocab, monkeypatch):
    monkeypatch.delenv(PRECOMPUTE_ENV)
    guide = compile_guide(GuideSpec.regex(PATTERNS[0]), vocab, backend="fsm")
    assert guide.index.warmup is None and guide.index.cached_states == 1


@pytest.mark.parametrize("pattern", PATTERNS)
def test_warm_rows_equal_lazy_rows(vocab, pattern, monkeypatch):
    warm = compile_guide(GuideSpec.regex(pattern), vocab, backend="fsm")
    assert warm.index.warmup is not None
    warm.index.warmup.result(timeout=30)
    reachable = warm.index.reachable_states()
    assert all(warm.index.is_cached(s) for s in reachable) and len(reachable) > 5

    monkeypatch.setenv(PRECOMPUTE_ENV, "0")
    lazy = compile_guide(GuideSpec.regex(pattern), vocab, backend="fsm")
    assert lazy.index.warmup is None and lazy.index.cached_states == 1
    for state in reachable:
        assert torch.equal(warm.index.row(state), lazy.index.row(state)), state


def test_large_dfas_stay_lazy(vocab, monkeypatch):
    monkeypatch.setattr(token_index, "PRECOMPUTE_MAX_BYTES", 4 * vocab.vocab_size // 32 * 3)
    guide = compile_guide(GuideSpec.regex(PATTERNS[0]), vocab, backend="fsm")
    assert guide.index.warmup is None and guide.index.cached_states == 1


def test_numpy_walker_is_never_warmed(vocab):
    dfa = compile_guide(GuideSpec.regex(PATTERNS[0]), vocab, backend="fsm").dfa
    index = TokenIndex(dfa, vocab, use_native=False)
    assert not index.warm_in_background() and index.warmup is None


def test_warmup_does_not_keep_an_evicted_guide_alive(vocab, monkeypatch):
    """The queued job holds only a weak reference: a guide dropped before its warm-up runs is freed."""
    import threading

    gate = threading.Event()
    blocker = token_index._warmup_pool().submit(gate.wait, 30)  # keep the single worker busy
    try:
        guide = compile_guide(GuideSpec.regex(PATTERNS[2]), vocab, backend="fsm")
        future = guide.index.warmup
        ref = __import__("weakref").ref(guide.index)
        del guide
        gc.collect()
        assert ref() is None
    finally:
        gate.set()
    blocker.result(timeout=30)
    future.result(timeout=30)  # the job finds the index gone and returns


def test_memory_counts_the_rows_a_warmup_will_add(vocab):
    """A cache sizes a guide when it is inserted: before the warm-up has run, the estimate already
    covers every row; reading it while the warm-up thread stores rows is safe."""
    guide = compile_guide(GuideSpec.regex(PATTERNS[0]), vocab, backend="fsm")
    planned = (guide.dfa.num_states - 1) * guide.index.words * 4
    while not guide.index.warmup.done():
        assert guide.index.memory_bytes >= planned
    assert guide.index.memory_bytes >= planned

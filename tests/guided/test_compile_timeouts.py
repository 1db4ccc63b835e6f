"""A compile past its deadline is no verdict on the spec: the request that waited gets the timeout,
the same spec sent again (a new request, so a new ``GuideSpec`` object) is compiled again, or joins
the compile still running on its abandoned thread, and is served once capacity allows.

Slow compiles come from a test backend that blocks on an event for ``hostile`` regexes and hands
every spec to the real fsm backend; outcomes are checked on the guide itself (byte vocabulary:
a string is accepted byte by byte, ``re.fullmatch`` is the oracle).
"""
from __future__ import annotations

import re
import threading
import time

import pytest
import torch

import tokenrails as tr
from tokenrails.guided import compile_procs
from tokenrails.guided import manager as manager_mod
from tokenrails.guided.backend import GuideBackend
from tokenrails.guided.errors import GuideTimeoutError
from tokenrails.guided.manager import GuidedDecodingManager
from tokenrails.guided.registry import get_backend, register_backend, unregister_backend
from tokenrails.guided.sequence import GuidedRow
from tokenrails.guided.vocabulary import Vocabulary

RELEASE = threading.Event()
CALLS: list[str] = []


class BlockingBackend(GuideBackend):
    name = "blocking-timeouts-test"
    kinds = frozenset({"regex"})

    def compile(self, spec):
        CALLS.append(spec.pattern)
        if spec.pattern.startswith("hostile"):
            RELEASE.wait(60)
        return get_backend("fsm", self.vocab, self.limits).compile(spec)


@pytest.fixture(scope="module")
def byte_vocab() -> Vocabulary:
    return Vocabulary([bytes([b]) for b in range(256)] + [b"</s>"], eos_ids=(256,), name="bytes")


@pytest.fixture
def blocking():
    RELEASE.clear()
    CALLS.clear()
    register_backend(BlockingBackend.name, BlockingBackend)
    yield BlockingBackend.name
    RELEASE.set()
    unregister_backend(BlockingBackend.name)


def _accepts(guide, text: str) -> bool:
    m = guide.matcher()
    return all(m.accept_token(b) for b in text.encode()) and m.is_accepting()


def _spec(pattern: str) -> tr.GuideSpec:
    """A request's own spec object (equal to any other request's for the same pattern)."""
    return tr.GuideSpec.regex(pattern)


def test_a_spec_that_timed_out_waiting_for_capacity_compiles_on_retry(byte_vocab, blocking):
    mgr = GuidedDecodingManager(byte_vocab, backend=blocking, compile_workers=1,
                                limits=tr.GuideLimits(compile_timeout_s=0.5))
    try:
        mgr.prefetch(_spec("hostile-1"))  # holds the only compile slot
        with pytest.raises(GuideTimeoutError):
            mgr.get_compiled(_spec("[0-9]{3}"))  # queued behind it past its deadline
        RELEASE.set()  # capacity comes back
        start = time.perf_counter()
        guide = mgr.get_compiled(_spec("[0-9]{3}"))  # the client's retry
        assert time.perf_counter() - start < 5
        for text in ("123", "12a", "1234"):
            assert _accepts(guide, text) == bool(re.fullmatch("[0-9]{3}", text))
    finally:
        mgr.close()


def test_a_retry_joins_the_compile_still_running_and_is_served_when_it_ends(byte_vocab, blocking):
    mgr = GuidedDecodingManager(byte_vocab, backend=blocking, limits=tr.GuideLimits(compile_timeout_s=0.3))
    try:
        with pytest.raises(GuideTimeoutError):
            mgr.get_compiled(_spec("hostile[ab]+"))
        result: dict = {}

        def retry() -> None:
            try:
                result["guide"] = mgr.get_compiled(_spec("hostile[ab]+"), timeout=20)
            except tr.GuideError as exc:
                result["error"] = exc

        thread = threading.Thread(target=retry)
        thread.start()
        time.sleep(0.1)
        RELEASE.set()
        thread.join(30)
        assert "error" not in result, result.get("error")
        assert _accepts(result["guide"], "hostileab") and not _accepts(result["guide"], "hostilec")
        assert CALLS.count("hostile[ab]+") == 1  # joined the running compile: no second one started
    finally:
        mgr.close()


def test_a_held_row_fails_closed_but_a_new_request_compiles_again(byte_vocab, blocking):
    mgr = GuidedDecodingManager(byte_vocab, backend=blocking, limits=tr.GuideLimits(compile_timeout_s=0.2))
    try:
        row_spec = _spec("hostile-row")
        assert mgr.poll(row_spec) is False
        time.sleep(0.3)
        assert mgr.poll(row_spec) is True  # joins its batch now, to fail closed without waiting
        (status,) = mgr.fill_and_apply(torch.zeros(1, byte_vocab.vocab_size), [GuidedRow("s", 0, row_spec)])
        assert isinstance(status.error, GuideTimeoutError)
        retry = _spec("hostile-row")  # another request for the same spec
        assert mgr.poll(retry) is False  # held while it compiles (it joins the running compile)
        RELEASE.set()
        deadline = time.monotonic() + 10
        while not mgr.poll(retry) and time.monotonic() < deadline:
            time.sleep(0.02)
        (status,) = mgr.fill_and_apply(torch.zeros(1, byte_vocab.vocab_size), [GuidedRow("s", 1, retry)])
        assert status.error is None
    finally:
        mgr.close()


def test_a_compile_stopped_with_its_worker_is_compiled_again_on_retry(byte_vocab, monkeypatch):
    monkeypatch.setattr(compile_procs, "PROCESS_MIN_COST", 0)
    monkeypatch.setattr(manager_mod, "PROCESS_MIN_COST", 0)
    # no worker can answer in 1 ms: the compile is stopped (its process killed) at the deadline
    mgr = GuidedDecodingManager(byte_vocab, backend="fsm", compile_processes=1,
                                limits=tr.GuideLimits(compile_timeout_s=0.001))
    try:
        for attempt in (1, 2):  # the retry is tried again in a worker, not refused from memory
            with pytest.raises(GuideTimeoutError):
                mgr.get_compiled(_spec("[xy]{4}"))
            deadline = time.monotonic() + 10
            while mgr._procs.counters["killed"] < attempt and time.monotonic() < deadline:
                time.sleep(0.01)
            assert mgr._procs.counters["killed"] == attempt
    finally:
        mgr.close()

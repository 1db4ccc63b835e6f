"""A row waits, the batch does not: on LMDeploy's real engine (CPU), a request whose grammar
compiles slowly stays out of the batch while another guided request keeps decoding, then joins
and finishes valid; and the parts of a step that run on the event loop never wait for a compile.

The slow compile is the real compile of a fresh pattern, delayed by ``DELAY`` seconds in the
core manager's compile function (the registry's ``compile_guide``), for that pattern only.
"""
from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")

from . import harness, tp_child  # noqa: E402

DELAY = 4.0
FAST = r"[0-9]{40}"           # the request that must keep decoding
SLOW = tp_child.SLOW          # the request whose compile is slow


@pytest.mark.slow
def test_a_slow_compile_holds_its_row_not_the_batch(pipe, monkeypatch):
    tp_child.slow_compiles(DELAY, monkeypatch.setattr)
    waits = tp_child.row_waits(pipe, FAST, 48, DELAY)  # the TP=3 test's stream, on one engine
    print(f"compile {DELAY} s: {waits['during']} tokens of the other request meanwhile, max gap {waits['max_gap']} s")
    assert re.fullmatch(FAST, waits["fast"][0]) and waits["fast"][1] == "stop", waits
    assert re.fullmatch(SLOW, waits["slow"][0]) and waits["slow"][1] == "stop", waits  # joined after its compile
    assert waits["slow_wait"] >= DELAY * 0.9, waits  # it did wait for its compile
    assert waits["during"] >= 5, f"the other request got {waits['during']} tokens while the compile ran"
    assert waits["max_gap"] is not None and waits["max_gap"] < DELAY / 2, \
        f"the other request stalled {waits['max_gap']} s (compile {DELAY} s)"


def test_session_end_does_not_wait_for_a_step_stuck_in_a_compile(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab,
                                                                  monkeypatch):
    """A worker's fill holds the step lock while a row's compile runs; the event loop ending
    another session (the logits processor's clean-up, every step) returns at once."""
    from tokenrails.guided.sequence import GuidedRow
    from tokenrails.guided.spec import GuideSpec

    compiled = tp_child.slow_compiles(2.0, monkeypatch.setattr)
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    core = mgr.core()
    ok = GuideSpec.regex("[0-9]+")
    core.fill_rows([GuidedRow("other", (0, 0), ok)])
    assert core.stats()["active_matchers"] == 1
    filling = threading.Thread(target=core.fill_rows, args=([GuidedRow("slow", (0, 0), GuideSpec.regex(SLOW))],))
    filling.start()
    time.sleep(0.3)  # the fill holds the step lock, waiting for the compile
    t0 = time.monotonic()
    mgr.end_session("other")
    took = time.monotonic() - t0
    waited = compiled.is_set()  # an event, not a bound in ms: the fill's compile had returned
    filling.join()
    assert not waited, f"end_session waited {took:.2f} s, until the step's compile had finished"
    assert core.stats()["active_matchers"] == 1  # "other" ended at the next step, "slow" lives


def test_overlap_start_never_waits_for_a_compile(upgraded, cpu_lmdeploy, think_tokenizer, think_vocab, monkeypatch):
    """``overlap.start`` runs on the event loop before the forward: a reasoning row whose prompt
    already closed the thinking section (``enable_thinking=False``) is prepared there (its state
    begun from the prompt; a token budget reads the compiled guide), and that must not wait for
    its compile (the logits processor's worker thread does)."""
    from tokenrails.engine_patch.lmdeploy.step import overlap
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    compiled = tp_child.slow_compiles(2.0, monkeypatch.setattr)
    monkeypatch.setattr(overlap, "CPU_MIN_ROWS", 1)
    monkeypatch.setenv("TOKENRAILS_OVERLAP", "1")
    monkeypatch.delenv("TOKENRAILS_REASONING", raising=False)
    tok = think_tokenizer
    mgr = LMDeployGuidedManager(tok, think_vocab.vocab_size, vocab=think_vocab)
    closed = tok.encode("q:", add_special_tokens=False) + tok.convert_tokens_to_ids(["<think>", "</think>"])
    rf = {"type": "regex_schema", "regex_schema": SLOW, "tokenrails_budget": "close"}  # the budget reads the guide
    seq = harness.FakeSeq(31, harness.gen_config(rf, max_new_tokens=16), prompt_ids=closed)
    si = harness.strategy().make_sampling_inputs([seq])
    agent = type("Agent", (), {"guided_decoding_manager": mgr, "spec_agent": None, "device": "cpu"})()
    inputs = type("Inputs", (), {"is_dummy": False, "is_chunk": False})()
    from tokenrails.engine_patch.lmdeploy.step.lmdeploy_step import patched_async_step as wrap_step
    entered: list[tuple[float, bool]] = []

    async def model_forward(self, inputs):
        entered.append((time.monotonic(), compiled.is_set()))

    # fee4267 started the overlapped fill in a forward wrapper; the step now starts it as it opens
    forward = getattr(overlap, "patched_model_forward", lambda f: f)(model_forward)

    async def async_step(self, inputs, sampling_inputs=None):
        await forward(self, inputs)

    async def run() -> float:
        t0 = time.monotonic()
        await wrap_step(async_step)(agent, inputs, sampling_inputs=si)
        return entered[0][0] - t0

    took = asyncio.run(run())
    # an event, not a bound in ms (a loaded machine crossed those): the forward began before the
    # slow compile had returned
    assert not entered[0][1], f"the event loop waited {took:.2f} s, for the compile, before the forward"

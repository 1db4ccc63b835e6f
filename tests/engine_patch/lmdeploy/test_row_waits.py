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

from . import harness  # noqa: E402

DELAY = 4.0
FAST = r"[0-9]{40}"           # the request that must keep decoding
SLOW = r"[a-c]{3}-[0-9]{2}"   # the request whose compile is slow


def _slow_compiles(monkeypatch, pattern: str, delay: float) -> None:
    from tokenrails.guided import manager as core

    real = core.compile_guide

    def compile_guide(spec, *args, **kwargs):
        if spec.payload == pattern:
            time.sleep(delay)
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(core, "compile_guide", compile_guide)


def _stream(pipe, prompt: str, fmt: dict, max_new_tokens: int, stamps: list, out: dict, key: str) -> None:
    from lmdeploy import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max_new_tokens, top_k=1, response_format=fmt)
    text, finish = "", None
    for resp in pipe.stream_infer([prompt], gen_config=[gen]):  # each response carries the new text
        stamps.append(time.monotonic())
        text += resp.text
        finish = resp.finish_reason or finish
    out[key] = (text, finish)


@pytest.mark.slow
def test_a_slow_compile_holds_its_row_not_the_batch(pipe, monkeypatch):
    _slow_compiles(monkeypatch, SLOW, DELAY)
    fast_fmt = {"type": "regex_schema", "regex_schema": FAST}
    slow_fmt = {"type": "regex_schema", "regex_schema": SLOW}
    pipe(["Hi"], gen_config=__import__("lmdeploy").GenerationConfig(max_new_tokens=2, top_k=1,
                                                                   response_format=fast_fmt))  # compiled
    fast_stamps: list[float] = []
    slow_stamps: list[float] = []
    out: dict = {}
    fast = threading.Thread(target=_stream, args=(pipe, "Count digits.", fast_fmt, 48, fast_stamps, out, "fast"))
    fast.start()
    deadline = time.monotonic() + 60
    while len(fast_stamps) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    t_slow = time.monotonic()
    slow = threading.Thread(target=_stream, args=(pipe, "A code.", slow_fmt, 12, slow_stamps, out, "slow"))
    slow.start()
    fast.join(120)
    slow.join(120)
    assert re.fullmatch(FAST, out["fast"][0]) and out["fast"][1] == "stop", out["fast"]
    assert re.fullmatch(SLOW, out["slow"][0]) and out["slow"][1] == "stop", out["slow"]  # joined after its compile
    assert slow_stamps[0] - t_slow >= DELAY * 0.9  # it did wait for its compile
    during = [t for t in fast_stamps if t_slow <= t <= t_slow + DELAY]
    gaps = [b - a for a, b in zip([t_slow] + during, during)]
    print(f"compile {DELAY} s: {len(during)} tokens of the other request meanwhile, max gap {max(gaps):.3f} s")
    assert len(during) >= 5, f"the other request got {len(during)} tokens while the compile ran"
    assert max(gaps) < DELAY / 2, f"the other request stalled {max(gaps):.2f} s (compile {DELAY} s)"


def test_session_end_does_not_wait_for_a_step_stuck_in_a_compile(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab,
                                                                  monkeypatch):
    """A worker's fill holds the step lock while a row's compile runs; the event loop ending
    another session (the logits processor's clean-up, every step) returns at once."""
    from tokenrails.guided.sequence import GuidedRow
    from tokenrails.guided.spec import GuideSpec

    _slow_compiles(monkeypatch, SLOW, 2.0)
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
    filling.join()
    assert took < 0.2, f"end_session waited {took:.2f} s for the step"
    assert core.stats()["active_matchers"] == 1  # "other" ended at the next step, "slow" lives


def test_overlap_start_never_waits_for_a_compile(upgraded, cpu_lmdeploy, think_tokenizer, think_vocab, monkeypatch):
    """``overlap.start`` runs on the event loop before the forward: a reasoning row whose prompt
    already closed the thinking section (``enable_thinking=False``) is prepared there (its state
    begun from the prompt; a token budget reads the compiled guide), and that must not wait for
    its compile (the logits processor's worker thread does)."""
    from tokenrails.engine_patch.lmdeploy.step import overlap
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import LMDeployGuidedManager

    _slow_compiles(monkeypatch, SLOW, 2.0)
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
    entered: list[float] = []

    async def model_forward(self, inputs):
        entered.append(time.monotonic())

    # fee4267 started the overlapped fill in a forward wrapper; the step now starts it as it opens
    forward = getattr(overlap, "patched_model_forward", lambda f: f)(model_forward)

    async def async_step(self, inputs, sampling_inputs=None):
        await forward(self, inputs)

    async def run() -> float:
        t0 = time.monotonic()
        await wrap_step(async_step)(agent, inputs, sampling_inputs=si)
        return entered[0] - t0

    took = asyncio.run(run())
    assert took < 0.5, f"the event loop waited {took:.2f} s for a compile before the forward"

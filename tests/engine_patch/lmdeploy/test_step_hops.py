"""Issue 25 point 4: the upgraded CPU step makes no thread hop for small compiled batches.

Stock LMDeploy hands every guided step's fill and accept to a worker thread (``asyncio.to_thread``).
On CPU logits with at most ``INLINE_MAX_ROWS`` guided rows whose constraints are compiled, the
upgrade fills, applies and accepts on the step's own thread (a hop costs more than the work, and on
a CPU forward it also hands the GIL around); a row still compiling keeps the hop (the event loop
never waits for a compile: ``test_defects.py::test_compile_does_not_block_event_loop``). The
tokens are the same either way (checked bit-for-bit under adversarial logits). Counts, no timing.
"""
from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from . import harness, tp_child

EOS = 2  # SmolLM2 <|im_end|>
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 4}},
          "required": ["n", "s"], "additionalProperties": False}
FORMATS = [{"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
           {"type": "regex_schema", "regex_schema": "[a-c]{2,4}!"},
           {"type": "choice", "choice": ["red", "green", "blue"]}]


def _seqs(session0: int, batch: int) -> list[harness.FakeSeq]:
    return [harness.FakeSeq(session0 + i, harness.gen_config(FORMATS[i % len(FORMATS)])) for i in range(batch)]


def _logits(tok, vocab):
    breakers = [EOS, 0, 107, 109, 18, 81, 82, 83, 369, 25276]
    fav = harness.adversarial_logits(vocab.vocab_size, breakers, seed=7)
    blank = [i for i, b in enumerate(vocab.token_bytes) if b and not b.strip()]

    def logits(batch: int) -> torch.Tensor:
        x = fav(batch)
        x[:, blank] -= 100.0
        return x

    return logits


def _count_hops(monkeypatch) -> list[int]:
    """Counts ``asyncio.to_thread`` calls made by the logits processor patch (fill and accept)."""
    from tokenrails.engine_patch.lmdeploy.step import lmdeploy_step as lg

    calls = [0]
    real = asyncio.to_thread

    async def counted(fn, *args, **kwargs):
        calls[0] += 1
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(lg.asyncio, "to_thread", counted)
    return calls


def _decode(mgr, seqs, logits_fn, steps: int) -> list[list[int]]:
    strat = harness.strategy()

    async def run() -> None:
        live = list(seqs)
        for _ in range(steps):
            if not live:
                return
            toks, _ = await harness.step(strat, mgr, live, logits_fn(len(live)))
            for s, t in zip(live, toks):
                s.generated.append(int(t))
            live = [s for s in live if s.generated[-1] != EOS]

    asyncio.run(run())
    return [s.generated for s in seqs]


@pytest.mark.parametrize("batch", [1, 8])
def test_compiled_small_cpu_batches_make_no_thread_hop(batch, upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab,
                                                       monkeypatch):
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    mgr.core()
    logits = _logits(smollm2_tokenizer, vocab)
    _decode(mgr, _seqs(100 + 20 * batch, batch), logits, steps=2)  # compiles (hops allowed)
    hops = _count_hops(monkeypatch)
    seqs = _seqs(300 + 20 * batch, batch)
    outs = _decode(mgr, seqs, logits, steps=24)
    assert hops[0] == 0, f"{hops[0]} thread hops over {max(len(o) for o in outs)} steps"
    for fmt, out in zip([FORMATS[i % 3] for i in range(batch)], outs):
        text = smollm2_tokenizer.decode([t for t in out if t != EOS])
        if out[-1] != EOS:
            continue  # capped: validity of prefixes is the other tests' job
        if fmt["type"] == "json_schema":
            jsonschema.validate(json.loads(text), SCHEMA)
        elif fmt["type"] == "regex_schema":
            assert re.fullmatch("[a-c]{2,4}!", text)
        else:
            assert text in fmt["choice"]


def test_inline_and_threaded_steps_give_the_same_tokens(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab,
                                                        monkeypatch):
    from tokenrails.engine_patch.lmdeploy.step import lmdeploy_step as lg

    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    mgr.core()
    _decode(mgr, _seqs(500, 3), _logits(smollm2_tokenizer, vocab), steps=2)
    inline = _decode(mgr, _seqs(520, 3), _logits(smollm2_tokenizer, vocab), steps=40)  # same seed: same logits
    monkeypatch.setattr(lg, "_is_short", lambda step, scores: False)
    hops = _count_hops(monkeypatch)
    threaded = _decode(mgr, _seqs(540, 3), _logits(smollm2_tokenizer, vocab), steps=40)
    assert hops[0] > 0  # the threaded path did run
    assert inline == threaded


def test_a_row_still_compiling_keeps_the_hop(upgraded, cpu_lmdeploy, smollm2_tokenizer, vocab, monkeypatch):
    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    mgr.core()
    hops = _count_hops(monkeypatch)
    compiled = tp_child.slow_compiles(0.5, monkeypatch.setattr)  # still compiling at the first step, surely
    seq = harness.FakeSeq(700, harness.gen_config({"type": "regex_schema", "regex_schema": tp_child.SLOW}))
    _decode(mgr, [seq], _logits(smollm2_tokenizer, vocab), steps=1)
    assert compiled.is_set()  # the step waited for the compile...
    assert hops[0] >= 1  # ...off the event loop
    assert re.match(r"[a-c]", smollm2_tokenizer.decode(seq.generated))


def test_a_cpu_agent_overlaps_only_from_cpu_min_rows(upgraded, monkeypatch):
    """The overlapped fill thread is not started for a CPU agent's step below ``CPU_MIN_ROWS``
    guided rows (it slowed the CPU forward more than it hid); a GPU agent overlaps any step."""
    from tokenrails.engine_patch.lmdeploy.step import overlap, lmdeploy_step as step
    from tokenrails.engine_patch.lmdeploy.step.rank_manager import RankView
    from tokenrails.guided.sequence import GuidedRow
    from tokenrails.guided.spec import GuideSpec

    spec = GuideSpec.regex("[a-z]+")
    started = []

    class Mgr:
        def fill_rows(self, rows):
            started.append(len(rows))

        def compiled(self, rows):
            return True

    class Owner:
        is_tokenrails = True
        view = RankView(rounds={(i, i): (i, 0) for i in range(overlap.CPU_MIN_ROWS)},  # seen before: nothing to note
                        begun={}, failed={}, core=Mgr())

        def core(self, wait=True):
            return Mgr()

        def prepare_rows(self, rows):
            return rows

    def run(device: str, n: int) -> bool:
        rows = [GuidedRow(i, (i, 0), spec) for i in range(n)]
        si = SimpleNamespace(session_ctx=[{step.CTX_KEY: r} for r in rows], response_formats=None,
                             batch_size=n)
        owner = Owner()
        opened = step.LMDeployStep(owner, si)
        agent = SimpleNamespace(guided_decoding_manager=owner, spec_agent=None, device=device)
        overlap.start(agent, opened, SimpleNamespace(is_dummy=False, is_chunk=False))
        pending = opened.prefill
        if pending is not None:
            pending[1].result()
        return pending is not None

    monkeypatch.setenv("TOKENRAILS_OVERLAP", "1")
    assert not run("cpu", 1)
    assert not run("cpu", overlap.CPU_MIN_ROWS - 1)
    assert run("cpu", overlap.CPU_MIN_ROWS)
    assert run("cuda", 1)

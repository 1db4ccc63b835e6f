"""Speculative decoding through LMDeploy's real ``GuidedSpecHelper`` call sequence.

One step = what ``SpecModelAgent`` does: ``get_processors`` → fork per draft loop →
``prepare_bitmask``/``apply_bitmask``/``accept_draft_tokens`` per draft position →
``apply_serial_bitmask`` on the target logits → greedy verification →
``accept_rejection_sampled_tokens``. Stock and upgraded runs must emit the same valid text;
the upgrade must never fork a matcher.
"""
from __future__ import annotations

import asyncio
import re

import torch

from . import harness

EOS = 2
NUM_SPEC = 3


def _spec_run(mgr, seqs, steps, seed):
    from lmdeploy.pytorch.spec_decode.guided_spec_helper import GuidedSpecHelper

    helper = GuidedSpecHelper(mgr)
    strat = harness.strategy()
    gen = torch.Generator().manual_seed(seed)
    V = mgr.vocab_size if not hasattr(mgr, "core") else mgr.core().vocab.vocab_size

    async def one_step(live):
        si = strat.make_sampling_inputs(live)
        procs = helper.get_processors(si.session_ctx, si.response_formats)
        forks = {i: p.fork() for i, p in procs.items() if not helper.manager.is_terminated(p)}
        drafts = []
        for _ in range(NUM_SPEC):
            logits = torch.randn(len(live), V, generator=gen)
            bm = await helper.prepare_bitmask(logits, forks)
            helper.apply_bitmask(logits, bm)
            d = logits.argmax(-1)
            drafts.append(d)
            await helper.accept_draft_tokens(d[:, None], forks)
        draft_ids = torch.stack(drafts, 1)  # [B, NUM_SPEC]
        target = torch.randn(len(live), NUM_SPEC + 1, V, generator=gen)
        target[:, :, draft_ids[0, 0]] += 0.5  # make some drafts verify
        await helper.apply_serial_bitmask(target, procs, draft_ids, NUM_SPEC)
        picks = target.argmax(-1)  # [B, NUM_SPEC + 1]
        out = torch.full((len(live), NUM_SPEC + 1), -1)
        nxt = torch.zeros(len(live), dtype=torch.long)
        rejected = torch.zeros(len(live), dtype=torch.long)
        for b in range(len(live)):
            n = 0
            while n < NUM_SPEC and picks[b, n] == draft_ids[b, n]:
                n += 1
            out[b, :n] = draft_ids[b, :n]
            nxt[b] = picks[b, n]
            rejected[b] = NUM_SPEC - n
            out[b, n] = nxt[b]
        await helper.accept_rejection_sampled_tokens(procs, rejected, out, nxt, NUM_SPEC)
        return [out[b, : NUM_SPEC - int(rejected[b]) + 1].tolist() for b in range(len(live))]

    async def run():
        live = list(seqs)
        for _ in range(steps):
            if not live:
                return
            emitted = await one_step(live)
            for s, toks in zip(live, emitted):
                for t in toks:
                    if s.generated and s.generated[-1] == EOS:
                        break
                    s.generated.append(int(t))
            live = [s for s in live if s.generated[-1] != EOS]

    asyncio.run(run())
    return [s.generated for s in seqs]


def _seqs():
    return [
        harness.FakeSeq(51, harness.gen_config({"type": "regex_schema", "regex_schema": "(ab|cd){2,4}x"})),
        harness.FakeSeq(52, harness.gen_config(None)),
        harness.FakeSeq(53, harness.gen_config({"type": "json_object"})),
    ]


def test_spec_decode_stock_vs_upgraded(cpu_lmdeploy, smollm2_tokenizer, vocab, monkeypatch):
    import xgrammar as xgr

    import tokenrails.engine_patch.lmdeploy as patch

    forks = {"n": 0}
    orig_fork = xgr.GrammarMatcher.fork

    def counting_fork(self, *a, **k):
        forks["n"] += 1
        return orig_fork(self, *a, **k)

    monkeypatch.setattr(xgr.GrammarMatcher, "fork", counting_fork)
    results = {}
    counts = {}
    for mode in ("stock", "tokenrails"):
        if mode == "tokenrails":
            patch.activate(backend="xgrammar")
        try:
            forks["n"] = 0
            mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
            results[mode] = _spec_run(mgr, _seqs(), steps=8, seed=5)
            counts[mode] = forks["n"]
            if mode == "tokenrails":
                assert mgr.stats()["active_matchers"] == 2
        finally:
            patch.deactivate()
    assert counts["stock"] > 0 and counts["tokenrails"] == 0
    ours = results["tokenrails"]
    text0 = smollm2_tokenizer.decode([t for t in ours[0] if t != EOS])
    assert ours[0][-1] == EOS and re.fullmatch("(ab|cd){2,4}x", text0), text0
    assert results["stock"][0] == ours[0]  # same logits, same valid answer
    from tokenrails import GuideSpec, compile_guide

    oracle = compile_guide(GuideSpec.json_object(), vocab, "xgrammar").matcher()
    assert len(ours[2]) > NUM_SPEC and oracle.validate_tokens(ours[2]) == len(ours[2])

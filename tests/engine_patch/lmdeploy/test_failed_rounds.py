"""A round that failed stays failed for every part of the next engine steps (the rank manager's
``failed`` book): LMDeploy stops a failed row a step late, and neither the mask nor the speculative
helper nor the grammar proposer may fill or propose it then. Real strategy and logits processor."""
from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("lmdeploy")
torch = pytest.importorskip("torch")

from . import harness  # noqa: E402

FORMAT = {"type": "regex_schema", "regex_schema": "[a-c]{40}"}


def test_a_failed_round_is_failed_again_without_a_fill_until_its_session_ends(upgraded, cpu_lmdeploy,
                                                                              smollm2_tokenizer, vocab, monkeypatch):
    from tokenrails.engine_patch.lmdeploy.step.lmdeploy_step import CTX_KEY, LMDeployStep
    from tokenrails.guided.errors import InvalidGuideError
    from tokenrails.guided.manager import GuidedDecodingManager
    from tokenrails.guided.sequence import GuidedRow

    mgr = harness.make_manager(smollm2_tokenizer, vocab.vocab_size)
    mgr.core()
    strat = harness.strategy()
    seqs = [harness.FakeSeq(700 + i, harness.gen_config(FORMAT)) for i in range(2)]
    err = InvalidGuideError("the proposal failed for this row")
    LMDeployStep(mgr, strat.make_sampling_inputs(seqs)).fail({0: err})  # step N: row 0 fails

    filled, original = [], GuidedDecodingManager.fill_and_apply
    monkeypatch.setattr(GuidedDecodingManager, "fill_and_apply", lambda self, scores, rows, *a, **kw: (
        filled.append([r is not None for r in rows]), original(self, scores, rows, *a, **kw))[1])
    toks, proc = asyncio.run(harness.step(strat, mgr, seqs, torch.randn(2, vocab.vocab_size)))  # step N + 1
    step = proc.tokenrails_step
    assert step.rows[0] is err and proc.sampling_inputs.session_ctx[0][CTX_KEY] is err  # the helper and proposer read it
    assert isinstance(step.rows[1], GuidedRow) and 1 not in step.errors
    assert step.errors[0] is err and toks[0] in vocab.eos_ids  # failed again: EOS-only, its error reported
    assert filled == [[False, True]]  # its grammar was never filled again
    assert re.fullmatch("[a-c]+", smollm2_tokenizer.decode([toks[1]]))  # the other row is guided as before

    mgr.end_session(seqs[0].session_id)
    assert not mgr.view.failed
    step = LMDeployStep(mgr, strat.make_sampling_inputs(seqs))
    assert isinstance(step.rows[0], GuidedRow)

"""The transformers processor's matchers end with it: after ``finalize``, after a ``generate``
that raised (``with`` block), when the processor is dropped (the vocabulary memo: tests/guided/test_vocabulary_memo.py)."""
from __future__ import annotations

import gc

import pytest
import torch

from tokenrails import GuideSpec
from tokenrails.engine_patch.transformers import GuidedLogitsProcessor
from tokenrails.guided.manager import GuidedDecodingManager

SPECS = [GuideSpec.regex(r"[a-c]{2}-\d{3}"), GuideSpec.choice(["alpha", "beta"])]


def _steps(proc, vocab, n):
    """n calls as generate() makes them (the first sees only the prompt)."""
    ids = torch.zeros((len(SPECS), 1), dtype=torch.long)
    for _ in range(n):
        scores = proc(ids, torch.zeros((len(SPECS), vocab.vocab_size)))
        ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], dim=1)


@pytest.fixture
def manager(vocab):
    mgr = GuidedDecodingManager(vocab, backend="fsm", fill_threads=1)
    yield mgr
    mgr.close()


def test_a_dropped_processor_ends_its_session(vocab, manager):
    proc = GuidedLogitsProcessor(SPECS, vocab=vocab, manager=manager)
    _steps(proc, vocab, 3)
    assert manager.stats()["active_sessions"] == 1
    del proc  # generate raised, or the caller never called finalize()
    gc.collect()
    assert manager.stats()["active_sessions"] == 0
    assert manager.stats()["active_matchers"] == 0


def test_a_raising_generate_in_a_with_block_ends_the_session(vocab, manager):
    with pytest.raises(RuntimeError, match="boom"):
        with GuidedLogitsProcessor(SPECS, vocab=vocab, manager=manager) as proc:
            _steps(proc, vocab, 2)
            raise RuntimeError("boom")  # what a failing generate() does
    assert manager.stats()["active_sessions"] == 0
    assert proc.manager is manager  # still referenced: ended by the block, not by the collector


@pytest.mark.slow
def test_a_real_generate_that_raises_leaks_nothing(smollm2, manager):
    model, tokenizer = smollm2.model, smollm2.tokenizer

    class Boom:
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("boom")
            return scores

    vocab = manager.vocab
    prompts = tokenizer(["Answer:", "Answer:"], return_tensors="pt")
    proc = GuidedLogitsProcessor(SPECS, tokenizer, vocab=vocab, manager=manager)
    with pytest.raises(RuntimeError, match="boom"):
        model.generate(**prompts, logits_processor=[proc, Boom()], max_new_tokens=6, do_sample=False,
                       pad_token_id=tokenizer.eos_token_id)
    assert manager.stats()["active_sessions"] == 1  # the caller still holds the processor
    del proc
    gc.collect()
    assert manager.stats()["active_sessions"] == 0


"""outlines 0.x sampler callables against oracles (outlines' own suite is run by
bench/outlines_suites.py; these check properties over random logits)."""
from __future__ import annotations

import math

import pytest
import torch

from tokenrails.compat.outlines import samplers


def _logits(seed: int, rows: int = 4, vocab: int = 50) -> torch.Tensor:
    return torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("seed", range(5))
def test_greedy_is_argmax_and_weights_add_logprobs(seed):
    logits = _logits(seed)
    start = torch.randn(4, generator=torch.Generator().manual_seed(100 + seed))
    ids, ancestors, weights = samplers.greedy()(logits, start, None)
    assert ids.squeeze(1).tolist() == logits.argmax(dim=-1).tolist()
    assert ancestors.tolist() == [0, 1, 2, 3]
    expected = start + torch.log_softmax(logits, -1).max(dim=-1).values
    assert torch.allclose(weights, expected)


@pytest.mark.parametrize("seed", range(5))
def test_multinomial_never_samples_outside_top_k_and_top_p(seed):
    logits = _logits(seed)
    rng = torch.Generator().manual_seed(seed)
    for _ in range(20):
        ids, _, _ = samplers.multinomial(top_k=3)(logits, torch.zeros(4), rng)
        top3 = logits.topk(3, dim=-1).indices
        assert all(int(i) in top3[r].tolist() for r, i in enumerate(ids.squeeze(1)))
    probs = logits.softmax(-1)
    for _ in range(20):
        ids, _, _ = samplers.multinomial(top_p=0.5)(logits, torch.zeros(4), rng)
        for r, i in enumerate(ids.squeeze(1).tolist()):
            # the kept set: tokens whose less-likely tail mass exceeds 1 - p
            tail = probs[r][probs[r] < probs[r, i]].sum()
            assert tail + probs[r, i] > 0.5 - 1e-6


def test_processor_arguments_are_checked():
    with pytest.raises(ValueError, match="`k` must be a strictly"):
        samplers.keep_top_k_logits(0)
    with pytest.raises(ValueError, match="`p` must be a floating point"):
        samplers.keep_top_p_logits(1.5)
    with pytest.raises(ValueError, match="greedy sampler"):
        samplers.rescale_logits(0.0)
    assert samplers.keep_top_k_logits(1)(torch.tensor([[1.0, 3.0, 2.0]])).tolist() == [[-math.inf, 3.0, -math.inf]]


@pytest.mark.parametrize("seed", range(5))
def test_beam_search_keeps_the_best_continuations_of_each_group(seed):
    beams, vocab = 3, 20
    logits = _logits(seed, rows=2 * beams, vocab=vocab)
    start = torch.randn(2 * beams, generator=torch.Generator().manual_seed(seed))
    ids, ancestors, weights = samplers.beam_search(beams)(logits, start, None)
    total = start.unsqueeze(1) + torch.log_softmax(logits, -1)
    for g in range(2):
        rows = slice(g * beams, (g + 1) * beams)
        best = total[rows].reshape(-1).topk(beams).values
        assert torch.allclose(weights[rows], best)
        for k in range(g * beams, (g + 1) * beams):
            assert g * beams <= int(ancestors[k]) < (g + 1) * beams
            assert torch.isclose(total[int(ancestors[k]), int(ids[k])], weights[k])

"""Helpers for the fsm backend tests: compile through the public registry, decode, samplers."""
from __future__ import annotations

import pytest
import torch

from tokenrails import GuideSpec, allocate_token_bitmask, compile_guide
from tokenrails.guided.limits import GuideLimits


@pytest.fixture(scope="session")
def fsm_compile(vocab):
    """compile(spec_or_pattern, **limits) -> FSMGuide for the fixture vocabulary."""

    def compile_(spec, **limit_changes):
        if isinstance(spec, str):
            spec = GuideSpec.regex(spec)
        limits = GuideLimits().replace(**limit_changes) if limit_changes else None
        return compile_guide(spec, vocab, "fsm", limits=limits)

    return compile_


def allowed_ids(matcher, vocab) -> set[int]:
    """The set of token ids the matcher's next mask allows."""
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bm, 0)
    return mask_to_ids(bm[0], vocab.vocab_size)


def mask_to_ids(row: torch.Tensor, vocab_size: int) -> set[int]:
    words = row.to(torch.int64) & 0xFFFFFFFF
    bits = (words.unsqueeze(1) >> torch.arange(32)).bitwise_and(1).reshape(-1)[:vocab_size]
    return set(torch.nonzero(bits).reshape(-1).tolist())


def fill(matcher, vocab) -> torch.Tensor:
    bm = allocate_token_bitmask(1, vocab.vocab_size)
    matcher.fill_next_token_bitmask(bm, 0)
    return bm[0].clone()

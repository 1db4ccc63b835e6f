"""Next-token choice for the decode loop: greedy, or seeded sampling (temperature/top-k/top-p).

Masked logits are -inf, so they keep probability 0 through every transformation here. Sampling runs
in float32 whatever the model's dtype: CPU ``torch.multinomial`` on float16 probabilities returns
zero-probability (masked) indices in ~0.1% of draws.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def generator(self) -> torch.Generator | None:
        if not self.do_sample:
            return None
        g = torch.Generator()
        g.manual_seed(0 if self.seed is None else int(self.seed))
        return g


def choose_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of ``logits`` ([rows, vocab], already masked)."""
    if not params.do_sample or params.temperature <= 0:
        return logits.argmax(dim=-1)
    x = logits.float() / float(params.temperature)
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix reaching top_p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

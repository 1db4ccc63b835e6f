"""Exact, seeded multinomial sampling for the CPU path (LMDeploy's ``multinomial_sampling`` op).

LMDeploy's ``default`` backend samples with ``torch.multinomial(scores)`` on whatever dtype the
model runs in. ``dtype='auto'`` means float16 on CPU, and CPU float16 ``torch.multinomial`` returns
indices whose probability is exactly 0 in about 0.1% of draws (float32: never): tokens the grammar's
mask (or top-k/top-p) removed. It also ignores the per-row ``seeds``/``offsets`` the engine passes,
so ``random_seed`` would do nothing on this path.

This op does what the CUDA kernel does, exactly: one uniform number per row from ``(seed, offset)``
(offset = the sequence's token count, so a seeded request is reproducible step by step), and the
first index whose float64 running sum exceeds it. A zero-probability entry never raises the running
sum, so it can never be the first to exceed anything: masked tokens are unreachable by construction.
"""
from __future__ import annotations

from typing import Any

import torch
from lmdeploy.pytorch.backends.multinomial_sampling import MultinomialSamplingImpl

_SEED_MASK = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


def _splitmix64(x: int) -> int:
    """A 64-bit mixing function (SplitMix64's finaliser): neighbouring inputs, unrelated outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def row_uniforms(seeds: torch.Tensor | None, offsets: torch.Tensor | None, rows: int) -> torch.Tensor:
    """One uniform float64 in [0, 1) per row, a pure function of that row's ``(seed, offset)``
    (counter-based, like the CUDA kernel's ``tl.rand(seed, offset)``; a torch ``Generator`` would
    keep only 32 bits of a combined seed).

    Without seeds (LMDeploy passes none when every row is greedy) the global generator is used.
    """
    if seeds is None:
        return torch.rand(rows, dtype=torch.float64)
    seed_list = seeds.reshape(-1).tolist()
    offset_list = offsets.reshape(-1).tolist() if offsets is not None else [0] * rows
    values = [(_splitmix64(((int(s) & _SEED_MASK) << 32) | (int(o) & _SEED_MASK)) >> 11) * 2.0**-53
              for s, o in zip(seed_list, offset_list)]
    return torch.tensor(values, dtype=torch.float64)


def exact_multinomial(scores: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the position where the float64 running sum of ``scores`` first exceeds
    ``uniform * row total`` ([rows] long). Never a position whose score is 0 (or negative)."""
    probs = scores.to(torch.float64).clamp_min_(0.0)
    cum = probs.cumsum(dim=-1)
    target = (uniforms.to(torch.float64) * cum[:, -1]).unsqueeze(-1)
    pos = torch.searchsorted(cum, target, right=True).squeeze(-1)
    # rounding can leave target == total: take the last position that carries probability
    last_positive = probs.size(-1) - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.minimum(pos, last_positive)


class CpuMultinomialSamplingImpl(MultinomialSamplingImpl):
    """``multinomial_sampling`` for ``device_type='cpu'``: exact in any dtype, honours seeds."""

    def forward(self, scores: torch.Tensor, seeds: torch.LongTensor, offsets: torch.LongTensor,
                indices: torch.Tensor | None = None) -> torch.Tensor:
        rows, width = scores.shape
        if indices is None:
            indices = torch.arange(width, device=scores.device).expand(rows, width)
        pos = exact_multinomial(scores, row_uniforms(seeds, offsets, rows))
        return indices.gather(1, pos.unsqueeze(-1)).view(-1)


_HALF = (torch.bfloat16, torch.float16)


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` on the CPU: the same index (the first maximal one, NaN counting as the
    maximum), but CPU ``argmax`` has no vectorised bfloat16/float16 kernel and ``max`` has."""
    return logits.max(-1).indices


def patched_sampling(original: Any) -> Any:
    """``FusedLogitsProcessor.sampling`` whose greedy branch (every row ``top_k == 1``) reduces
    half-precision CPU logits with ``greedy_ids``; everything else is LMDeploy's own."""

    def sampling(self: Any, logits: torch.Tensor) -> torch.Tensor:
        if (self.sampling_inputs.max_top_k == 1 and logits.device.type == 'cpu' and logits.dtype in _HALF):
            with torch.inference_mode():
                return greedy_ids(logits)
        return original(self, logits)

    sampling.__wrapped__ = original  # type: ignore[attr-defined]
    return sampling

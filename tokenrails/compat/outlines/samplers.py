"""``outlines.samplers``: outlines 0.x's sampler objects.

Two faces, because 0.x code uses both: the shim's generators hand a sampler to ``transformers``'
``generate`` (``generate_kwargs``), and code that drives its own loop calls the sampler as outlines
defines it, ``sampler(next_token_logits, sequence_weights, rng) -> (next_token_ids, ancestors,
weights)``: ids of shape ``(n, 1)``, the row each sequence continues, and each sequence's running
log-probability. ``greedy``, ``multinomial`` and ``beam_search`` are the classes themselves, as in
outlines.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

LogitsProcessor = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SamplingParameters:
    """outlines 0.1's summary of a sampler (``sampler.sampling_params``), read by its model adapters."""

    sampler: str
    num_samples: int = 1
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    temperature: Optional[float] = None


def keep_top_k_logits(k: int) -> LogitsProcessor:
    """Everything below the ``k``-th largest logit of a row becomes -inf."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be a strictly positive integers, got {k} instead.")

    def process(logits: torch.Tensor) -> torch.Tensor:
        kth = torch.topk(logits, min(k, logits.size(-1)))[0][..., -1, None]
        return logits.masked_fill(logits < kth, -math.inf)

    return process


def keep_top_p_logits(p: float) -> LogitsProcessor:
    """Drop the least likely tokens whose probabilities add up to at most ``1 - p`` (nucleus)."""
    if p <= 0.0 or p > 1.0:
        raise ValueError(f"`p` must be a floating point number between 0 and 1, got {p} instead.")

    def process(logits: torch.Tensor) -> torch.Tensor:
        ascending, order = torch.sort(logits, descending=False)
        drop_sorted = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - p)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        return logits.masked_fill(drop, -math.inf)

    return process


def rescale_logits(temperature: float) -> LogitsProcessor:
    if not isinstance(temperature, float) or temperature < 0.0:
        raise ValueError(f"`temperature` must be a strictly positive floating point number, got {temperature} instead.")
    if temperature == 0.0:
        raise ValueError("Please use the greedy sampler instead of setting the temperature to 0.")
    return lambda logits: logits / temperature


def _continue(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> tuple:
    """Each row continues itself; its weight grows by the chosen token's log-probability."""
    logprobs = torch.nn.functional.log_softmax(logits, dim=-1)
    ancestors = torch.arange(logits.shape[0], device=logits.device)
    return ids, ancestors, weights + torch.gather(logprobs, 1, ids).squeeze(-1)


@dataclass
class GreedySampler:
    samples: int = 1

    def __call__(self, next_token_logits: torch.Tensor, sequence_weights: torch.Tensor, _rng: Any = None):
        return _continue(next_token_logits, sequence_weights, torch.argmax(next_token_logits, dim=-1, keepdim=True))

    @property
    def sampling_params(self) -> SamplingParameters:
        return SamplingParameters("greedy", self.samples, None, None, 0.0)

    def generate_kwargs(self) -> dict[str, Any]:
        return {"do_sample": False, "num_beams": 1}


@dataclass
class MultinomialSampler:
    samples: int = 1
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    temperature: Optional[float] = None
    logits_processors: list = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # outlines: top_k wins over top_p; temperature applies after either
        self.logits_processors = []
        if self.top_k is not None:
            self.logits_processors.append(keep_top_k_logits(self.top_k))
        elif self.top_p is not None:
            self.logits_processors.append(keep_top_p_logits(self.top_p))
        if self.temperature is not None:
            self.logits_processors.append(rescale_logits(self.temperature))

    def __call__(self, next_token_logits: torch.Tensor, sequence_weights: torch.Tensor,
                 rng: Optional[torch.Generator] = None):
        logits = next_token_logits
        for process in self.logits_processors:
            logits = process(logits)
        ids = torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=rng)
        return _continue(logits, sequence_weights, ids)

    @property
    def sampling_params(self) -> SamplingParameters:
        return SamplingParameters("multinomial", self.samples, self.top_p, self.top_k, self.temperature)

    def generate_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"do_sample": True, "num_return_sequences": self.samples}
        for name in ("top_k", "top_p", "temperature"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass
class BeamSearchSampler:
    beams: int = 1

    @property
    def samples(self) -> int:
        return self.beams

    def __call__(self, next_token_logits: torch.Tensor, sequence_weights: torch.Tensor, _rng: Any = None):
        """Rows come in groups of ``beams`` per prompt; each group keeps its ``beams`` best
        continuations over all its rows. While every weight is 0 (the first step, all beams equal)
        only a group's first row is expanded, so the beams start different."""
        logprobs = torch.nn.functional.log_softmax(next_token_logits, dim=-1)
        weights = sequence_weights.unsqueeze(1) + logprobs
        vocab = next_token_logits.shape[-1]
        groups = next_token_logits.shape[0] // self.beams
        weights = weights.reshape(groups, self.beams * vocab)
        if torch.all(sequence_weights == 0):
            weights = weights[:, :vocab]
        best, index = torch.topk(weights, self.beams, dim=1, largest=True, sorted=True)
        ancestors = (index // vocab) + torch.arange(groups, device=index.device).unsqueeze(1) * self.beams
        return (index % vocab).reshape(-1, 1), ancestors.reshape(-1), best.reshape(-1)

    @property
    def sampling_params(self) -> SamplingParameters:
        return SamplingParameters("beam_search", self.beams, None, None, 1.0)

    def generate_kwargs(self) -> dict[str, Any]:
        return {"do_sample": False, "num_beams": self.beams, "num_return_sequences": self.beams}


greedy = GreedySampler
multinomial = MultinomialSampler
beam_search = BeamSearchSampler

Sampler = GreedySampler | MultinomialSampler | BeamSearchSampler

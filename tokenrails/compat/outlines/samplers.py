"""``outlines.samplers``: sampler objects of outlines 0.x, mapped to ``transformers`` kwargs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class GreedySampler:
    samples: int = 1

    def generate_kwargs(self) -> dict[str, Any]:
        return {"do_sample": False, "num_beams": 1}


@dataclass
class MultinomialSampler:
    samples: int = 1
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    temperature: Optional[float] = None

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

    def generate_kwargs(self) -> dict[str, Any]:
        return {"do_sample": False, "num_beams": self.beams, "num_return_sequences": self.beams}


def greedy() -> GreedySampler:
    return GreedySampler()


def multinomial(samples: int = 1, *, top_k: Optional[int] = None, top_p: Optional[float] = None,
                temperature: Optional[float] = None) -> MultinomialSampler:
    return MultinomialSampler(samples, top_k, top_p, temperature)


def beam_search(beams: int = 1) -> BeamSearchSampler:
    return BeamSearchSampler(beams)


Sampler = GreedySampler | MultinomialSampler | BeamSearchSampler

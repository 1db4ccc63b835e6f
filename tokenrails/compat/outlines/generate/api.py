"""``SequenceGeneratorAdapter``: what every outlines 0.x ``generate.*`` function returns."""
from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional, Union

import torch

from ..samplers import multinomial


class SequenceGeneratorAdapter:
    """``generator(prompts, max_tokens=None, stop_at=None, seed=None, **model_specific_params)``."""

    def __init__(self, model: Any, logits_processor: Any, sampler: Any = None):
        self.model = model
        self.logits_processor = logits_processor
        self.sampler = sampler if sampler is not None else multinomial()
        self.format_sequence: Callable[[str], Any] = lambda text: text

    def _format(self, sequences: Any) -> Any:
        if isinstance(sequences, list):
            return [self._format(s) for s in sequences]
        return self.format_sequence(sequences)

    def __call__(
        self,
        prompts: Union[str, List[str]],
        max_tokens: Optional[int] = None,
        stop_at: Optional[Union[str, List[str]]] = None,
        seed: Optional[int] = None,
        **model_specific_params: Any,
    ) -> Any:
        rng = model_specific_params.pop("rng", None)  # outlines 0.0.x seeding; not a transformers kwarg
        if seed is None and isinstance(rng, torch.Generator):
            seed = rng.initial_seed()
        kwargs = dict(self.sampler.generate_kwargs())
        kwargs.update(model_specific_params)
        if max_tokens is not None:
            kwargs["max_new_tokens"] = int(max_tokens)
        else:  # outlines: no limit but the grammar's own end (or the model's context)
            kwargs.setdefault("max_new_tokens", int(getattr(self.model.model.config, "max_position_embeddings", 2048)))
        if stop_at is not None:
            kwargs["stop_strings"] = [stop_at] if isinstance(stop_at, str) else list(stop_at)
        if seed is not None:
            torch.manual_seed(seed)
        processor = copy.copy(self.logits_processor) if self.logits_processor is not None else None
        single = isinstance(prompts, str)
        texts = self.model.generate_ids_text([prompts] if single else list(prompts), processor, **kwargs)
        result = self._format(texts)
        return result[0] if single else result

    def stream(self, *_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError("streaming is not supported by the tokenrails outlines shim")

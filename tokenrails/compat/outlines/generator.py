"""outlines 1.x ``Generator(model, output_type)``: build the processor once, call many times."""
from __future__ import annotations

from typing import Any, List, Optional

from .processors.base_logits_processor import OutlinesLogitsProcessor
from .processors.structured import processor_for_spec
from .types.convert import spec_for_output_type


class SteerableGenerator:
    """``generator(prompt, **inference_kwargs)`` → str (``model.generate`` kwargs pass through)."""

    def __init__(self, model: Any, output_type: Any = None, backend_name: Optional[str] = None):
        self.model = model
        self.backend_name = backend_name
        spec = spec_for_output_type(output_type)
        self.logits_processor = None if spec is None else processor_for_spec(spec, model.tokenizer)

    @classmethod
    def from_processor(cls, model: Any, processor: OutlinesLogitsProcessor) -> "SteerableGenerator":
        instance = cls.__new__(cls)
        instance.model = model
        instance.backend_name = None
        instance.logits_processor = processor
        return instance

    def _processor(self) -> Any:
        if self.logits_processor is None:
            return None
        self.logits_processor.reset()
        return self.logits_processor

    def __call__(self, prompt: Any, **inference_kwargs: Any) -> Any:
        return self.model.generate(prompt, self._processor(), **inference_kwargs)

    def batch(self, prompts: List[Any], **inference_kwargs: Any) -> List[Any]:
        return self.model.generate_batch(prompts, self._processor(), **inference_kwargs)

    def stream(self, prompt: Any, **inference_kwargs: Any) -> Any:
        return self.model.generate_stream(prompt, self._processor(), **inference_kwargs)


def Generator(model: Any, output_type: Any = None, backend: Optional[str] = None, *,
              processor: Optional[OutlinesLogitsProcessor] = None) -> SteerableGenerator:
    """outlines 1.x factory. ``backend`` names are accepted and ignored: tokenrails routes regex,
    choice and JSON to its FSM backend (outlines' language) and CFGs to xgrammar."""
    if output_type is not None and processor is not None:
        raise ValueError("At most one of output_type or processor can be provided")
    if processor is not None:
        return SteerableGenerator.from_processor(model, processor)
    return SteerableGenerator(model, output_type, backend)

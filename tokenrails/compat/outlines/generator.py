"""outlines 1.x ``Generator(model, output_type)``: build the processor once, call many times."""
from __future__ import annotations

from typing import Any, List, Optional

from .processors.base_logits_processor import OutlinesLogitsProcessor
from .fsm.guide import TokenrailsGuide
from .processors.structured import processor_for_spec
from .types.convert import spec_for_output_type


class SteerableGenerator:
    """``generator(prompt, **inference_kwargs)`` → str (``model.generate`` kwargs pass through)."""

    def __init__(self, model: Any, output_type: Any = None, backend_name: Optional[str] = None):
        self.model = model
        self.backend_name = backend_name
        if _is_processor(output_type):
            raise ValueError("pass a logits processor as processor=, not as the output type")
        spec = spec_for_output_type(output_type)
        if spec is None:
            self.logits_processor = None
        elif backend_name in (None, "tokenrails"):  # None: outlines 1.x's default, outlines-core's token reading
            self.logits_processor = processor_for_spec(spec, model.tokenizer, core_reading=backend_name is None)
        else:
            self.logits_processor = _backend_processor(backend_name, model, spec, output_type)

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


def _is_processor(value: Any) -> bool:
    return isinstance(value, OutlinesLogitsProcessor) or callable(getattr(value, "process_logits", None))


def _backend_processor(backend_name: str, model: Any, spec: Any, output_type: Any = None) -> Any:
    """The processor of ``spec`` on one named outlines backend (``outlines.backends``)."""
    import re

    from . import backends
    from ._json_language import outlines_regex

    backend = backends._get_backend(backend_name, model)
    if backend_name == "xgrammar" and spec.kind == "regex":  # xgrammar reads the outlines regex itself
        from .types.convert import _SCALARS
        from .types.terms import Term, to_regex

        if isinstance(output_type, Term):
            return backend.get_regex_logits_processor(to_regex(output_type))
        if isinstance(output_type, type) and output_type in _SCALARS:
            return backend.get_regex_logits_processor(_SCALARS[output_type])
    if spec.kind == "grammar":
        return backend.get_cfg_logits_processor(spec.payload)
    if backend_name == "outlines_core":  # outlines-core reads regexes only
        if spec.kind == "choice":
            meta = re.compile(r"([\\.^$|?*+()\[\]{}-])")
            escaped = [meta.sub(r"\\\1", c) for c in spec.choices]
            return backend.get_regex_logits_processor("|".join(f"({c})" for c in escaped))
        if spec.kind in ("regex", "json_schema"):
            return backend.get_regex_logits_processor(outlines_regex(spec))
        raise NotImplementedError(f"outlines-core cannot enforce a {spec.kind} output type")
    guide = TokenrailsGuide.from_spec(spec, backend.tokenizer, backend.backend)
    return backend.processor_class(backend.tokenizer, guide, backend.tensor_library_name)


def Generator(model: Any, output_type: Any = None, backend: Optional[str] = None, *,
              processor: Optional[OutlinesLogitsProcessor] = None) -> SteerableGenerator:
    """outlines 1.x factory. ``backend`` picks one of ``outlines.backends`` (``outlines_core``,
    ``xgrammar``, ``llguidance``, ``tokenrails``); without it, tokenrails routes regex, choice and
    JSON to its FSM backend (outlines' language), Lark CFGs to llguidance and EBNF to xgrammar."""
    if model is None:
        raise ValueError("Generator needs a model")
    if output_type is not None and processor is not None:
        raise ValueError("At most one of output_type or processor can be provided")
    if processor is not None:
        return SteerableGenerator.from_processor(model, processor)
    return SteerableGenerator(model, output_type, backend)

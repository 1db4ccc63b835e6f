"""``outlines.models.transformers``: ``TransformerTokenizer``, ``Transformers``, loaders.

Both spellings work: 0.x ``outlines.models.transformers("name", model_kwargs=...)`` (the
module itself is callable) and 1.x ``outlines.from_transformers(model, tokenizer)``. Generation
is ``model.generate`` of ``transformers`` with one tokenrails-backed logits processor.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Optional, Union

import torch


class TransformerTokenizer:
    """outlines' tokenizer wrapper: ``eos_token_id``, ``vocabulary``, ``encode``, ``decode``."""

    def __init__(self, tokenizer: Any, **_kwargs: Any):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.eos_token = tokenizer.eos_token
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token_id = tokenizer.eos_token_id
            self.pad_token_id = self.eos_token_id
        else:
            self.pad_token_id = tokenizer.pad_token_id
            self.pad_token = tokenizer.pad_token
        self.special_tokens = set(tokenizer.all_special_tokens)
        self.vocabulary = tokenizer.get_vocab()

    def encode(self, prompt: Union[str, list[str]], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs["padding"] = True
        kwargs["return_tensors"] = "pt"
        out = self.tokenizer(prompt, **kwargs)
        return out["input_ids"], out["attention_mask"]

    def decode(self, token_ids: Any) -> list[str]:
        return self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)

    def convert_token_to_string(self, token: str) -> str:
        return self.tokenizer.convert_tokens_to_string([token])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TransformerTokenizer):
            return other.tokenizer is self.tokenizer
        return NotImplemented

    def __hash__(self) -> int:
        return id(self.tokenizer)


class Transformers:
    """A ``transformers`` causal LM + tokenizer (outlines' model object, 0.x and 1.x API)."""

    def __init__(self, model: Any, tokenizer: Any, *, device_dtype: Optional[torch.dtype] = None):
        tokenizer.padding_side = "left"
        self.model = model
        self.hf_tokenizer = tokenizer
        self.tokenizer = TransformerTokenizer(tokenizer)
        self.device_dtype = device_dtype
        self.tensor_library_name = "torch"

    # ---- 1.x API -----------------------------------------------------------------------------
    def __call__(self, model_input: Any, output_type: Any = None, backend: Optional[str] = None,
                 **inference_kwargs: Any) -> Any:
        from ..generator import Generator

        return Generator(self, output_type, backend)(model_input, **inference_kwargs)

    def generate(self, model_input: Any, output_type: Any = None, **inference_kwargs: Any) -> Any:
        """Text for one prompt (a list of texts with ``num_return_sequences`` > 1)."""
        texts = self.generate_ids_text([model_input], _as_processor(self, output_type), **inference_kwargs)
        return texts[0]

    def generate_batch(self, model_input: list, output_type: Any = None, **inference_kwargs: Any) -> list:
        return self.generate_ids_text(list(model_input), _as_processor(self, output_type), **inference_kwargs)

    def batch(self, model_input: list, output_type: Any = None, **inference_kwargs: Any) -> list:
        return self.generate_batch(model_input, output_type, **inference_kwargs)

    def generate_stream(self, *_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError("Streaming is not implemented for Transformers models.")

    stream = generate_stream

    # ---- shared generation -------------------------------------------------------------------
    def generate_ids_text(self, prompts: list[Any], logits_processor: Any = None, **hf_kwargs: Any) -> list:
        """Run ``model.generate`` on ``prompts``; one str per prompt, or a list per prompt when
        several sequences are returned per prompt."""
        from transformers import LogitsProcessorList

        prompts = [self._format(p) for p in prompts]
        inputs = self.hf_tokenizer(prompts, return_tensors="pt", padding=True)
        inputs = {k: v.to(self.model.device) for k, v in inputs.items()}
        if self.device_dtype is not None:
            inputs["attention_mask"] = inputs["attention_mask"].to(dtype=self.device_dtype)
        if logits_processor is not None:
            processors = list(hf_kwargs.pop("logits_processor", None) or [])
            hf_kwargs["logits_processor"] = LogitsProcessorList([*processors, logits_processor])
            vocab = getattr(getattr(logits_processor, "guide", None), "vocabulary_", None)
            if vocab is not None:  # stop exactly where the guide lets the text end
                hf_kwargs.setdefault("eos_token_id", list(vocab.eos_ids))
        hf_kwargs.setdefault("pad_token_id", self.hf_tokenizer.pad_token_id)
        if "stop_strings" in hf_kwargs:
            hf_kwargs.setdefault("tokenizer", self.hf_tokenizer)
        output = self.model.generate(**inputs, **hf_kwargs)
        if not getattr(self.model.config, "is_encoder_decoder", False):
            output = output[:, inputs["input_ids"].shape[1]:]
        texts = self.tokenizer.decode(output)
        per_prompt = len(texts) // max(len(prompts), 1)
        if per_prompt > 1:
            return [texts[i * per_prompt:(i + 1) * per_prompt] for i in range(len(prompts))]
        return texts

    def _format(self, model_input: Any) -> str:
        if isinstance(model_input, str):
            return model_input
        if isinstance(model_input, list) and all(isinstance(m, dict) for m in model_input):
            return self.hf_tokenizer.apply_chat_template(model_input, tokenize=False, add_generation_prompt=True)
        messages = getattr(model_input, "messages", None)  # outlines 1.x ``Chat``
        if messages is not None:
            return self._format(list(messages))
        raise TypeError(f"unsupported model input {type(model_input).__name__}: pass a str or chat messages")


def _as_processor(model: Transformers, output_type: Any) -> Any:
    """A logits processor as is; an output type (python type / DSL term) compiled to one."""
    from ..processors.base_logits_processor import OutlinesLogitsProcessor
    from ..processors.structured import processor_for_spec
    from ..types.convert import spec_for_output_type

    if output_type is None or isinstance(output_type, OutlinesLogitsProcessor):
        return output_type
    spec = spec_for_output_type(output_type)
    return None if spec is None else processor_for_spec(spec, model.tokenizer)


def from_transformers(model: Any, tokenizer_or_processor: Any, *,
                      device_dtype: Optional[torch.dtype] = None) -> Transformers:
    """outlines 1.x: wrap an already loaded model and tokenizer."""
    if not hasattr(tokenizer_or_processor, "get_vocab"):
        raise ValueError("from_transformers needs a transformers tokenizer (multi-modal processors are not supported)")
    return Transformers(model, tokenizer_or_processor, device_dtype=device_dtype)


def transformers(model_name: str, device: Optional[str] = None, model_kwargs: Optional[dict] = None,
                 tokenizer_kwargs: Optional[dict] = None, model_class: Any = None,
                 tokenizer_class: Any = None) -> Transformers:
    """outlines 0.x: load ``model_name`` with ``from_pretrained`` and wrap it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_kwargs = dict(model_kwargs or {})
    tokenizer_kwargs = dict(tokenizer_kwargs or {})
    if device is not None:
        model_kwargs["device_map"] = device
    model = (model_class or AutoModelForCausalLM).from_pretrained(model_name, **model_kwargs)
    tokenizer_kwargs.setdefault("padding_side", "left")
    tokenizer = (tokenizer_class or AutoTokenizer).from_pretrained(model_name, **tokenizer_kwargs)
    return Transformers(model, tokenizer)


class _CallableModule(types.ModuleType):
    """Lets ``outlines.models.transformers(...)`` (0.x function) and the 1.x module coexist."""

    def __call__(self, *args: Any, **kwargs: Any) -> Transformers:
        return transformers(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

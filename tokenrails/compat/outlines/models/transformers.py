"""``outlines.models.transformers``: ``TransformerTokenizer``, ``Transformers``, loaders.

Both spellings work: 0.x ``outlines.models.transformers("name", model_kwargs=...)`` (the
module itself is callable) and 1.x ``outlines.from_transformers(model, tokenizer)``. Generation
is ``model.generate`` of ``transformers`` with one tokenrails-backed logits processor.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Optional

import torch


from .transformer_tokenizer import SPIECE_UNDERLINE, TransformerTokenizer, token_string  # noqa: F401  (outlines names)


class TransformersTypeAdapter:
    """outlines 1.x: turns a model input into the prompt text and an output type into the
    ``logits_processor`` argument of ``generate``.

    A plain string goes through the tokenizer's chat template as one user message when the
    tokenizer has one (outlines 1.3's behaviour); a ``Chat`` always does. Media inputs are refused:
    the shim runs text-only models."""

    def __init__(self, tokenizer: Any, has_chat_template: Optional[bool] = None):
        from .tokenizer import _check_hf_chat_template

        self.tokenizer = tokenizer
        self.has_chat_template = (_check_hf_chat_template(tokenizer) if has_chat_template is None
                                  else has_chat_template)

    def format_input(self, model_input: Any) -> str:
        from ..inputs import Chat, has_media

        if has_media(model_input):
            raise TypeError(f"The input type {type(model_input).__name__} with media (image, video, audio) is "
                            "not available. The outlines shim runs text-only transformers models.")
        if isinstance(model_input, str):
            if self.has_chat_template:
                return self.format_chat_input(Chat([{"role": "user", "content": model_input}]))
            return model_input
        if isinstance(model_input, Chat):
            return self.format_chat_input(model_input)
        if isinstance(model_input, list) and all(isinstance(m, dict) for m in model_input):
            return self.format_chat_input(Chat(list(model_input)))
        raise TypeError(f"The input type {type(model_input).__name__} is not available. "
                        "Please provide a string or a Chat.")

    def format_chat_input(self, chat: Any) -> str:
        return self.tokenizer.apply_chat_template(list(chat.messages), tokenize=False, add_generation_prompt=True)

    def format_output_type(self, output_type: Any = None) -> Any:
        """A logits processor as transformers' ``LogitsProcessorList`` (``None`` stays ``None``)."""
        if output_type is None:
            return None
        from transformers import LogitsProcessorList

        return LogitsProcessorList([output_type])


class Transformers:
    """A ``transformers`` causal LM + tokenizer (outlines' model object, 0.x and 1.x API)."""

    def __init__(self, model: Any, tokenizer: Any, *, device_dtype: Optional[torch.dtype] = None):
        tokenizer.padding_side = "left"
        self.model = model
        self.hf_tokenizer = tokenizer
        self.tokenizer = TransformerTokenizer(tokenizer)
        self.type_adapter = TransformersTypeAdapter(tokenizer)
        self.device_dtype = device_dtype
        self.tensor_library_name = "torch"

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ---- 1.x API (and 0.x's forward call) -----------------------------------------------------
    def __call__(self, model_input: Any, output_type: Any = None, backend: Optional[str] = None,
                 **inference_kwargs: Any) -> Any:
        if isinstance(model_input, torch.Tensor):  # 0.x: model(input_ids, attention_mask, kv_cache)
            return self.next_token_logits(model_input, output_type, backend)
        from ..generator import Generator

        return Generator(self, output_type, backend)(model_input, **inference_kwargs)

    def next_token_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          past_key_values: Any = None) -> tuple[torch.Tensor, Any]:
        """outlines 0.x's forward step: the last position's logits and the key/value cache (a
        tuple of per-layer ``(key, value)`` when the model keeps one), for ``SequenceGenerator``."""
        assert input_ids.ndim == 2, "input_ids must be [batch, length]"
        if past_key_values is not None:  # only the new token goes through the network
            input_ids = input_ids[..., -1:]
            past_key_values = _as_cache(past_key_values)
        with torch.inference_mode():
            output = self.model(input_ids.to(self.model.device), attention_mask=attention_mask.to(self.model.device),
                                past_key_values=past_key_values, use_cache=True, return_dict=True)
        cache = output.past_key_values
        legacy = getattr(cache, "to_legacy_cache", None)
        if callable(legacy):
            cache = legacy()
        return output.logits[..., -1, :], cache

    def generate(self, model_input: Any, output_type: Any = None, **inference_kwargs: Any) -> Any:
        """Text for one prompt (a list of texts with ``num_return_sequences`` > 1)."""
        texts = self.generate_ids_text([self.type_adapter.format_input(model_input)],
                                       _as_processor(self, output_type), **inference_kwargs)
        return texts[0]

    def generate_batch(self, model_input: list, output_type: Any = None, **inference_kwargs: Any) -> list:
        prompts = [self.type_adapter.format_input(p) for p in model_input]
        return self.generate_ids_text(prompts, _as_processor(self, output_type), **inference_kwargs)

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

    if output_type is None or isinstance(output_type, OutlinesLogitsProcessor) or \
            callable(getattr(output_type, "process_logits", None)):
        return output_type
    spec = spec_for_output_type(output_type)
    return None if spec is None else processor_for_spec(spec, model.tokenizer, core_reading=True)


def _as_cache(past_key_values: Any) -> Any:
    """A legacy tuple cache as the model's ``Cache`` object (recent transformers take only those)."""
    if isinstance(past_key_values, tuple):
        try:
            from transformers import DynamicCache
        except ImportError:
            return past_key_values
        from_legacy = getattr(DynamicCache, "from_legacy_cache", None)
        if callable(from_legacy):
            return from_legacy(past_key_values)
    return past_key_values


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


def mamba(model_name: str, device: Optional[str] = None, model_kwargs: Optional[dict] = None,
          tokenizer_kwargs: Optional[dict] = None) -> Transformers:
    """outlines 0.1: a Mamba model through transformers' ``MambaForCausalLM``."""
    from transformers import MambaForCausalLM

    return transformers(model_name, device=device, model_kwargs=model_kwargs, tokenizer_kwargs=tokenizer_kwargs,
                        model_class=MambaForCausalLM)


class _CallableModule(types.ModuleType):
    """Lets ``outlines.models.transformers(...)`` (0.x function) and the 1.x module coexist."""

    def __call__(self, *args: Any, **kwargs: Any) -> Transformers:
        return transformers(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

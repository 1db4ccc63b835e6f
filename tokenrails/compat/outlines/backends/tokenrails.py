"""Backends whose processors are tokenrails guides: ``tokenrails`` (outlines' languages routed as the
shim routes them), ``xgrammar`` and ``llguidance`` (that tokenrails backend for every kind)."""
from __future__ import annotations

from typing import Any, Optional

from .... import GuideSpec
from ..fsm.guide import TokenrailsGuide
from ..grammars import grammar_spec
from ..processors.structured import GuideLogitsProcessor
from .._json_language import json_spec
from ..regex_dialect import outlines_dialect
from .base import BaseBackend, tensor_library_of, tokenizer_of


class TokenrailsBackend(BaseBackend):
    backend: Optional[str] = None  # None: the shim's routing (fsm for regex/JSON)
    processor_class: type = GuideLogitsProcessor

    def __init__(self, model: Any):
        self.model = model
        self.tokenizer = tokenizer_of(model)
        self.tensor_library_name = tensor_library_of(model)

    def _processor(self, spec: GuideSpec) -> Any:
        guide = TokenrailsGuide.from_spec(spec, self.tokenizer, self.backend)
        return self.processor_class(self.tokenizer, guide, self.tensor_library_name)

    def get_json_schema_logits_processor(self, json_schema: str, whitespace_pattern: Optional[str] = None) -> Any:
        if self.backend is None:
            return self._processor(json_spec(json_schema, whitespace_pattern))
        return self._processor(GuideSpec.json_schema(json_schema, whitespace_pattern=whitespace_pattern))

    def get_regex_logits_processor(self, regex: str) -> Any:
        return self._processor(GuideSpec.regex(outlines_dialect(regex)))

    def get_cfg_logits_processor(self, grammar: str) -> Any:
        return self._processor(grammar_spec(grammar))

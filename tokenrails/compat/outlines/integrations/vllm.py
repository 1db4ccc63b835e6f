"""outlines 0.0.x ``outlines.integrations.vllm``: vLLM ``logits_processors`` entries
(``processor(generated_ids, logits) -> logits``) for a regex or a JSON schema. They need only the
``llm``'s tokenizer (``llm.get_tokenizer()`` or ``llm.tokenizer``) and work with any caller of that
protocol; forbidden tokens get ``-inf``."""
from __future__ import annotations

import math
from typing import Any, List, Optional

import torch

from ..fsm.guide import RegexGuide
from ..fsm.json_schema import build_regex_from_schema
from .utils import adapt_tokenizer, convert_json_schema_to_str
from ._guided_rows import GuideWalker


def _tokenizer_of(llm: Any) -> Any:
    if hasattr(llm, "get_tokenizer"):
        return llm.get_tokenizer()
    if hasattr(llm, "tokenizer"):
        return getattr(llm.tokenizer, "tokenizer", llm.tokenizer)
    raise ValueError("The provided LLM instance in `RegexLogitsProcessor` neither has a "
                     "`tokenizer` attribute or a `get_tokenizer` method.")


class RegexLogitsProcessor:
    """Masks vLLM logits to a regex's next allowed tokens, given the sequence generated so far."""

    def __init__(self, regex_string: str, llm: Any):
        self.fsm = RegexGuide(regex_string, adapt_tokenizer(tokenizer=_tokenizer_of(llm)))
        self._walker = GuideWalker(self.fsm)
        self.mask_cache: dict[int, torch.Tensor] = {}

    def __call__(self, input_ids: List[int], scores: torch.Tensor) -> torch.Tensor:
        state = self._walker.state(input_ids)
        mask = self.mask_cache.get(state)
        if mask is None or mask.shape[-1] != scores.shape[-1]:
            allowed = self.fsm.get_next_instruction(state).tokens
            mask = torch.full((scores.shape[-1],), -math.inf)
            mask[torch.as_tensor(list(allowed), dtype=torch.long)] = 0
            self.mask_cache[state] = mask
        return scores + mask.to(device=scores.device, dtype=scores.dtype)


class JSONLogitsProcessor(RegexLogitsProcessor):
    """The same for a JSON schema (dict, JSON text or pydantic model)."""

    def __init__(self, schema: Any, llm: Any, whitespace_pattern: Optional[str] = None):
        regex_string = build_regex_from_schema(convert_json_schema_to_str(json_schema=schema), whitespace_pattern)
        super().__init__(regex_string=regex_string, llm=llm)


__all__ = ["JSONLogitsProcessor", "RegexLogitsProcessor"]

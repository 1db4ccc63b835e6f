"""outlines 0.0.x ``outlines.integrations.transformers``: ``prefix_allowed_tokens_fn`` callables
for transformers' ``generate`` / pipelines, constraining to a regex or a JSON schema.

Each batch row is followed separately: the first sentence a row shows is its prompt, later calls
extend it by the generated tokens; a sentence that does not extend it starts a new generation.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..fsm.guide import RegexGuide
from ..fsm.json_schema import build_regex_from_schema
from .utils import adapt_tokenizer, convert_json_schema_to_str
from ._guided_rows import GuideWalker


def _tokenizer_of(tokenizer_or_pipe: Any) -> Any:
    from transformers import Pipeline, PreTrainedTokenizerBase

    if isinstance(tokenizer_or_pipe, Pipeline):
        return tokenizer_or_pipe.tokenizer
    if isinstance(tokenizer_or_pipe, PreTrainedTokenizerBase):
        return tokenizer_or_pipe
    raise ValueError("The tokenizer_or_pipe parameter must be a tokenizer or a pipeline.")


class RegexPrefixAllowedTokens:
    """``prefix_allowed_tokens_fn(batch_id, sent) -> allowed token ids`` for a regex."""

    def __init__(self, regex_string: str, tokenizer_or_pipe: Any):
        tokenizer = adapt_tokenizer(tokenizer=_tokenizer_of(tokenizer_or_pipe))
        self.fsm = RegexGuide(regex_string, tokenizer)
        self._walker = GuideWalker(self.fsm)
        self._prompts: dict[int, list[int]] = {}

    def __call__(self, batch_id: int, sent: Any) -> Optional[Iterable[int]]:
        ids = sent.tolist()
        prompt = self._prompts.get(batch_id)
        if prompt is None or ids[:len(prompt)] != prompt:
            self._prompts[batch_id] = prompt = ids
        return self._walker.allowed(ids[len(prompt):])


class JSONPrefixAllowedTokens(RegexPrefixAllowedTokens):
    """``prefix_allowed_tokens_fn`` for a JSON schema (dict, JSON text or pydantic model)."""

    def __init__(self, schema: Any, tokenizer_or_pipe: Any, whitespace_pattern: Optional[str] = None):
        regex_string = build_regex_from_schema(convert_json_schema_to_str(json_schema=schema), whitespace_pattern)
        super().__init__(regex_string=regex_string, tokenizer_or_pipe=tokenizer_or_pipe)


__all__ = ["JSONPrefixAllowedTokens", "RegexPrefixAllowedTokens"]

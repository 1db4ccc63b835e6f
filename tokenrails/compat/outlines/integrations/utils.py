"""outlines 0.0.x's ``outlines.integrations.utils``: a Hugging Face tokenizer given outlines'
tokenizer interface in place, and schema normalisation."""
from __future__ import annotations

from typing import Any, Union

from .._json_language import schema_to_str
from ..models.transformers import token_string

__all__ = ["adapt_tokenizer", "convert_json_schema_to_str"]


def adapt_tokenizer(tokenizer: Any) -> Any:
    """Give a Hugging Face tokenizer ``vocabulary``, ``special_tokens`` and
    ``convert_token_to_string`` (outlines' tokenizer interface), in place; returns it."""
    tokenizer.vocabulary = tokenizer.get_vocab()
    tokenizer.special_tokens = set(tokenizer.all_special_tokens)

    def convert_token_to_string(token: Union[str, bytes]) -> str:
        return token_string(tokenizer, token)

    tokenizer.convert_token_to_string = convert_token_to_string
    return tokenizer


def convert_json_schema_to_str(json_schema: Any) -> str:
    """A dict, JSON text or pydantic model as JSON text (outlines' name and keyword)."""
    return schema_to_str(json_schema)

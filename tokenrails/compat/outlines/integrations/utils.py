"""outlines 0.0.x's ``outlines.integrations.utils``: a Hugging Face tokenizer given outlines'
tokenizer interface in place, and schema normalisation."""
from __future__ import annotations

import json
from typing import Any, Union

from transformers import SPIECE_UNDERLINE

__all__ = ["adapt_tokenizer", "convert_json_schema_to_str"]


def adapt_tokenizer(tokenizer: Any) -> Any:
    """Give a Hugging Face tokenizer ``vocabulary``, ``special_tokens`` and
    ``convert_token_to_string`` (outlines' tokenizer interface), in place; returns it.

    ``convert_token_to_string`` keeps the leading space of SentencePiece word-start tokens and
    ``<0x20>``, which ``convert_tokens_to_string`` of a single token drops.
    """
    tokenizer.vocabulary = tokenizer.get_vocab()
    tokenizer.special_tokens = set(tokenizer.all_special_tokens)

    def convert_token_to_string(token: Union[str, bytes]) -> str:
        string = tokenizer.convert_tokens_to_string([token])
        if isinstance(token, str) and (token.startswith(SPIECE_UNDERLINE) or token == "<0x20>"):
            return " " + string
        return string

    tokenizer.convert_token_to_string = convert_token_to_string
    return tokenizer


def convert_json_schema_to_str(json_schema: Any) -> str:
    """A schema given as a dict, a JSON string or a pydantic model class, as a JSON string."""
    from pydantic import BaseModel

    if isinstance(json_schema, dict):
        return json.dumps(json_schema)
    if isinstance(json_schema, str):
        return json_schema
    if isinstance(json_schema, type) and issubclass(json_schema, BaseModel):
        return json.dumps(json_schema.model_json_schema())
    raise ValueError(f"Cannot parse schema {json_schema}. The schema must be either a Pydantic class, "
                     "a dictionary or a string that contains the JSON schema specification")

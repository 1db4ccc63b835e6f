"""``TransformerTokenizer``: outlines' wrapper of a ``transformers`` tokenizer, a leaf module.

A leaf so that code which only needs to recognise the type (``_vocabulary.vocabulary_for``) does
not import the model wrapper, and through it generation and the processors.
"""
from __future__ import annotations

from typing import Any, Union

import torch

SPIECE_UNDERLINE = "\u2581"


def token_string(hf_tokenizer: Any, token: Union[str, bytes]) -> str:
    """One token's text; SentencePiece's word-start mark and ``<0x20>`` keep their space
    (``convert_tokens_to_string`` of one such token drops it)."""
    string = hf_tokenizer.convert_tokens_to_string([token])
    if isinstance(token, str) and (token.startswith(SPIECE_UNDERLINE) or token == "<0x20>"):
        return " " + string
    return string


class TransformerTokenizer:
    """outlines' tokenizer wrapper: ``eos_token_id``, ``vocabulary``, ``encode``, ``decode``.

    Guides built from it read the wrapped tokenizer's exact token bytes (``vocabulary_for``), not
    ``convert_token_to_string`` (which turns partial UTF-8 byte tokens into U+FFFD); except on
    outlines 1.x's default path, which reads tokens as outlines-core does (``core_reading.py``)."""

    def __init__(self, tokenizer: Any, **kwargs: Any):
        self.tokenizer = tokenizer
        self.kwargs = kwargs
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

    def get_vocab(self) -> dict:
        """The wrapped tokenizer's ``get_vocab()`` (outlines 1.x exposes it on the wrapper)."""
        return self.tokenizer.get_vocab()

    def convert_token_to_string(self, token: str) -> str:
        return token_string(self.tokenizer, token)

    def _identity(self) -> tuple:
        """What makes two wrappers interchangeable: the tokenizer's class, vocabulary and special
        tokens (two loads of one model are equal, as outlines' content hash makes them)."""
        key = self.__dict__.get("_identity_key")
        if key is None:
            vocab = tuple(sorted(self.vocabulary.items()))
            key = (type(self.tokenizer).__name__, hash(vocab), len(vocab), tuple(sorted(self.special_tokens)),
                   self.eos_token_id, self.pad_token_id)
            self.__dict__["_identity_key"] = key
        return key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransformerTokenizer):
            return NotImplemented
        if other.tokenizer is self.tokenizer:
            return True
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __getstate__(self) -> dict:
        return {"tokenizer": self.tokenizer, "kwargs": self.kwargs}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokenizer"], **state.get("kwargs", {}))

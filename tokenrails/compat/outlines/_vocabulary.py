"""Outlines tokenizers → tokenrails ``Vocabulary``.

Outlines objects take an outlines ``Tokenizer`` (or, in 1.x, a model); tokenrails needs a
``Vocabulary``. Building one decodes the whole vocabulary, so it goes through the core memo
(``shared_vocabulary``), per tokenizer object.
"""
from __future__ import annotations

import functools
import re
from typing import Any

from ... import InvalidGuideError, Vocabulary, shared_vocabulary
from .models.transformer_tokenizer import TransformerTokenizer


def hf_tokenizer_of(tokenizer: Any, _depth: int = 0) -> Any:
    """The ``transformers`` tokenizer behind an outlines tokenizer / model / raw tokenizer."""
    if hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"):
        return tokenizer
    if _depth < 3:
        for attr in ("hf_tokenizer", "tokenizer"):  # outlines 1.x model, TransformerTokenizer
            inner = getattr(tokenizer, attr, None)
            if inner is not None and inner is not tokenizer:
                try:
                    return hf_tokenizer_of(inner, _depth + 1)
                except InvalidGuideError:
                    continue
    raise InvalidGuideError(
        f"cannot use {type(tokenizer).__name__} as a tokenizer: pass a transformers tokenizer, "
        "an outlines TransformerTokenizer/model, or a tokenrails Vocabulary"
    )


def _wraps_transformers_exactly(tokenizer: Any) -> bool:
    """The shim's own ``TransformerTokenizer`` (its string conversion not overridden): its guides
    read the wrapped transformers tokenizer's exact bytes."""
    return isinstance(tokenizer, TransformerTokenizer) and \
        type(tokenizer).convert_token_to_string is TransformerTokenizer.convert_token_to_string and \
        hasattr(getattr(tokenizer, "tokenizer", None), "get_vocab")


def _is_outlines_tokenizer(tokenizer: Any) -> bool:
    """outlines' own tokenizer interface (``vocabulary`` dict, ``eos_token_id``), as outlines'
    tests and custom integrations write it — no transformers tokenizer behind it."""
    if _wraps_transformers_exactly(tokenizer):
        return False
    return isinstance(getattr(tokenizer, "vocabulary", None), dict) and \
        getattr(tokenizer, "eos_token_id", None) is not None and \
        not (hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "convert_ids_to_tokens"))


def _byte_fallback(token: str) -> bytes | None:
    """The byte of a SentencePiece byte-fallback piece (``<0xF0>``), else None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            return None
    return None


def _token_bytes(text: str) -> bytes:
    """A token's bytes: byte-fallback pieces (``<0xF0>``) are that byte, the rest UTF-8."""
    piece = _byte_fallback(text)
    return piece if piece is not None else text.encode("utf-8", "surrogatepass")


# tokens that *are* U+FFFD (Gemma/GPT-SW3 "▁" prefix, NorwAI "." suffix)
REPLACEMENT_TOKEN = re.compile(r"^▁*\ufffd+\.*$")


@functools.lru_cache()
def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (what byte-level BPE vocabularies are written in)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return dict(bytes_to_unicode())


@functools.lru_cache()
def gpt2_unicode_to_bytes() -> dict[str, int]:
    return {v: k for k, v in gpt2_bytes_to_unicode().items()}


def partial_char_bytes(token: str, text: str) -> bytes | None:
    """The bytes of a token that holds part of a UTF-8 character, by outlines' rule: its text
    shows U+FFFD and it is not itself a replacement-character token. A ``<0xXX>`` byte-fallback
    piece is that byte; otherwise the token is read through GPT-2's byte table (byte-level BPE).
    None when the token is whole text, or is neither kind."""
    if "\ufffd" not in text or REPLACEMENT_TOKEN.match(token):
        return None
    if token.startswith("<0x"):
        return _byte_fallback(token)
    table = gpt2_unicode_to_bytes()
    raw = [table.get(c) for c in token]
    return None if None in raw else bytes(raw)  # type: ignore[arg-type]


def _vocabulary_from_outlines_tokenizer(tokenizer: Any) -> Vocabulary:
    vocab_map: dict = tokenizer.vocabulary
    eos = int(tokenizer.eos_token_id)
    size = max([int(i) for i in vocab_map.values()] + [eos]) + 1
    token_bytes = [b""] * size
    convert = getattr(tokenizer, "convert_token_to_string", None)
    special = {vocab_map[t] for t in (getattr(tokenizer, "special_tokens", None) or ()) if t in vocab_map}
    for token, idx in vocab_map.items():
        text = convert(token) if callable(convert) else token
        partial = partial_char_bytes(token, text)
        token_bytes[int(idx)] = partial if partial is not None else \
            _token_bytes(token if token.startswith("<0x") else text)
    # ids the vocabulary does not name are never tokens (empty bytes, special)
    special |= {i for i, b in enumerate(token_bytes) if not b}
    return Vocabulary(token_bytes=token_bytes, eos_ids=(eos,), special_ids=frozenset(special),
                      name=type(tokenizer).__name__)


def vocabulary_for(tokenizer: Any) -> Vocabulary:
    """The (memoized) ``Vocabulary`` of ``tokenizer``; a ``Vocabulary`` passes through."""
    if isinstance(tokenizer, Vocabulary):
        return tokenizer
    if _is_outlines_tokenizer(tokenizer):
        return _vocabulary_from_outlines_tokenizer(tokenizer)
    hf = hf_tokenizer_of(tokenizer)
    return shared_vocabulary(hf, "outlines", lambda: Vocabulary.from_huggingface(hf))

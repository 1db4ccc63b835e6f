"""The vocabulary as outlines 1.x hands it to outlines-core: each token read as its text decoded alone.

outlines 1.x builds outlines-core's ``Vocabulary`` from ``convert_token_to_string`` of every token
(``convert_tokens_to_string([token])``, SentencePiece's word-start mark kept as a space). A token
holding part of a UTF-8 character (byte-level BPE's lone ``0xF0``, a ``<0xF0>`` piece) decodes to
U+FFFD there, so outlines-core reads it as the character U+FFFD: it never takes one for ``\\d``,
``\\w`` or ``\\s`` (U+FFFD is none of them) nor spells a character from such pieces, but ``\\D``,
``\\W``, ``\\S``, ``.`` and ``[^...]`` take it as one character. Tokens spelling EOS's text are
left out.

The shim's outlines-1.x guides read tokens this way, so they allow exactly outlines-core's tokens
(tests/compat/test_outlines_class_token_sets.py). The only deliberate difference: special tokens
(``<|im_start|>``...), which outlines keeps as their text, stay unreachable, as everywhere in
tokenrails. The byte-exact reading (``_vocabulary.vocabulary_for``) stays for the 0.x API, whose
outlines rebuilt partial tokens' bytes, and for ``backend="tokenrails"``.
"""
from __future__ import annotations

from typing import Any, Callable

from ... import Vocabulary
from ._vocabulary import hf_tokenizer_of, vocabulary_for
from .models.transformer_tokenizer import TransformerTokenizer, token_string

_KEY = "outlines-core token reading"


def _token_text(tokenizer: Any) -> tuple[Callable[[str], str], bool]:
    """How outlines 1.x turns one token into text, and whether that is the standard rule (the
    wrapped transformers tokenizer's, shareable between wrappers of one tokenizer)."""
    convert = getattr(tokenizer, "convert_token_to_string", None)
    standard = not callable(convert) or (
        isinstance(tokenizer, TransformerTokenizer)
        and type(tokenizer).convert_token_to_string is TransformerTokenizer.convert_token_to_string)
    if standard:
        hf = hf_tokenizer_of(tokenizer)
        return (lambda token: token_string(hf, token)), True
    return convert, False


def _build(base: Vocabulary, names: dict[str, int], text_of: Callable[[str], str]) -> Vocabulary:
    token_bytes = list(base.token_bytes)
    texts: dict[int, str] = {}
    for token, idx in names.items():
        if 0 <= int(idx) < len(token_bytes):
            texts[int(idx)] = text_of(token)
    eos_texts = {texts[e] for e in base.eos_ids if e in texts}
    special = set(base.special_ids)
    for idx, text in texts.items():
        token_bytes[idx] = text.encode("utf-8", "surrogatepass")
        if not text or (text in eos_texts and idx not in base.eos_ids):
            special.add(idx)
    return base.reread(token_bytes, special_ids=special, name=f"{base.name} (outlines-core reading)")


def outlines_core_vocabulary(tokenizer: Any) -> Vocabulary:
    """``tokenizer``'s vocabulary with each token as outlines 1.x reads it (module docstring);
    memoized on the byte-exact vocabulary for the standard conversion. A tokenrails
    ``Vocabulary`` passes through (it already says what each token is)."""
    if isinstance(tokenizer, Vocabulary):
        return tokenizer
    base = vocabulary_for(tokenizer)
    text_of, standard = _token_text(tokenizer)
    names = getattr(tokenizer, "vocabulary", None)
    if not isinstance(names, dict):
        names = hf_tokenizer_of(tokenizer).get_vocab()
    if standard:
        return base.cached(_KEY, lambda: _build(base, names, text_of))
    return _build(base, names, text_of)

"""``outlines.backends.xgrammar``: every kind compiled by tokenrails' xgrammar backend (EBNF grammars).

As in outlines 1.x, the backend takes Transformers models only (anything else is a
``ValueError``), exposes the model's ``xgrammar.GrammarCompiler`` as ``grammar_compiler``, and
``XGrammarLogitsProcessor(compiled_grammar, tensor_library_name)`` accepts a grammar compiled with
xgrammar directly; masks are applied with tokenrails' kernels either way.
"""
from __future__ import annotations

import hashlib
from typing import Any

from .... import (GuideSpec, InvalidGuideError, UnsupportedGuideError, Vocabulary, get_backend,
                  shared_vocabulary)
from ..fsm.guide import TokenrailsGuide
from ..processors.structured import GuideLogitsProcessor
from .._vocabulary import hf_tokenizer_of, vocabulary_for
from .tokenrails import TokenrailsBackend


def _vocabulary_of_compiled(compiled: Any) -> Vocabulary:
    """The vocabulary of a compiled grammar's TokenizerInfo, remembered on the grammar and by the
    info's content (the core memo): reading ``decoded_vocab`` back from xgrammar costs ~150 ms at
    49k tokens, and callers build one processor per request from the same compiled grammar."""
    vocab = getattr(compiled, "_tokenrails_vocabulary", None)
    if vocab is not None:
        return vocab
    info = compiled.tokenizer_info
    digest = hashlib.sha256(info.serialize_json().encode()).hexdigest()  # ~40 ms, content-exact
    vocab = shared_vocabulary(None, ("xgrammar.TokenizerInfo", digest), lambda: _vocabulary_of(info))
    try:
        compiled._tokenrails_vocabulary = vocab
    except AttributeError:  # a binding without instance attributes: the content cache still holds
        pass
    return vocab


def _vocabulary_of(info: Any) -> Vocabulary:
    """The tokenrails vocabulary an ``xgrammar.TokenizerInfo`` describes (its decoded bytes)."""
    decoded = list(info.decoded_vocab)
    size = int(info.vocab_size)
    token_bytes = decoded[:size] + [b""] * max(0, size - len(decoded))
    special = set(int(i) for i in info.special_token_ids) | {i for i, b in enumerate(token_bytes) if not b}
    eos = tuple(int(i) for i in info.stop_token_ids)
    return Vocabulary(token_bytes=token_bytes, eos_ids=eos, special_ids=frozenset(special - set(eos)),
                      name="xgrammar.TokenizerInfo")


def _guide_of_compiled_grammar(compiled: Any) -> TokenrailsGuide:
    """A guide over a grammar the caller compiled with xgrammar itself."""
    return TokenrailsGuide(get_backend("xgrammar", _vocabulary_of_compiled(compiled)).guide_of(compiled))


class XGrammarLogitsProcessor(GuideLogitsProcessor):
    """A guide compiled by xgrammar, masked with tokenrails' kernels.

    ``XGrammarLogitsProcessor(compiled_grammar, tensor_library_name)`` (outlines 1.x) takes an
    ``xgrammar.CompiledGrammar``; the shim's backend passes ``(tokenizer, guide, library)``."""

    accepted_arguments = "(xgrammar.CompiledGrammar, tensor_library_name) or (tokenizer, guide, tensor_library_name)"

    def __init__(self, first: Any, second: Any = None, tensor_library_name: str = "torch"):
        import xgrammar as xgr

        if isinstance(first, xgr.CompiledGrammar):
            super().__init__(None, _guide_of_compiled_grammar(first), second or tensor_library_name)
        else:
            super().__init__(first, second, tensor_library_name)


class WhitespacePatternUnsupported(UnsupportedGuideError, NotImplementedError):
    """xgrammar has no custom JSON whitespace: tokenrails' typed refusal, and outlines' type."""


class XGrammarBackend(TokenrailsBackend):
    backend = "xgrammar"
    processor_class = XGrammarLogitsProcessor

    def get_json_schema_logits_processor(self, json_schema: str, whitespace_pattern: Any = None) -> Any:
        if whitespace_pattern is not None:  # refused up front, as outlines' xgrammar backend does
            raise WhitespacePatternUnsupported("xgrammar does not support a custom whitespace_pattern; "
                                               "use the llguidance or tokenrails backend",
                                               feature="whitespace_pattern", backend="xgrammar")
        return super().get_json_schema_logits_processor(json_schema)

    def get_regex_logits_processor(self, regex: str) -> Any:
        """The regex as xgrammar reads it (outlines' xgrammar backend hands it to xgrammar's
        ``compile_regex`` unchanged): ASCII ``\\d \\w``, xgrammar's ``\\s``; not outlines-core's dialect."""
        return self._processor(GuideSpec.regex(regex))

    def __init__(self, model: Any):
        try:
            hf_tokenizer_of(getattr(model, "hf_tokenizer", None) or getattr(model, "tokenizer", None))
        except InvalidGuideError:
            raise ValueError("The xgrammar backend only supports Transformers and MLXLM models") from None
        super().__init__(model)

    @property
    def grammar_compiler(self) -> Any:
        """The model's ``xgrammar.GrammarCompiler``: tokenrails' xgrammar backend's own for this
        vocabulary (special tokens blanked, so grammars compiled with it never emit them)."""
        return get_backend("xgrammar", vocabulary_for(self.tokenizer)).compiler


__all__ = ["XGrammarBackend", "XGrammarLogitsProcessor"]

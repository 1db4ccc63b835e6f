"""``outlines.backends.llguidance``: every kind compiled by tokenrails' llguidance backend (Lark grammars).

As in outlines 1.x the backend exposes the model's ``llguidance.LLTokenizer`` as ``llg_tokenizer``,
and ``LLGuidanceLogitsProcessor(grammar, llg_tokenizer, tensor_library_name)`` accepts llguidance's
own grammar form (``llguidance.grammar_from(...)``); masks are applied with tokenrails' kernels.
"""
from __future__ import annotations

import weakref
from functools import cached_property
from typing import Any

from .... import GuideSpec, Vocabulary, get_backend
from ..fsm.guide import TokenrailsGuide
from ..processors.structured import GuideLogitsProcessor
from .._vocabulary import vocabulary_for
from .tokenrails import TokenrailsBackend

# LLTokenizers handed out as ``llg_tokenizer`` → the tokenrails backend that owns them
_OWNERS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def _vocabulary_of(llg_tokenizer: Any) -> Vocabulary:
    """A tokenrails vocabulary for an ``LLTokenizer`` someone else built (special tokens decode
    to llguidance's ``\\xff`` marker bytes)."""
    token_bytes = [bytes(llg_tokenizer.decode_bytes([i])) for i in range(llg_tokenizer.vocab_size)]
    eos = int(llg_tokenizer.eos_token)
    special = frozenset(i for i, b in enumerate(token_bytes) if not b or b.startswith(b"\xff")) - {eos}
    return Vocabulary(token_bytes=token_bytes, eos_ids=(eos,), special_ids=special, name="llguidance.LLTokenizer")


def _guide_of_grammar(grammar: str, llg_tokenizer: Any) -> TokenrailsGuide:
    backend = _OWNERS.get(id(llg_tokenizer))
    if backend is None or backend.tokenizer is not llg_tokenizer:
        backend = get_backend("llguidance", _vocabulary_of(llg_tokenizer))
    spec = GuideSpec.grammar('start: ""  // compiled from an llguidance grammar', dialect="lark")
    return TokenrailsGuide(backend.compile_grammar(spec, grammar))


class LLGuidanceLogitsProcessor(GuideLogitsProcessor):
    """A guide compiled by llguidance, masked with tokenrails' kernels.

    ``LLGuidanceLogitsProcessor(grammar, llg_tokenizer, tensor_library_name)`` (outlines 1.x)
    takes llguidance's grammar and tokenizer; the shim's backend passes ``(tokenizer, guide, library)``."""

    accepted_arguments = "(llguidance grammar, llguidance.LLTokenizer, tensor_library_name) or (tokenizer, guide, tensor_library_name)"

    def __init__(self, first: Any, second: Any = None, tensor_library_name: str = "torch"):
        import llguidance as llg

        if isinstance(second, llg.LLTokenizer):
            super().__init__(None, _guide_of_grammar(first, second), tensor_library_name)
        else:
            super().__init__(first, second, tensor_library_name)


class LLGuidanceBackend(TokenrailsBackend):
    backend = "llguidance"
    processor_class = LLGuidanceLogitsProcessor

    @cached_property
    def llg_tokenizer(self) -> Any:
        """The model's ``llguidance.LLTokenizer`` (tokenrails' llguidance backend's own)."""
        backend = get_backend("llguidance", vocabulary_for(self.tokenizer))
        _OWNERS[id(backend.tokenizer)] = backend
        return backend.tokenizer


__all__ = ["LLGuidanceBackend", "LLGuidanceLogitsProcessor"]

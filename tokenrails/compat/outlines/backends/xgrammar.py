"""``outlines.backends.xgrammar``: every kind compiled by tokenrails' xgrammar backend (EBNF grammars)."""
from __future__ import annotations

from ..processors.structured import GuideLogitsProcessor
from .tokenrails import TokenrailsBackend


class XGrammarLogitsProcessor(GuideLogitsProcessor):
    """A guide compiled by xgrammar, masked with tokenrails' kernels."""


class XGrammarBackend(TokenrailsBackend):
    backend = "xgrammar"
    processor_class = XGrammarLogitsProcessor


__all__ = ["XGrammarBackend", "XGrammarLogitsProcessor"]

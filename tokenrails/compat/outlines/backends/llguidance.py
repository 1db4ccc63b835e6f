"""``outlines.backends.llguidance``: every kind compiled by tokenrails' llguidance backend (Lark grammars)."""
from __future__ import annotations

from ..processors.structured import GuideLogitsProcessor
from .tokenrails import TokenrailsBackend


class LLGuidanceLogitsProcessor(GuideLogitsProcessor):
    """A guide compiled by llguidance, masked with tokenrails' kernels."""


class LLGuidanceBackend(TokenrailsBackend):
    backend = "llguidance"
    processor_class = LLGuidanceLogitsProcessor


__all__ = ["LLGuidanceBackend", "LLGuidanceLogitsProcessor"]

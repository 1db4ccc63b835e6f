"""outlines 0.0.x ``outlines.integrations.llamacpp``: the names import; building one raises
``UnsupportedProviderError`` (the shim does not read llama.cpp vocabularies; llama.cpp models
are another provider, ``models.providers``)."""
from __future__ import annotations

from typing import Any

from ..models.providers import refuse


class LogitsProcessor:
    """llama-cpp-python ``logits_processor`` over an outlines guide: not provided."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse("llama.cpp")


class RegexLogitsProcessor(LogitsProcessor):
    """A regex for llama.cpp: not provided."""


class JSONLogitsProcessor(RegexLogitsProcessor):
    """A JSON schema for llama.cpp: not provided."""


class CFGLogitsProcessor(LogitsProcessor):
    """A grammar for llama.cpp: not provided."""

__all__ = ["CFGLogitsProcessor", "JSONLogitsProcessor", "LogitsProcessor", "RegexLogitsProcessor"]

"""``outlines.models.llamacpp`` (0.x – 1.x): llama.cpp models, another provider. The names import
(``LlamaCpp``, ``LlamaCppTokenizer``, ``llamacpp``, ``from_llamacpp``); using them raises
``UnsupportedProviderError``."""
from __future__ import annotations

from .providers import LlamaCpp, make_callable, from_llamacpp, llamacpp, unavailable_class

LlamaCppTokenizer = unavailable_class("LlamaCppTokenizer", "llama.cpp")

constructor = llamacpp
make_callable(__name__)  # ``outlines.models.llamacpp(...)``: the 0.x constructor

__all__ = ["LlamaCpp", "LlamaCppTokenizer", "from_llamacpp", "llamacpp"]

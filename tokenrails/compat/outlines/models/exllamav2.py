"""``outlines.models.exllamav2`` (0.x): ExLlamaV2 models, another provider. The names import
(``ExLlamaV2Model``, ``exl2``); using them raises ``UnsupportedProviderError``."""
from __future__ import annotations

from .providers import ExLlamaV2Model, exl2, exllamav2, make_callable

constructor = exllamav2
make_callable(__name__)  # ``outlines.models.exllamav2(...)``: the constructor's other spelling

__all__ = ["ExLlamaV2Model", "exl2"]

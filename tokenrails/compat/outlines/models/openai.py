"""outlines 0.x ``outlines.models.openai``: ``OpenAIConfig`` (plain data, usable as in outlines'
docs) and the ``OpenAI`` model / ``openai`` constructor, which raise ``UnsupportedProviderError``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from . import providers as _providers
from .providers import make_callable, unavailable


@dataclass(frozen=True)
class OpenAIConfig:
    """The OpenAI API's sampling parameters, as outlines 0.x named them."""

    model: str = ""
    frequency_penalty: float = 0
    logit_bias: Dict[int, int] = field(default_factory=dict)
    max_tokens: Optional[int] = None
    n: int = 1
    presence_penalty: float = 0
    response_format: Optional[Dict[str, str]] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    temperature: float = 1.0
    top_p: int = 1
    user: str = field(default_factory=str)


OpenAI = _providers.OpenAI  # the class ``outlines.models.OpenAI`` names too
openai = unavailable("openai", "OpenAI")
azure_openai = unavailable("azure_openai", "Azure OpenAI")

constructor = openai
make_callable(__name__)  # ``outlines.models.openai(...)``: the 0.x constructor

__all__ = ["OpenAI", "OpenAIConfig", "azure_openai", "openai"]

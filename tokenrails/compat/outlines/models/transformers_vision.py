"""``outlines.models.transformers_vision`` (0.1): multimodal transformers models, which the shim
does not run. The names import (``TransformersVision``, ``transformers_vision``); using them
raises ``UnsupportedProviderError``."""
from __future__ import annotations

from .providers import TransformersVision, make_callable, transformers_vision

constructor = transformers_vision
make_callable(__name__)  # ``outlines.models.transformers_vision(...)``: the 0.1 constructor

__all__ = ["TransformersVision", "transformers_vision"]

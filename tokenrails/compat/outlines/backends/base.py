"""The backend contract of outlines 1.x: three processor factories for one model."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class BaseBackend(ABC):
    @abstractmethod
    def get_json_schema_logits_processor(self, json_schema: str) -> Any: ...

    @abstractmethod
    def get_regex_logits_processor(self, regex: str) -> Any: ...

    @abstractmethod
    def get_cfg_logits_processor(self, grammar: str) -> Any: ...


def tensor_library_of(model: Any) -> str:
    return getattr(model, "tensor_library_name", "torch")


def tokenizer_of(model: Any) -> Any:
    """The outlines tokenizer of a model (the model itself when it is one)."""
    return getattr(model, "tokenizer", model)

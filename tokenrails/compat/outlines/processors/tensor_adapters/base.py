"""``outlines.processors.tensor_adapters.base``: the adapter interface."""
from __future__ import annotations

from typing import Any


class TensorAdapter:
    library_name = ""

    def shape(self, tensor: Any) -> list:
        return list(tensor.shape)

    def to_list(self, tensor: Any) -> list:
        return tensor.tolist()

    def to_scalar(self, tensor: Any) -> Any:
        return tensor.item()

"""``outlines.processors.tensor_adapters.numpy``: the adapter for numpy arrays."""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import TensorAdapter


class NumpyTensorAdapter(TensorAdapter):
    library_name = "numpy"

    def unsqueeze(self, tensor: Any) -> Any:
        return np.expand_dims(tensor, axis=0)

    def squeeze(self, tensor: Any) -> Any:
        return np.squeeze(tensor, axis=0) if tensor.ndim > 0 and tensor.shape[0] == 1 else tensor

    def full_like(self, tensor: Any, fill_value: Any) -> Any:
        return np.full_like(tensor, fill_value)

    def concatenate(self, tensors: list) -> Any:
        return np.concatenate([np.asarray(t) for t in tensors], axis=0)

    def get_device(self, tensor: Any) -> str:
        return "cpu"

    def to_device(self, tensor: Any, device: str) -> Any:
        return tensor

    def boolean_ones_like(self, tensor: Any) -> Any:
        return np.ones_like(tensor, dtype=bool)

    def apply_mask(self, tensor: Any, mask: Any, value: Any) -> Any:
        """``value`` where ``mask`` is true; a lower-rank mask broadcasts (as torch's masked_fill)."""
        return np.where(np.broadcast_to(mask, tensor.shape), np.asarray(value, dtype=tensor.dtype), tensor)

    def argsort_descending(self, tensor: Any) -> Any:
        return np.argsort(-tensor)

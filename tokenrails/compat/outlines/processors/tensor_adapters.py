"""``outlines.processors.tensor_adapters``: library-neutral tensor calls (torch and numpy).

The shim's processors compute on torch; these adapters are what outlines 1.x processors (and
user subclasses) call through ``self.tensor_adapter``.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TensorAdapter:
    library_name = ""

    def shape(self, tensor: Any) -> list:
        return list(tensor.shape)

    def to_list(self, tensor: Any) -> list:
        return tensor.tolist()

    def to_scalar(self, tensor: Any) -> Any:
        return tensor.item()


class TorchTensorAdapter(TensorAdapter):
    library_name = "torch"

    def unsqueeze(self, tensor: Any) -> Any:
        return tensor.unsqueeze(0)

    def squeeze(self, tensor: Any) -> Any:
        return tensor.squeeze(0) if tensor.dim() > 0 and tensor.shape[0] == 1 else tensor

    def full_like(self, tensor: Any, fill_value: Any) -> Any:
        return torch.full_like(tensor, fill_value)

    def concatenate(self, tensors: list) -> Any:
        return torch.cat([t if isinstance(t, torch.Tensor) else torch.tensor(t) for t in tensors], dim=0)

    def get_device(self, tensor: Any) -> str:
        return str(tensor.device)

    def to_device(self, tensor: Any, device: str) -> Any:
        return tensor.to(device)

    def boolean_ones_like(self, tensor: Any) -> Any:
        return torch.ones_like(tensor, dtype=torch.bool)

    def apply_mask(self, tensor: Any, mask: Any, value: Any) -> Any:
        out = tensor.clone()
        out.masked_fill_(mask, value)
        return out

    def argsort_descending(self, tensor: Any) -> Any:
        return torch.argsort(tensor, descending=True)


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


tensor_adapters = {"torch": TorchTensorAdapter, "numpy": NumpyTensorAdapter}

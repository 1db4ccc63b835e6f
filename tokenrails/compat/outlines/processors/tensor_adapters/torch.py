"""``outlines.processors.tensor_adapters.torch``: the adapter for torch tensors."""
from __future__ import annotations

from typing import Any

import torch

from .base import TensorAdapter


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

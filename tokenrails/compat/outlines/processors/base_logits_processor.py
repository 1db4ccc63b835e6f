"""``OutlinesLogitsProcessor`` (and 0.0.x's ``BaseLogitsProcessor``): the shared ``__call__``.

Callers (transformers ``generate``, llama-cpp, user loops) pass torch tensors, numpy arrays, jax
arrays or lists, 1-D or 2-D; subclasses implement ``process_logits`` on 2-D torch tensors only.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, TypeVar

import numpy as np
import torch

TensorType = TypeVar("TensorType")  # outlines' annotation for "a tensor of the processor's library"


class OutlinesLogitsProcessor:
    """Base class; ``tensor_library_name`` is accepted for outlines 1.x (only torch/numpy)."""

    tensor_library_name: str = "torch"

    def __init__(self, tensor_library_name: str = "torch"):
        if tensor_library_name not in ("torch", "numpy"):
            raise NotImplementedError(f"Library {tensor_library_name} is not available")
        self.tensor_library_name = tensor_library_name
        from .tensor_adapters import tensor_adapters

        self.tensor_adapter = tensor_adapters[tensor_library_name]()

    def reset(self) -> None:
        """Forget per-generation state (outlines 1.x calls this before each generation)."""

    @abstractmethod
    def process_logits(self, input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Mask ``logits`` (2-D) given the 2-D ``input_ids`` so far."""

    @torch.no_grad()
    def __call__(self, input_ids: Any, logits: Any) -> Any:
        torch_logits = self._to_torch(logits)
        torch_ids = self._to_torch(input_ids)
        if torch_logits.dim() == 1:
            assert torch_ids.dim() == 1, "1-D logits take 1-D input_ids"
            out = self.process_logits(torch_ids.unsqueeze(0), torch_logits.unsqueeze(0)).squeeze(0)
        elif torch_logits.dim() == 2 and torch_ids.dim() == 1:
            assert torch_logits.shape[0] == 1, "1-D input_ids take logits of a single sequence"
            out = self.process_logits(torch_ids.unsqueeze(0), torch_logits)
        elif torch_logits.dim() == 2:
            if torch_ids.dim() != 2 or torch_ids.shape[0] != torch_logits.shape[0]:
                raise ValueError(
                    f"input_ids {tuple(torch_ids.shape)} and logits {tuple(torch_logits.shape)} "
                    "must have the same batch size"
                )
            out = self.process_logits(torch_ids, torch_logits)
        else:
            raise ValueError(f"logits must be 1-D or 2-D, got shape {tuple(torch_logits.shape)}")
        return self._from_torch(out, type(logits))

    @staticmethod
    def _to_torch(value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
        if isinstance(value, (list, tuple)):
            return torch.tensor(value)
        if _is_jax(type(value)):  # jax arrays: shared memory through DLPack when possible
            try:
                return torch.from_dlpack(value)
            except (TypeError, RuntimeError, BufferError):
                return torch.from_numpy(np.asarray(value))
        raise TypeError(
            f"LogitsProcessor must be called with torch.Tensor, numpy arrays or lists, got {type(value)}"
        )

    @staticmethod
    def _from_torch(tensor: torch.Tensor, target: type) -> Any:
        if issubclass(target, torch.Tensor):
            return tensor
        if target is np.ndarray:
            return tensor.detach().numpy()
        if target is list:
            return tensor.detach().tolist()
        if target is tuple:
            return tuple(tensor.detach().tolist())
        if _is_jax(target):
            import jax.numpy as jnp

            return jnp.asarray(tensor.detach().cpu().numpy())
        raise TypeError(f"cannot convert logits back to {target}")


def _is_jax(kind: type) -> bool:
    """A jax array type (checked by module, so jax is imported only when one is passed)."""
    module = getattr(kind, "__module__", "") or ""
    return module.startswith(("jax", "jaxlib"))


BaseLogitsProcessor = OutlinesLogitsProcessor

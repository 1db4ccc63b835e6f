"""``outlines.processors.tensor_adapters``: library-neutral tensor calls (torch and numpy).

The shim's processors compute on torch; these adapters are what outlines 1.x processors (and
user subclasses) call through ``self.tensor_adapter``. One module per adapter, as in outlines
1.x (``outlines.processors.tensor_adapters.torch``...), so each class is found where outlines
keeps it.
"""
from .base import TensorAdapter
from .numpy import NumpyTensorAdapter
from .torch import TorchTensorAdapter

tensor_adapters = {"torch": TorchTensorAdapter, "numpy": NumpyTensorAdapter}

__all__ = ["NumpyTensorAdapter", "TensorAdapter", "TorchTensorAdapter", "tensor_adapters"]

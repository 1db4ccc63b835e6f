"""``outlines.models.mlxlm`` (0.1 – 1.x): MLX models, another provider. The names import
(``MLXLM``, ``mlxlm``, ``from_mlxlm``); using them raises ``UnsupportedProviderError``."""
from __future__ import annotations

from .providers import MLXLM, from_mlxlm, make_callable, mlxlm

constructor = mlxlm
make_callable(__name__)  # ``outlines.models.mlxlm(...)``: the 0.x constructor

__all__ = ["MLXLM", "from_mlxlm", "mlxlm"]

"""``outlines.models``: the transformers model wrapper (0.x and 1.x spellings)."""
from . import transformers  # callable module: ``models.transformers("name", ...)`` (0.x)
from .transformers import TransformerTokenizer, Transformers, from_transformers, mamba

__all__ = ["TransformerTokenizer", "Transformers", "from_transformers", "mamba", "transformers"]

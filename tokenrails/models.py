"""Deprecated alias of :mod:`tokenrails.demo_model` (renamed: it locates and caches the demo model)."""
from ._deprecated import warn_moved
from .demo_model import (  # noqa: F401  (re-exported names of the old module)
    DEFAULT_GGUF,
    DEFAULT_PACKAGE,
    LoadedModel,
    ModelNotFoundError,
    cache_root,
    default_gguf_path,
    load_model,
    load_tokenizer,
    resolve_model_dir,
    set_threads,
)

warn_moved("tokenrails.models", "tokenrails.demo_model")  # points at the importing line

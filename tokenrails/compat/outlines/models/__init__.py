"""``outlines.models``: the transformers model wrapper (0.x and 1.x spellings), and the names of
outlines' other providers, which raise ``UnsupportedProviderError`` when called (``providers``)."""
from . import transformers  # callable module: ``models.transformers("name", ...)`` (0.x)
from .transformers import TransformerTokenizer, Transformers, from_transformers, mamba
from .providers import (  # noqa: F401  (outlines names; they refuse when called)
    ExLlamaV2Model, LlamaCpp, MLXLM, TransformersVision, UnsupportedProviderError, VLLM, exl2, exllamav2, from_anthropic,
    from_dottxt, from_gemini, from_llamacpp, from_lmstudio, from_mistral, from_mlxlm, from_ollama, from_openai,
    from_sglang, from_tgi, from_vllm, from_vllm_offline, mlxlm, transformers_vision,
)
# ``outlines.models.openai`` / ``.llamacpp`` / ``.vllm`` / ``.mlxlm``...: modules (``OpenAIConfig``, ``LlamaCppTokenizer``...)
# that are also outlines 0.x's constructors when called (they raise UnsupportedProviderError)
from . import exllamav2, llamacpp, mlxlm, openai, transformers_vision, vllm  # noqa: F811
from .openai import OpenAI, azure_openai

from typing import Union

# outlines 0.0.x/0.1.x's alias for "a model a generator can drive" (annotations, ``isinstance``);
# 0.1.x's members (0.0.x had Mamba for OpenAI; ``mamba`` builds a Transformers here)
LogitsGenerator = Union[Transformers, LlamaCpp, OpenAI, ExLlamaV2Model, MLXLM, VLLM]

__all__ = [
    "ExLlamaV2Model", "LlamaCpp", "LogitsGenerator", "MLXLM", "OpenAI", "TransformerTokenizer", "Transformers", "TransformersVision",
    "UnsupportedProviderError", "VLLM", "azure_openai", "exl2", "exllamav2", "from_anthropic", "from_dottxt", "from_gemini",
    "from_llamacpp", "from_lmstudio", "from_mistral", "from_mlxlm", "from_ollama", "from_openai", "from_sglang",
    "from_tgi", "from_transformers", "from_vllm", "from_vllm_offline", "llamacpp", "mamba", "mlxlm", "openai",
    "transformers", "transformers_vision", "vllm",
]

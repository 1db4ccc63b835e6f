"""Other inference providers outlines wraps (OpenAI, vLLM, llama.cpp, MLX, Anthropic...): their
names import, as outlines' documentation imports them, and calling one raises
``UnsupportedProviderError`` — the shim runs transformers models only; servers are constrained
through tokenrails' request layer (``tokenrails.requests``) or its LMDeploy patch. Never a
placeholder that would return an unconstrained model.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable, NoReturn

from .... import UnsupportedGuideError


class UnsupportedProviderError(UnsupportedGuideError, NotImplementedError):
    """An outlines model provider other than transformers: not provided by the shim."""


def refuse(provider: str) -> NoReturn:
    raise UnsupportedProviderError(
        f"outlines' {provider} models are not provided by tokenrails' outlines shim (it runs transformers "
        "models); constrain that server's requests with tokenrails.requests / the LMDeploy patch instead",
        feature=f"provider:{provider}",
    )


def unavailable(name: str, provider: str) -> Callable[..., NoReturn]:
    """outlines' constructor ``name`` for ``provider``: importable, raises when called."""

    def constructor(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(provider)

    constructor.__name__ = constructor.__qualname__ = name
    constructor.__doc__ = f"outlines' ``{name}`` ({provider}): raises ``UnsupportedProviderError``."
    return constructor


class UnavailableModel:
    """outlines' model class of another provider: importable (``isinstance`` checks work, nothing
    is an instance), raises when constructed."""

    provider = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse(self.provider)


def unavailable_class(name: str, provider: str) -> type:
    return type(name, (UnavailableModel,), {"provider": provider, "__doc__": f"outlines' {provider} ``{name}``."})


# outlines 1.x ``outlines.from_*`` / ``outlines.models.from_*``
FROM_CONSTRUCTORS = {
    "from_anthropic": "Anthropic", "from_dottxt": "Dottxt", "from_gemini": "Gemini", "from_llamacpp": "llama.cpp",
    "from_lmstudio": "LM Studio", "from_mistral": "Mistral", "from_mlxlm": "MLX", "from_ollama": "Ollama",
    "from_openai": "OpenAI", "from_sglang": "SGLang", "from_tgi": "TGI", "from_vllm": "vLLM",
    "from_vllm_offline": "vLLM (offline)",
}
# outlines 0.x ``outlines.models.<provider>(...)`` functions and classes
LEGACY_CONSTRUCTORS = {
    "openai": "OpenAI", "azure_openai": "Azure OpenAI", "llamacpp": "llama.cpp", "vllm": "vLLM", "mlxlm": "MLX",
    "exl2": "ExLlamaV2", "exllamav2": "ExLlamaV2", "transformers_vision": "transformers vision (multimodal)",
}
LEGACY_CLASSES = {"OpenAI": "OpenAI", "LlamaCpp": "llama.cpp", "VLLM": "vLLM", "MLXLM": "MLX",
                  "ExLlamaV2Model": "ExLlamaV2", "TransformersVision": "transformers vision (multimodal)"}

globals().update({name: unavailable(name, provider) for name, provider in FROM_CONSTRUCTORS.items()})
globals().update({name: unavailable(name, provider) for name, provider in LEGACY_CONSTRUCTORS.items()})
globals().update({name: unavailable_class(name, provider) for name, provider in LEGACY_CLASSES.items()})


class _ProviderModule(types.ModuleType):
    """``outlines.models.openai`` is both a module (``OpenAIConfig``...) and outlines 0.x's
    constructor (``outlines.models.openai(...)``): calling the module calls its ``constructor``."""

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        return self.constructor(*args, **kwargs)


def make_callable(module_name: str) -> None:
    sys.modules[module_name].__class__ = _ProviderModule

"""An outlines-shaped API on tokenrails (outlines 0.0.x – 1.x imports keep working).

Use it directly (``from tokenrails.compat import outlines``) or call ``install()`` so that
unmodified ``import outlines`` code runs on tokenrails. Regex, choice and JSON keep outlines'
exact languages (FSM backend); CFGs are EBNF, compiled by xgrammar.
"""
from . import (applications, base, caching, exceptions, fsm, function, inputs, generate, grammars, integrations, models,
               processors, prompts, samplers, templates, types)
from ._install import install, is_installed, uninstall
from ._api_version import api_version, set_api_version
from .applications import Application
from .function import Function
from .generator import Generator
from .models import from_transformers
from .models.providers import FROM_CONSTRUCTORS as _FROM
from .models import (  # noqa: F401  other providers: importable, raise UnsupportedProviderError when called
    from_anthropic, from_dottxt, from_gemini, from_llamacpp, from_lmstudio, from_mistral, from_mlxlm, from_ollama,
    from_openai, from_sglang, from_tgi, from_vllm, from_vllm_offline,
)
from .prompts import Prompt, prompt
from .templates import Template
from .types import cfg, json_schema, regex
from .caching import clear_cache, disable_cache, get_cache
from .base import vectorize
from . import _identity

_identity.apply()  # stand-in classes read as outlines' (``outlines.models.transformers.Transformers``)

__all__ = [
    "Application", "Function", "Generator", "function", "applications", "inputs", "Prompt", "Template", "base", "caching", "cfg", "clear_cache", "disable_cache", "get_cache", "from_transformers", "fsm", "generate", "grammars", "install",
    "is_installed", "json_schema", "models", "processors", "prompt", "prompts", "regex", "samplers", "templates", "types", "vectorize",
    "uninstall", "api_version", "set_api_version", "exceptions", "integrations", *_FROM,
]

"""An outlines-shaped API on tokenrails (outlines 0.0.x – 1.x imports keep working).

Use it directly (``from tokenrails.compat import outlines``) or call ``install()`` so that
unmodified ``import outlines`` code runs on tokenrails. Regex, choice and JSON keep outlines'
exact languages (FSM backend); CFGs are EBNF, compiled by xgrammar.
"""
from . import fsm, generate, grammars, models, processors, prompts, samplers, templates, types
from ._install import install, is_installed, uninstall
from .generator import Generator
from .models import from_transformers
from .prompts import Prompt, prompt
from .templates import Template
from .types import cfg, json_schema, regex

__all__ = [
    "Generator", "Prompt", "Template", "cfg", "from_transformers", "fsm", "generate", "grammars", "install",
    "is_installed", "json_schema", "models", "processors", "prompt", "prompts", "regex", "samplers", "templates", "types",
    "uninstall",
]

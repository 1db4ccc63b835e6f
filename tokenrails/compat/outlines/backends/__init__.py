"""``outlines.backends`` (1.x): pick the structured-generation engine behind a logits processor.

outlines 1.x names three backends; the shim keeps the names and classes and adds its own:

* ``"outlines_core"`` — an ``outlines_core.Index`` walked by ``OutlinesCoreLogitsProcessor``
  (outlines-core's own DFA, masks applied with tokenrails' kernels);
* ``"xgrammar"`` / ``"llguidance"`` — tokenrails' xgrammar / llguidance backends;
* ``"tokenrails"`` — tokenrails' routing rule for outlines' languages (its FSM backend for regex
  and JSON; grammars as ``auto`` routes them).
"""
from __future__ import annotations

from typing import Any

from .base import BaseBackend
from .llguidance import LLGuidanceBackend
from .outlines_core import OutlinesCoreBackend
from .tokenrails import TokenrailsBackend
from .xgrammar import XGrammarBackend

CFG_DEFAULT_BACKEND = "llguidance"
JSON_SCHEMA_DEFAULT_BACKEND = "outlines_core"
REGEX_DEFAULT_BACKEND = "outlines_core"

_BACKENDS = {"outlines_core": OutlinesCoreBackend, "xgrammar": XGrammarBackend,
             "llguidance": LLGuidanceBackend, "tokenrails": TokenrailsBackend}


def _get_backend(backend_name: str, model: Any) -> BaseBackend:
    try:
        cls = _BACKENDS[backend_name]
    except KeyError:
        raise ValueError(f"Backend {backend_name} not supported (choose one of {sorted(_BACKENDS)})") from None
    return cls(model)


def get_json_schema_logits_processor(backend_name: str | None, model: Any, json_schema: str) -> Any:
    return _get_backend(backend_name or JSON_SCHEMA_DEFAULT_BACKEND, model).get_json_schema_logits_processor(
        json_schema)


def get_regex_logits_processor(backend_name: str | None, model: Any, regex: str) -> Any:
    return _get_backend(backend_name or REGEX_DEFAULT_BACKEND, model).get_regex_logits_processor(regex)


def get_cfg_logits_processor(backend_name: str | None, model: Any, grammar: str) -> Any:
    return _get_backend(backend_name or CFG_DEFAULT_BACKEND, model).get_cfg_logits_processor(grammar)


__all__ = [
    "BaseBackend", "CFG_DEFAULT_BACKEND", "JSON_SCHEMA_DEFAULT_BACKEND", "LLGuidanceBackend", "OutlinesCoreBackend",
    "REGEX_DEFAULT_BACKEND", "TokenrailsBackend", "XGrammarBackend", "get_cfg_logits_processor",
    "get_json_schema_logits_processor", "get_regex_logits_processor",
]

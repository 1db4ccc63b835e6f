"""Specs → compiled guides with outlines' language: regex, choice and JSON on the FSM backend."""
from __future__ import annotations

import importlib.util
import os
from typing import Any

from ...guided.backend import CompiledGuide
from ...guided.registry import compile_guide
from ...guided.spec import GuideSpec
from ._vocabulary import vocabulary_for


def fsm_available() -> bool:
    """Whether the FSM backend (outlines' exact regex/JSON language) is installed and not
    switched off with ``TOKENRAILS_OUTLINES_REGEX_BACKEND=xgrammar``."""
    if os.environ.get("TOKENRAILS_OUTLINES_REGEX_BACKEND", "fsm") == "xgrammar":
        return False
    return importlib.util.find_spec("tokenrails.guided.backends.fsm_backend") is not None


def backend_for(spec: GuideSpec) -> str:
    """Regex/choice/JSON → the FSM backend (outlines' language); CFG/EBNF → xgrammar."""
    if spec.kind == "grammar":
        return "llguidance" if spec.option("dialect") == "lark" else "xgrammar"
    if spec.kind in ("regex", "choice", "json_schema"):
        return "fsm" if fsm_available() else "xgrammar"
    return "auto"


def compile_for(spec: GuideSpec, tokenizer: Any, backend: str | None = None,
                core_reading: bool = False) -> CompiledGuide:
    """``spec`` compiled for ``tokenizer``; ``backend`` overrides the outlines-language routing.
    ``core_reading``: tokens read as outlines 1.x hands them to outlines-core (``core_reading.py``),
    for the regex / choice / JSON kinds outlines-core enforces there."""
    if core_reading and spec.kind in ("regex", "choice", "json_schema", "json_object"):
        from .core_reading import outlines_core_vocabulary

        vocab = outlines_core_vocabulary(tokenizer)
    else:
        vocab = vocabulary_for(tokenizer)
    return compile_guide(spec, vocab, backend=backend or backend_for(spec))

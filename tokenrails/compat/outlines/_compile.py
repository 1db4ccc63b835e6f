"""Specs → compiled guides in outlines' languages, through tokenrails' public API."""
from __future__ import annotations

from typing import Any

from ... import CompiledGuide, GuideSpec, compile_guide
from ._vocabulary import vocabulary_for


def outlines_routing(spec: GuideSpec) -> GuideSpec:
    """``spec`` with outlines' language stated as routing options (``GuideSpec.with_routing``), so
    the one routing rule serves it: regex, choice and JSON on the fsm backend only (its DFA numbers
    states as outlines did; its lenient lowering is outlines' JSON); the rest as ``auto`` routes it."""
    if spec.kind in ("regex", "choice", "json_schema"):
        return spec.with_routing("fsm", fallback=False)
    return spec


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
    if backend is None:
        return compile_guide(outlines_routing(spec), vocab)
    return compile_guide(spec, vocab, backend=backend)

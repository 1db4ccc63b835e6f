"""outlines 0.1.x's ``outlines.fsm.parsing``: the automaton helpers it kept (``fsm_union``,
``walk_fsm``, ``get_sub_fsms_from_seq``), from :mod:`.regex`.

outlines' partial Lark parser (``PartialLark``, ``PartialPythonIndenter``...) is not provided:
the shim's CFG guides compile Lark grammars on llguidance instead (docs/migrating-from-outlines.md).
"""
from __future__ import annotations

from .regex import fsm_union, get_sub_fsms_from_seq, walk_fsm

__all__ = ["fsm_union", "get_sub_fsms_from_seq", "walk_fsm"]

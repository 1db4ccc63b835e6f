"""outlines 0.1.x's ``outlines.fsm.parsing``: the automaton helpers it kept (``fsm_union``,
``walk_fsm``, ``get_sub_fsms_from_seq``), from :mod:`.regex`.

outlines' partial Lark parser (``PartialLark``, ``PartialPythonIndenter``) is not provided: the
shim's CFG guides compile Lark grammars on llguidance instead (docs/migrating-from-outlines.md).
The names import (outlines' ``examples/parsing.py`` imports them); building one raises
``UnsupportedGuideError``.
"""
from __future__ import annotations

from typing import Any

from .... import UnsupportedGuideError
from .regex import fsm_union, get_sub_fsms_from_seq, walk_fsm


class _NotProvided:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise UnsupportedGuideError(
            f"outlines' partial Lark parser ({type(self).__name__}) is not provided by the outlines shim; "
            "its CFG guides (CFGGuide, generate.cfg, types.CFG) read Lark grammars on llguidance",
            feature="partial_lark",
        )


class PartialLark(_NotProvided):
    """outlines' incremental Lark parser: not provided (raises)."""


class PartialPythonIndenter(_NotProvided):
    """outlines' partial Python indenter for Lark: not provided (raises)."""


__all__ = ["PartialLark", "PartialPythonIndenter", "fsm_union", "get_sub_fsms_from_seq", "walk_fsm"]

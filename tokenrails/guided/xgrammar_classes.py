"""``\\d \\w \\s`` (and negations) of a request's regex, read as xgrammar reads them.

Stock LMDeploy and vLLM enforce a request's regex (``response_format`` ``regex_schema``,
``guided_regex``) with xgrammar, whose classes are ASCII: ``\\d`` = ``[0-9]``, ``\\w`` =
``[a-zA-Z0-9_]``, ``\\s`` = ``[\\f\\n\\r\\t\\v \\xa0]``, negations their complements over code points.
tokenrails' own ``GuideSpec.regex`` follows Python's ``re`` (Unicode ``\\d``: on SmolLM2's vocabulary
25 first tokens where xgrammar allows 10, the extra ones partial UTF-8 bytes of other scripts'
digits). A request is the engine's language, so its shorthands are spelled out as xgrammar's sets
before any backend reads it: every backend of the ladder (FSM, llguidance, xgrammar) then
enforces what the stock engine enforces.
"""
from __future__ import annotations

from .ecma_patterns import class_body, spell_shorthands
from .fsm.charset import negate, normalize, without_surrogates

_RANGES = {
    "d": ((0x30, 0x39),),
    "w": normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]),
    "s": ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0)),
}


CLASSES = {k: class_body(r) for k, r in _RANGES.items()}
NEGATED = {k: class_body(without_surrogates(negate(r))) for k, r in _RANGES.items()}


def xgrammar_classes(pattern: str) -> str:
    """``pattern`` with ``\\d \\w \\s \\D \\W \\S`` (outside and inside brackets) spelled as xgrammar's
    sets; the rest unchanged."""
    if "\\" not in pattern:
        return pattern
    return spell_shorthands(pattern, CLASSES, "request regex", negated=NEGATED)

"""outlines 0.0.x / 0.1.x's regex dialect: the pattern as ``interegular`` reads it.

Before 1.0, outlines (0.0.46's ``outlines/fsm/guide.py``, 0.1.x's pinned ``outlines_core`` 0.1)
parsed every regex with ``interegular.parse_pattern``, whose ``\\d \\w \\s`` are ASCII sets
(``0-9``; ``A-Za-z0-9_``; space, ``\\t \\n \\v \\f \\r``) and whose negations are everything
else, and whose ``(?i)`` adds each written character's ``str.lower()`` and ``str.upper()`` (no
Unicode case folding: ``(?i)k`` is ``[kK]``, not the Kelvin sign). The shim's 0.x API reads
patterns this way (``regex_dialect.outlines_dialect`` asks ``reads_regex_with_interegular``), so
``\\d{3}`` starts with SmolLM2's 10 digit tokens as outlines 0.0.46 / 0.1.14 did, not outlines-core
0.2's 25 (tests/compat/test_outlines_0x_class_token_sets.py, against those versions themselves).
This module holds interegular's classes and case table; ``regex_dialect`` spells a pattern with them.
"""
from __future__ import annotations

# interegular 0.3's _CHAR_GROUPS, as code-point ranges
DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))


def reads_regex_with_interegular() -> bool:
    """The chosen outlines API (``_api_version``) is older than 1.0, whose regexes went through
    interegular; 1.x's go to outlines-core 0.2 (Rust's regex crate)."""
    from ._api_version import _parse, api_version

    return _parse(api_version()) < (1,)


def case_table() -> dict[int, tuple[int, ...]]:
    """Code point -> its ``str.lower()`` and ``str.upper()`` where they are one other character
    (what interegular's ``(?i)`` adds to a character; not symmetric: the Kelvin sign adds ``k``,
    ``k`` adds only ``K``). ``regex_dialect.INTEREGULAR_CASE`` builds it once and applies it."""
    table: dict[int, tuple[int, ...]] = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        extra = tuple(sorted({ord(x) for x in (ch.lower(), ch.upper()) if len(x) == 1 and x != ch}))
        if extra:
            table[cp] = extra
    return table

"""Sets of Unicode code points as sorted, disjoint, inclusive ranges (the regex AST's leaves).

Ranges keep ``[^"]`` or ``\\w`` to a handful of intervals instead of a million code points, and
map directly onto UTF-8 byte-range sequences (``utf8.py``).
"""
from __future__ import annotations

from typing import Iterable

MAX_CODE_POINT = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sort and merge overlapping/adjacent ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1][1] = hi
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def negate(ranges: Ranges) -> Ranges:
    """Complement within ``[0, MAX_CODE_POINT]``."""
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return tuple(out)


def union(*sets: Ranges) -> Ranges:
    return normalize(r for s in sets for r in s)


def from_predicate(pred) -> Ranges:
    """Ranges of code points ``c`` with ``pred(chr(c))`` (one pass over all code points)."""
    out: list[tuple[int, int]] = []
    start = -1
    for c in range(MAX_CODE_POINT + 1):
        if pred(chr(c)):
            if start < 0:
                start = c
        elif start >= 0:
            out.append((start, c - 1))
            start = -1
    if start >= 0:
        out.append((start, MAX_CODE_POINT))
    return tuple(out)


def contains(ranges: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


def without_surrogates(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """``ranges`` minus U+D800-U+DFFF: no regex reader (Python, Rust, xgrammar) takes a lone
    surrogate in a class, and none is a character UTF-8 can spell."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b < 0xD800 or a > 0xDFFF:
            out.append((a, b))
            continue
        if a < 0xD800:
            out.append((a, 0xD7FF))
        if b > 0xDFFF:
            out.append((0xE000, b))
    return tuple(out)

"""Code-point ranges → UTF-8 byte-range sequences (the RE2 / utf8-ranges splitting).

Each output sequence is a list of ``(lo, hi)`` byte ranges whose cartesian product is exactly a
set of UTF-8 encodings of consecutive code points, so a character class becomes a few byte
paths in the NFA and multi-byte characters are matched byte by byte. Surrogates (U+D800–DFFF)
have no UTF-8 encoding and are dropped.
"""
from __future__ import annotations

from .charset import Ranges

ByteSeq = tuple[tuple[int, int], ...]

_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF))
_SURROGATES = (0xD800, 0xDFFF)


def _split_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    s_lo, s_hi = _SURROGATES
    if hi < s_lo or lo > s_hi:
        return [(lo, hi)]
    out = []
    if lo < s_lo:
        out.append((lo, s_lo - 1))
    if hi > s_hi:
        out.append((s_hi + 1, hi))
    return out


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8")


def _sequences(lo: int, hi: int, out: list[ByteSeq]) -> None:
    """Append byte sequences for ``[lo, hi]``, which lies within one encoding length."""
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        n = len(_encode(lo))
        split = False
        for i in range(1, n):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m != 0:
                    stack.append(((lo | m) + 1, hi))
                    stack.append((lo, lo | m))
                    split = True
                    break
                if hi & m != m:
                    stack.append((hi & ~m, hi))
                    stack.append((lo, (hi & ~m) - 1))
                    split = True
                    break
        if split:
            continue
        a, b = _encode(lo), _encode(hi)
        out.append(tuple((a[k], b[k]) for k in range(n)))


def utf8_sequences(ranges: Ranges) -> list[ByteSeq]:
    """All byte-range sequences for the code points in ``ranges`` (order: ascending code points)."""
    out: list[ByteSeq] = []
    for lo, hi in ranges:
        for a, b in _split_surrogates(lo, hi):
            for blo, bhi in _BOUNDS:
                x, y = max(a, blo), min(b, bhi)
                if x <= y:
                    before = len(out)
                    _sequences(x, y, out)
                    out[before:] = sorted(out[before:])
    return out

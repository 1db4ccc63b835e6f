"""Numeric bounds (``minimum``/``maximum``/``exclusive*``) as digit-range regexes for fsm's lowering.

outlines-core's JSON lowering drops numeric bounds, which would leave the fsm backend (the only
one a budget request can use) refusing common tool schemas (pydantic ``Field(ge=..., le=...)``).
Bounds are a regular language in positional notation, so a bounded ``integer``/``number`` leaf is
swapped for a placeholder ``const`` before outlines lowers the schema and the placeholder's regex
is then replaced by an exact digit-range regex: every integer in the bounds, or for a ``number``
with integral bounds ``-?I(.F)?`` in the bounds (no exponent spellings: a subset of the valid
numbers, never an invalid one). What cannot be written exactly (a fractional number bound, a bound
beyond ``MAX_DIGITS`` digits, a leaf whose other keywords the placeholder would drop, an empty
range) keeps outlines' refusal. docs/fsm.md ("Numeric bounds written as digit ranges") has the rule
in full.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..schema_walk import FREE_ANNOTATIONS, LIST_KEYS, MAP_KEYS, ONE_KEYS

__all__ = ["integer_regex", "number_regex", "nonneg_range", "rewrite_bounds", "restore_bounds"]

MAX_DIGITS = 30
BOUND_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_PLACEHOLDER = "zqTRBOUND{}zq"
FRAC_ANY = r"(\.[0-9]+)?"
FRAC_ZERO = r"(\.0+)?"
FRAC_NONZERO = r"\.[0-9]*[1-9][0-9]*"


# ---- digit ranges --------------------------------------------------------------------------
def _same_length(lo: str, hi: str) -> str:
    """Fixed-width digit strings in ``[lo, hi]`` (leading zeros allowed: inner positions)."""
    if not lo:
        return ""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + _group(_same_length(lo[1:], hi[1:]))
    n = len(lo) - 1
    parts = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * n:
        parts.append(lo[0] + _group(_same_length(lo[1:], "9" * n)))
        first += 1
    tail_hi = hi[1:] != "9" * n
    if tail_hi:
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        parts.append(digit + ("[0-9]" + (f"{{{n}}}" if n > 1 else "") if n else ""))
    if tail_hi:
        parts.append(hi[0] + _group(_same_length("0" * n, hi[1:])))
    return "|".join(parts)


def _group(body: str) -> str:
    return f"({body})" if "|" in body else body


def nonneg_range(lo: int, hi: int | None) -> str | None:
    """Regex of the decimal spellings (no leading zeros) of the integers in ``[lo, hi]``
    (``hi=None``: unbounded); None when empty."""
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return None
    parts = []
    width = len(str(lo))
    top = len(str(hi)) if hi is not None else width
    for d in range(width, top + 1):
        a = max(lo, 10 ** (d - 1) if d > 1 else 0)
        b = 10**d - 1 if hi is None else min(hi, 10**d - 1)
        if a <= b:
            parts.append(_same_length(str(a).zfill(d), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{width},}}")
    return "(" + "|".join(parts) + ")"


# ---- bounds of one leaf ---------------------------------------------------------------------
class _Bound:
    """One side: the value and whether it is exclusive (``None``: unbounded)."""

    def __init__(self, value: float | int | None, exclusive: bool) -> None:
        self.value, self.exclusive = value, exclusive


def _bounds(sub: dict) -> tuple[_Bound, _Bound] | None:
    """(lower, upper) in the 2019+ and the draft-4 (boolean exclusive) spellings; None if unreadable."""
    def num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    lo, hi = _Bound(None, False), _Bound(None, False)
    for key, side, excl_key in (("minimum", lo, "exclusiveMinimum"), ("maximum", hi, "exclusiveMaximum")):
        flag = sub.get(excl_key)
        if key in sub:
            if not num(sub[key]):
                return None
            side.value, side.exclusive = sub[key], flag is True
        if num(flag):  # 2019+: a number of its own; the tighter of the two bounds wins
            tighter = side.value is None or (flag >= side.value if side is lo else flag <= side.value)
            if tighter:
                side.value, side.exclusive = flag, True
        elif flag not in (None, True, False):
            return None
    return lo, hi


def _magnitude(lo: _Bound, hi: _Bound, integer: bool) -> str | None:
    """Spellings ``I`` / ``I(.F)?`` of the values ``m >= 0`` in ``[lo, hi]`` (integral bounds)."""
    if integer:
        a = 0 if lo.value is None else (math.floor(lo.value) + 1 if lo.exclusive else math.ceil(lo.value))
        b = None if hi.value is None else (math.ceil(hi.value) - 1 if hi.exclusive else math.floor(hi.value))
        return nonneg_range(a, b)
    a_v = None if lo.value is None else int(lo.value)
    b_v = None if hi.value is None else int(hi.value)
    if b_v is not None and (b_v < 0 or (b_v == 0 and hi.exclusive)):
        return None
    parts = []
    # I with any fraction: x in [I, I+1) inside the bounds
    any_lo = 0 if a_v is None or a_v < 0 else (a_v + 1 if lo.exclusive else a_v)
    any_hi = None if b_v is None else b_v - 1
    body = nonneg_range(any_lo, any_hi)
    if body:
        parts.append(body + FRAC_ANY)
    if a_v is not None and a_v >= 0 and lo.exclusive and (b_v is None or b_v >= a_v + 1):
        parts.append(str(a_v) + FRAC_NONZERO)  # (a, a+1): a with a nonzero fraction
    if b_v is not None and not hi.exclusive and (a_v is None or b_v > a_v or (b_v == a_v and not lo.exclusive)):
        parts.append(str(b_v) + FRAC_ZERO)  # the upper bound itself
    return "(" + "|".join(parts) + ")" if parts else None


def _signed(lo: _Bound, hi: _Bound, integer: bool) -> str | None:
    """Both signs: ``m`` for ``x >= 0`` and ``-m`` for ``x <= 0`` (``-0`` is 0)."""
    pos = _magnitude(lo, hi, integer)
    neg = _magnitude(_Bound(None if hi.value is None else -hi.value, hi.exclusive),
                     _Bound(None if lo.value is None else -lo.value, lo.exclusive), integer)
    parts = [p for p in (pos, None if neg is None else "-" + neg) if p]
    return "(" + "|".join(parts) + ")" if parts else None


def integer_regex(sub: dict) -> str | None:
    """The exact regex of an ``integer`` leaf's bounds, or None (not expressible here)."""
    b = _bounds(sub)
    if b is None or any(s.value is not None and abs(s.value) >= 10**MAX_DIGITS for s in b):
        return None
    return _signed(*b, integer=True)


def number_regex(sub: dict) -> str | None:
    """The regex of a ``number`` leaf's integral bounds (no exponent spellings), or None."""
    b = _bounds(sub)
    if b is None or any(s.value is not None and (abs(s.value) >= 10**MAX_DIGITS or s.value != int(s.value))
                        for s in b):
        return None
    return _signed(*b, integer=False)


# ---- the schema rewrite ---------------------------------------------------------------------
def _leaf_regex(sub: dict) -> str | None:
    if not (BOUND_KEYS & sub.keys()) or not set(sub) <= FREE_ANNOTATIONS | BOUND_KEYS | {"type"}:
        return None
    t = sub.get("type")
    nullable = isinstance(t, list) and len(t) == 2 and "null" in t
    if nullable:  # Optional[...] in one type list: the range or null
        t = next(x for x in t if x != "null")
    body = integer_regex(sub) if t == "integer" else number_regex(sub) if t == "number" else None
    return f"({body}|null)" if body is not None and nullable else body


def rewrite_bounds(schema: Any) -> tuple[Any, dict[str, str]]:
    """``schema`` with each bounded numeric leaf it can write exactly replaced by a placeholder
    ``const``, and {placeholder's lowered regex: digit-range regex}. Leaves it cannot write are
    kept (so the refusal of their bounds stays)."""
    text = json.dumps(schema)
    salt = 0
    while _PLACEHOLDER.format(f"{salt}x") in text:  # a schema that spells the placeholder itself
        salt += 1
    out: dict[str, str] = {}

    def visit(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        regex = _leaf_regex(node)
        if regex is not None:
            name = _PLACEHOLDER.format(f"{salt}x{len(out)}")
            out[json.dumps(name)] = regex
            return {"const": name}
        new = dict(node)
        for key, value in node.items():
            if key in MAP_KEYS and isinstance(value, dict):
                new[key] = {k: visit(v) for k, v in value.items()}
            elif key in ONE_KEYS and isinstance(value, dict):
                new[key] = visit(value)
            elif key in LIST_KEYS and isinstance(value, list):
                new[key] = [visit(v) for v in value]
        return new

    return visit(schema), out


def restore_bounds(regex: str, placeholders: dict[str, str]) -> str:
    """Put each digit-range regex where outlines wrote its placeholder (a quoted literal)."""
    for literal, body in placeholders.items():
        if regex.count(literal) < 1:
            raise ValueError(f"the lowered regex lost the placeholder {literal}")
        regex = regex.replace(literal, body)
    return regex

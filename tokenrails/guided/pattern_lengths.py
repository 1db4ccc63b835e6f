"""A string's ``pattern`` and ``minLength``/``maxLength`` folded into one pattern xgrammar enforces.

xgrammar drops the length bound of a string that also has a ``pattern``, and structural tags (tool
calls) compile on xgrammar only, so such a tool schema would be refused. For the shapes pydantic writes
(``Field(max_length=64, pattern=r"^[^@\\s]+@[^@\\s]+\\.[a-z]{2,}$")``: an anchored chain of fixed
pieces and repeated single characters) the bound goes into the pattern's own repeats: each
repeat gets a share of the room ``maxLength`` leaves, and the first ones grow to reach
``minLength``. Every string the new pattern matches matches the old one and has an allowed length,
so the output always validates; the language is a subset (a repeat may not use all the room the
schema would allow). Characters are limited to raw JSON string characters (no ``"``, ``\\``,
control characters: xgrammar writes a pattern's characters raw, so escapes stay out, as in every
length-bounded string, ``xgrammar_lengths.py``) within the Basic Multilingual Plane.
Anything else returns None and stays refused.
"""
from __future__ import annotations

from typing import Any

from .ecma_patterns import class_body, ecma_shorthands
from .errors import GuideError
from .fsm.charset import MAX_CODE_POINT, negate, normalize, union
from .fsm.regex_ast import Alt, CharSet, Concat, Empty, Node, Repeat
from .fsm.regex_parser import parse_regex

# Raw JSON string characters of the Basic Multilingual Plane only: no control characters, quote or
# backslash; U+2028/U+2029 out too (ECMA's "." excludes them, Python's does not); no surrogates.
_EXCLUDED = normalize([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x2028, 0x2029), (0xD800, 0xDFFF),
                       (0x10000, MAX_CODE_POINT)])
_MAX_BOUND = 10_000


def _class(ranges: tuple[tuple[int, int], ...]) -> str | None:
    """``ranges`` less ``_EXCLUDED`` as a character class, or None when nothing is left."""
    kept = negate(union(negate(ranges), _EXCLUDED))
    return f"[{class_body(kept)}]" if kept else None


def _fixed(node: Node) -> tuple[str, int] | None:
    """(regex text, length) of a piece every match of which has one length; None otherwise."""
    if isinstance(node, CharSet):
        text = _class(node.ranges)
        return None if text is None else (text, 1)
    if isinstance(node, Empty):
        return "", 0
    if isinstance(node, Concat):
        parts = [_fixed(i) for i in node.items]
        if any(p is None for p in parts):
            return None
        return "".join(p[0] for p in parts), sum(p[1] for p in parts)  # type: ignore[index]
    if isinstance(node, Alt):
        parts = [_fixed(i) for i in node.items]
        if any(p is None for p in parts) or len({p[1] for p in parts}) != 1:  # type: ignore[index]
            return None
        return "(?:" + "|".join(p[0] for p in parts) + ")", parts[0][1]  # type: ignore[index]
    if isinstance(node, Repeat) and node.max == node.min:
        inner = _fixed(node.item)
        if inner is None:
            return None
        return f"(?:{inner[0]}){{{node.min}}}", inner[1] * node.min
    return None


def bounded_pattern(pattern: str, min_length: int, max_length: int | None) -> str | None:
    """An anchored pattern whose matches all match ``pattern`` with a length in the bounds, or None
    when ``pattern`` is not an anchored chain of fixed pieces and repeated characters, or no such
    string exists."""
    if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
        return None
    try:
        node = parse_regex(ecma_shorthands(pattern)[1:-1], _MAX_BOUND)  # \d \w \s as ECMA-262 reads them
    except GuideError:
        return None
    items = node.items if isinstance(node, Concat) else (node,)
    pieces: list[Any] = []  # str (fixed text) or [class text, min, max|None] for a repeat
    fixed_len = 0
    for item in items:
        if isinstance(item, Repeat) and item.max != item.min and isinstance(item.item, CharSet):
            cls = _class(item.item.ranges)
            if cls is None:
                if item.min:
                    return None
                continue
            pieces.append([cls, item.min, item.max])
            continue
        fixed = _fixed(item)
        if fixed is None:
            return None
        pieces.append(fixed[0])
        fixed_len += fixed[1]
    repeats = [p for p in pieces if isinstance(p, list)]
    hi = max_length if max_length is not None else None
    need = min_length - fixed_len - sum(r[1] for r in repeats)
    for r in repeats:  # grow the first repeats to reach minLength
        if need <= 0:
            break
        room = need if r[2] is None else min(need, r[2] - r[1])
        r[1] += room
        need -= room
    if need > 0:
        return None
    if hi is not None:
        spare = hi - fixed_len - sum(r[1] for r in repeats)
        if spare < 0:
            return None
        open_repeats = [r for r in repeats if r[2] is None or r[2] > r[1]]
        for i, r in enumerate(open_repeats):  # share the room maxLength leaves, evenly
            share = spare // (len(open_repeats) - i)
            if r[2] is not None:
                share = min(share, r[2] - r[1])
            r[2] = r[1] + share
            spare -= share
        for r in repeats:
            if r[2] is None:
                r[2] = r[1]
    text = "".join(p if isinstance(p, str) else
                   f"{p[0]}{{{p[1]},{'' if p[2] is None else p[2]}}}" for p in pieces)
    return f"^{text}$"


def fold_lengths(schema: Any) -> Any:
    """``schema`` with each string's pattern + lengths folded where ``bounded_pattern`` can (a new
    object; the input is not changed); other subschemas untouched."""
    if isinstance(schema, list):
        return [fold_lengths(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: fold_lengths(v) if isinstance(v, (dict, list)) else v for k, v in schema.items()}
    pattern = out.get("pattern")
    if isinstance(pattern, str) and ("minLength" in out or "maxLength" in out):
        lo, hi = out.get("minLength", 0), out.get("maxLength")
        if isinstance(lo, int) and (hi is None or isinstance(hi, int)):
            folded = bounded_pattern(pattern, lo, hi)
            if folded is not None:
                out["pattern"] = folded
                out.pop("minLength", None)
                out.pop("maxLength", None)
    return out


def fold_tag_lengths(tag: Any) -> Any:
    """A structural tag with ``fold_lengths`` applied to every schema it carries."""
    if isinstance(tag, list):
        return [fold_tag_lengths(t) for t in tag]
    if not isinstance(tag, dict):
        return tag
    return {k: fold_lengths(v) if k in ("schema", "json_schema") and isinstance(v, dict) else fold_tag_lengths(v)
            for k, v in tag.items()}

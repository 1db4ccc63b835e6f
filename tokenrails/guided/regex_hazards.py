"""Regex constructs some backend misreads, found by a linear scan of the pattern text.

No regex engine runs here (a client's pattern never meets a backtracking matcher). Each backend
declares which of these findings it cannot enforce exactly and refuses them with
``UnsupportedGuideError``, so ``auto`` moves on or fails: one spec, one language, whatever the
routing.
"""
from __future__ import annotations

from typing import Any

from .errors import UnsupportedGuideError
from .schema_walk import iter_subschemas


def regex_hazards(pattern: str) -> set[str]:
    """Constructs of ``pattern`` (outside character classes, unescaped) that some backend misreads.

    A linear scan, no regex engine: anchors anywhere but the very start/end, lookarounds,
    backreferences, possessive quantifiers, atomic groups, lone surrogates (anywhere), and an
    unbounded quantifier on a group that holds a quantifier ("nested quantifier": ``(x*)+``,
    ``(a?)*``, ``((a|[^a]){1,}){3,}``), whose parses xgrammar's matcher keeps all of, so its mask
    time grows with every token.
    """
    found: set[str] = set()
    if any("\ud800" <= c <= "\udfff" for c in pattern) or any(
            pattern[k + 1: k + 2] in ("u", "x") and _surrogate_escape(pattern, k + 2)
            for k in range(len(pattern) - 1) if pattern[k] == "\\"):
        found.add("lone surrogate")  # anywhere, classes included
    n = len(pattern)
    i = 0
    prev = "none"  # what precedes: "atom" (a quantifier may follow), "quant" (a ``+``/``?`` modifier may)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1: i + 2]
            if (nxt.isdigit() and nxt != "0") or nxt == "k":
                found.add("backreference")
            i, prev = i + 2, "atom"
            continue
        if c == "[":
            i, prev = class_end(pattern, i), "atom"
            continue
        if c in "*+?" or (c == "{" and _quantifier_at(pattern, i)):
            if prev == "quant":
                if c == "+":
                    found.add("possessive quantifier")
                prev = "none"
            elif prev == "atom":
                if c == "{":
                    i = pattern.index("}", i)
                prev = "quant"
            else:
                prev = "none"
            i += 1
            continue
        if c == "(":
            head = pattern[i + 1: i + 4]
            if head.startswith(("?=", "?!", "?<=", "?<!")):
                found.add("lookaround")
            elif head.startswith("?>"):
                found.add("atomic group")
            prev = "none"
            if head.startswith("?"):
                i += 1  # the group's ``?`` is syntax, not a quantifier
        elif (c == "^" and i != 0) or (c == "$" and i != n - 1):
            found.add("interior anchor")
            prev = "none"
        else:
            prev = "none" if c in "|^$" else "atom"
        i += 1
    if _ambiguous_repeat(pattern):
        found.add("nested quantifier")
    return found


class _Alt:
    """One open group while scanning for ambiguous repeats: what its alternatives can do."""

    __slots__ = ("prone", "nullable", "items", "all_nullable", "item_nullable", "item_unbounded", "item_prone")

    def __init__(self) -> None:
        self.prone = self.nullable = False  # over the finished alternatives
        self.items, self.all_nullable = 0, True  # the current alternative, items before the last
        self.item_nullable = self.item_unbounded = False  # its last item (unbounded: any variable count)
        self.item_prone = False  # its last item is a prone group (a wrapper group stays prone)

    def atom(self, nullable: bool = False, prone: bool = False) -> None:
        if self.items:
            self.all_nullable = self.all_nullable and self.item_nullable
        self.items += 1
        self.item_nullable, self.item_unbounded, self.item_prone = nullable, False, prone

    def end_alternative(self) -> None:
        nullable = self.items == 0 or (self.all_nullable and self.item_nullable)
        self.nullable = self.nullable or nullable
        self.prone = self.prone or nullable or (self.items == 1 and (self.item_unbounded or self.item_prone))
        self.items, self.all_nullable = 0, True


def _ambiguous_repeat(pattern: str) -> bool:
    r"""An unbounded quantifier on a group that can match the empty string, or whose alternative is a
    single repeat of variable count (``(x*)+``, ``(a?)*``, ``((a|b)+){3,}``, ``(a{2,5}){2,}``): the string splits into
    iterations in ever more ways, and xgrammar's matcher keeps every parse. Separated repeats like
    ``(-[a-z]+)*`` or an e-mail's ``(\.[a-z]+)*`` are not flagged."""
    stack = [_Alt()]
    last_group: _Alt | None = None  # the group just closed, while a quantifier may still follow
    n, i = len(pattern), 0
    while i < n:
        c = pattern[i]
        if c in "*+?{":
            if c == "{" and not _quantifier_at(pattern, i):
                stack[-1].atom()
                last_group, i = None, i + 1
                continue
            if c == "{":
                close = pattern.index("}", i)
                low, comma, high = pattern[i + 1: close].partition(",")
                minimum, unbounded = _count(low), bool(comma) and not high
                variable = unbounded or (bool(comma) and _count(high) != minimum)
                repeats = unbounded or (variable and _count(high) >= 2)  # ``{1,4}``: yes; ``{0,1}``: no
                i = close
            else:
                minimum, unbounded, variable = (0 if c in "*?" else 1), c in "*+", True
                repeats = unbounded
            if repeats and last_group is not None and last_group.prone:
                return True
            top = stack[-1]
            top.item_nullable = top.item_nullable or minimum == 0
            top.item_unbounded = top.item_unbounded or variable
            last_group = None
            i += 1
            if i < n and pattern[i] in "?+":  # lazy / possessive modifier
                i += 1
            continue
        last_group = None
        if c == "\\":
            stack[-1].atom()
            i += 2
        elif c == "[":
            stack[-1].atom()
            i = class_end(pattern, i)
        elif c == "(":
            stack.append(_Alt())
            i += 1
            if pattern[i: i + 1] == "?":  # (?:  (?P<name>  (?<name>  (?i)  (?i:  — syntax, not a quantifier
                if pattern[i + 1: i + 2] in ("P", "<"):
                    end = pattern.find(">", i)
                    i = end + 1 if end != -1 else i + 1
                else:
                    j = i + 1
                    while j < n and (pattern[j].isalpha() or pattern[j] == "-"):
                        j += 1
                    i = j + 1 if pattern[j: j + 1] == ":" else j
        elif c == "|":
            stack[-1].end_alternative()
            i += 1
        elif c == ")" and len(stack) > 1:
            group = stack.pop()
            group.end_alternative()
            stack[-1].atom(nullable=group.nullable, prone=group.prone)
            last_group = group
            i += 1
        else:
            if c not in "^$":
                stack[-1].atom()
            i += 1
    return False


def _count(digits: str) -> int:
    """A repeat count for this scan's comparisons only, saturated (the limit checks refuse large
    counts with their own error; ``int()`` of thousands of digits would raise here first)."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 18 else 10**18


def _surrogate_escape(pattern: str, j: int) -> bool:
    """``\\uD800``..``\\uDFFF`` or ``\\x{D800}``.. at ``j`` (just past ``\\u``/``\\x``): a lone
    surrogate has no UTF-8 encoding, so a backend admitting it would emit invalid UTF-8."""
    digits = pattern[j + 1: j + 5] if pattern[j: j + 1] == "{" else pattern[j: j + 4]
    try:
        return len(digits) == 4 and 0xD800 <= int(digits, 16) <= 0xDFFF
    except ValueError:
        return False


def class_end(pattern: str, i: int) -> int:
    """Index just past the character class opening at ``i`` (``[]a]`` and ``[^]a]`` included)."""
    j = i + 1
    if pattern[j: j + 1] == "^":
        j += 1
    if pattern[j: j + 1] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _quantifier_at(pattern: str, i: int) -> bool:
    close = pattern.find("}", i)
    body = pattern[i + 1: close] if close > 0 else ""
    return bool(body) and all(ch.isdigit() or ch == "," for ch in body) and body[0] != ","


def schema_pattern_hazards(schema: Any, hazards: frozenset[str]) -> list[str]:
    """``pattern`` values and ``patternProperties`` keys of a schema holding one of ``hazards``."""
    findings = []
    for path, sub in iter_subschemas(schema):
        patterns = [sub.get("pattern")]
        if isinstance(sub.get("patternProperties"), dict):
            patterns.extend(sub["patternProperties"])
        for pattern in patterns:
            if isinstance(pattern, str):
                bad = regex_hazards(pattern) & hazards
                if bad:
                    findings.append(f"{path}: pattern {pattern[:40]!r} uses {sorted(bad)[0]}")
    return findings


def refuse_regex_hazards(pattern: str, hazards: frozenset[str], backend: str) -> None:
    """``UnsupportedGuideError`` when ``pattern`` uses a construct ``backend`` misreads."""
    bad = regex_hazards(pattern) & hazards
    if bad:
        raise UnsupportedGuideError(
            f"{backend} does not enforce the {sorted(bad)[0]} in this pattern exactly",
            feature=sorted(bad)[0], backend=backend,
        )

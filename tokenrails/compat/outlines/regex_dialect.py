"""outlines' regex dialect: an outlines regex rewritten so tokenrails' backends read it as
outlines-core 0.2 (Rust's regex crate, what outlines 1.x runs) does.

Spelled out here: POSIX bracket classes, ``(?i)`` (Unicode case folding), ``\\d \\w \\s`` and
their negations (the exact code points outlines-core matches, ``regex_classes.py``), and
repetitions of repetitions (nested, as Rust reads them). Which *tokens* a class admits also
depends on how tokens are read: outlines 1.x hands outlines-core each token decoded alone
(``core_reading.py``), so ``\\d`` never takes a partial UTF-8 byte token. The xgrammar backend
skips this dialect: xgrammar reads the regex itself (``backends/xgrammar.py``).
"""
from __future__ import annotations

import bisect
import functools
import re
from typing import Callable

from ... import InvalidGuideError, UnsupportedGuideError, spell_shorthands
from . import interegular_dialect

_POSIX = {
    "alpha": "A-Za-z", "digit": "0-9", "alnum": "0-9A-Za-z", "upper": "A-Z", "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v", "blank": " \\t", "xdigit": "0-9A-Fa-f", "word": "0-9A-Za-z_",
    "cntrl": "\\x00-\\x1f\\x7f", "print": "\\x20-\\x7e", "graph": "\\x21-\\x7e", "ascii": "\\x00-\\x7f",
    "punct": "!-/:-@\\[-`{-~",
}
_POSIX_RE = re.compile(r"\[:(\^?)([a-z]+):\]")


def _spell_posix(pattern: str) -> str:
    """``[[:alpha:]]`` (POSIX classes inside a bracket expression) → ``[A-Za-z]``."""
    if "[:" not in pattern:
        return pattern

    def repl(m: re.Match) -> str:
        body = _POSIX.get(m.group(2))
        if body is None:
            raise InvalidGuideError(f"unknown POSIX class [:{m.group(2)}:]")
        if m.group(1):
            raise UnsupportedGuideError(f"negated POSIX class [:^{m.group(2)}:] is not supported",
                                        feature="negated POSIX class")
        return body

    return _POSIX_RE.sub(repl, pattern)


def _case_fold(pattern: str, rule: "CaseRule | None" = None) -> str:
    """A pattern under ``(?i)``: every letter (literal, in a class or in a class range) with the
    letters ``rule`` makes equal to it. By default Unicode case folding, as Rust's regex crate
    (outlines-core) reads ``(?i)``: ``k`` also matches the Kelvin sign, ``é`` ``É``, ``σ`` ``Σ``
    and ``ς``; ``ı`` only itself (interegular's reading: ``interegular_dialect.py``). Escaped
    characters are left as written."""
    rule = rule or UNICODE_FOLDING
    extras_of, extras_of_range = rule.extras, rule.extras_of_range
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
                out.append(c)
            elif i + 2 < n and pattern[i + 1] == "-" and pattern[i + 2] not in "]\\":
                lo, hi = ord(c), ord(pattern[i + 2])
                out.append(pattern[i:i + 3])
                out.append(_class_body(_ranges(extras_of_range(lo, hi))))
                i += 3
                continue
            else:
                out.append(c if c in "^-" else _class_body(_ranges({ord(c)} | extras_of([ord(c)]))))
        elif c == "[":
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":
                out.append("\\]")
                i += 1
        elif c == "{":  # a repetition count: copy as is
            j = pattern.find("}", i)
            j = n - 1 if j < 0 else j
            out.append(pattern[i:j + 1])
            i = j + 1
            continue
        else:
            extras = extras_of([ord(c)])
            out.append(f"[{_class_body(_ranges({ord(c)} | extras))}]" if extras else c)
        i += 1
    return "".join(out)


class CaseRule:
    """One reading of ``(?i)``: a table code point -> the code points it also matches, built once
    when a ``(?i)`` pattern first needs it, and the extras of characters and of class ranges."""

    def __init__(self, build_table: Callable[[], dict[int, tuple[int, ...]]]) -> None:
        self.table = functools.lru_cache(maxsize=1)(build_table)
        self._cased = functools.lru_cache(maxsize=1)(lambda: sorted(self.table()))
        # a hostile ``(?i)`` pattern of 3,000 full-range classes took minutes per range walk
        self.extras_of_range = functools.lru_cache(maxsize=1024)(self._extras_of_range)

    def extras(self, code_points) -> set[int]:
        """The code points the rule makes equal to some of ``code_points``, not among them."""
        table = self.table()
        members = set(code_points)
        return {m for cp in members for m in table.get(cp, ())} - members

    def _extras_of_range(self, lo: int, hi: int) -> frozenset[int]:
        """``extras(range(lo, hi + 1))``, visiting only the cased code points in the range (a few
        thousand in all) instead of every code point."""
        cased, table = self._cased(), self.table()
        found = {m for cp in cased[bisect.bisect_left(cased, lo):bisect.bisect_right(cased, hi)] for m in table[cp]}
        return frozenset(m for m in found if not lo <= m <= hi)


def _case_classes() -> dict[int, tuple[int, ...]]:
    """Code point -> the code points with the same Unicode case folding (only classes of two or
    more). Read once from Python's Unicode tables (~0.3 s), when a ``(?i)`` pattern first needs it."""
    groups: dict[str, set[int]] = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        key = ch.casefold()
        if key == ch and ch.upper() == ch and ch.lower() == ch:
            continue  # uncased (it joins a class below if another character folds to it)
        groups.setdefault(key, set()).add(cp)
    table: dict[int, tuple[int, ...]] = {}
    for key, members in groups.items():
        if len(key) == 1:
            members.add(ord(key))
        if len(members) > 1:
            ordered = tuple(sorted(members))
            for cp in ordered:
                table[cp] = ordered
    return table


UNICODE_FOLDING = CaseRule(_case_classes)  # outlines-core's (Rust's) ``(?i)``
_case_classes = UNICODE_FOLDING.table  # read once (~0.3 s)
INTEREGULAR_CASE = CaseRule(interegular_dialect.case_table)  # outlines 0.x's: str.lower/upper


def _ranges(code_points) -> tuple:
    """Sorted code points as (first, last) runs."""
    out: list[list[int]] = []
    for cp in sorted(code_points):
        if out and cp == out[-1][1] + 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return tuple((a, b) for a, b in out)


_CLASS_ESCAPE = set("\\]^-[")


def _class_body(ranges: tuple) -> str:
    """Ranges as the inside of a bracket expression (literal characters, specials escaped)."""
    def char(c: int) -> str:
        ch = chr(c)
        return "\\" + ch if ch in _CLASS_ESCAPE else ch

    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


def _complement(ranges: tuple) -> tuple:
    """The code points not in ``ranges``, surrogates aside (no regex reader takes a lone one)."""
    out, start = [], 0
    for a, b in sorted((*ranges, (0xD800, 0xDFFF))):
        if a > start:
            out.append((start, a - 1))
        start = max(start, b + 1)
    if start <= 0x10FFFF:
        out.append((start, 0x10FFFF))
    return tuple(out)


def _class_bodies(digit: tuple, word: tuple, space: tuple) -> tuple[dict[str, str], dict[str, str]]:
    """Bracket-expression bodies of ``\\d \\w \\s`` given as code-point ranges, and of their
    complements (keys ``d w s``)."""
    ranges = {"w": word, "d": digit, "s": space}
    return ({k: _class_body(r) for k, r in ranges.items()},
            {k: _class_body(_complement(r)) for k, r in ranges.items()})


@functools.lru_cache(maxsize=1)
def _outlines_classes() -> tuple[dict[str, str], dict[str, str]]:
    """outlines-core's ``\\d \\w \\s`` and their complements; built once (~5 ms)."""
    from . import regex_classes

    return _class_bodies(regex_classes.DIGIT, regex_classes.WORD, regex_classes.SPACE)


@functools.lru_cache(maxsize=1)
def _interegular_classes() -> tuple[dict[str, str], dict[str, str]]:
    """interegular's ASCII ``\\d \\w \\s`` and their complements (outlines 0.x)."""
    return _class_bodies(interegular_dialect.DIGIT, interegular_dialect.WORD, interegular_dialect.SPACE)


def _spell_shorthands(pattern: str, bodies: Callable = _outlines_classes, dialect: str = "outlines dialect") -> str:
    """``\\w \\d \\s \\W \\D \\S`` (outside and inside brackets) as the exact code points
    ``bodies`` gives: by default outlines-core's (Rust's) classes, as Python's and Rust's Unicode
    tables differ (marks, newer digits, ``\\x1c``-``\\x1f``), measured over every code point."""
    if "\\" not in pattern:
        return pattern
    classes, negated = bodies()
    return spell_shorthands(pattern, classes, dialect, negated=negated)


def outlines_dialect(pattern: str) -> str:
    """An outlines regex in the dialect tokenrails' backends read.

    outlines-core 0.2 (Rust's regex crate, what outlines 1.x runs) knows POSIX classes inside
    brackets (``[[:alpha:]]``, ASCII) and a leading ``(?i)``; both are spelled out here. Its
    ``\\d \\w \\s`` are Rust's Unicode classes, which differ from Python's in thousands of code
    points: they are spelled out as the exact code points outlines-core matches
    (``regex_classes.py``, read from outlines-core; compared with it in
    tests/compat/test_outlines_regex_dialect.py).

    Under the 0.x API (``api_version()`` before 1.0) the pattern is read as outlines 0.0.x /
    0.1.x read it, with interegular: ASCII ``\\d \\w \\s``, interegular's ``(?i)``
    (``interegular_dialect.py``).
    """
    if not isinstance(pattern, str):
        return pattern
    interegular = interegular_dialect.reads_regex_with_interegular()
    fold = False
    while pattern.startswith("(?i)"):
        fold, pattern = True, pattern[4:]
    if not interegular:  # the 0.x reading leaves POSIX classes as written, as it always did
        pattern = _spell_posix(pattern)
    if fold:
        pattern = _case_fold(pattern, INTEREGULAR_CASE if interegular else UNICODE_FOLDING)
    if interegular:
        return _group_stacked_repeats(_spell_shorthands(pattern, _interegular_classes, "outlines 0.x dialect"))
    return _group_stacked_repeats(_spell_shorthands(pattern))


_REPEAT = re.compile(r"[*+?]|\{[0-9]+(?:,[0-9]*)?\}|\{,[0-9]+\}")
_CLASS = re.compile(r"\[\^?\]?(?:\\.?|[^\]\\])*\]?", re.S)  # a bracket class, ``[]a]`` and ``[^]a]`` included


def _group_stacked_repeats(pattern: str) -> str:
    """Rust's regex crate (so outlines-core) reads a repetition of a repetition, ``X+{1,2}`` or
    ``X{2}{3}``, as nested repetition; Python's parser refuses it ("multiple repeat"). Each
    repetition after the first is given its operand as a group: ``(?:X+){1,2}``. A ``?`` right
    after a repetition stays its lazy marker."""
    if not any(c in pattern for c in "*+?}"):
        return pattern
    items: list[list[str]] = []  # [text, kind]; kind: atom | repeat | op | open
    groups: list[int] = []  # where each open group's items start
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        m = _REPEAT.match(pattern, i)
        if m and items and items[-1][1] in ("atom", "repeat"):
            text, i = m.group(0), m.end()
            if pattern.startswith("?", i):  # lazy marker of this repetition
                text, i = text + "?", i + 1
            last = items[-1]
            if last[1] == "repeat":
                last[0] = f"(?:{last[0]})"
            last[0], last[1] = last[0] + text, "repeat"
        elif c == "\\" and i + 1 < n:
            items.append([pattern[i:i + 2], "atom"])
            i += 2
        elif c == "[":
            j = _CLASS.match(pattern, i).end()
            items.append([pattern[i:j], "atom"])
            i = j
        elif c == "(":
            j, standalone = _group_prefix_end(pattern, i)
            if standalone:  # (?i) and the like: a flag setting, not a group
                items.append([pattern[i:j], "op"])
            else:
                groups.append(len(items))
                items.append([pattern[i:j], "open"])
            i = j
        elif c == ")" and groups:
            start = groups.pop()
            text = "".join(t for t, _ in items[start:]) + ")"
            del items[start:]
            items.append([text, "atom"])
            i += 1
        else:
            items.append([c, "op" if c in "|^$" else "atom"])
            i += 1
    return "".join(t for t, _ in items)


def _group_prefix_end(pattern: str, i: int) -> tuple[int, bool]:
    """Where the opening of the group at ``pattern[i] == "("`` ends (``(``, ``(?:``, ``(?P<n>``,
    ``(?=``, ``(?i:``...), and whether it is a standalone flag setting such as ``(?i)``."""
    j = i + 1
    if not pattern.startswith("?", j):
        return j, False
    j += 1
    if pattern[j:j + 1] in (":", "=", "!"):
        return j + 1, False
    if pattern.startswith("<=", j) or pattern.startswith("<!", j):
        return j + 2, False
    if pattern.startswith("P<", j) or pattern.startswith("<", j):
        k = pattern.find(">", j)
        return (k + 1, False) if k >= 0 else (j, False)
    while j < len(pattern) and (pattern[j].isalpha() or pattern[j] == "-"):
        j += 1
    if pattern[j:j + 1] == ")":
        return j + 1, True
    return j + (1 if pattern[j:j + 1] == ":" else 0), False

"""``\\d``, ``\\w``, ``\\s`` exactly as Python's ``re`` defines them for ``str`` patterns.

CPython's ``_sre`` uses ``Py_UNICODE_ISDECIMAL`` for ``\\d``, ``Py_UNICODE_ISALNUM || '_'`` for
``\\w`` and ``Py_UNICODE_ISSPACE`` for ``\\s``; those are ``str.isdecimal``, ``str.isalnum`` and
``str.isspace``. Tables are derived once per process from the running interpreter's Unicode
database (~0.1 s each), so they always agree with that interpreter's ``re``. With the ASCII flag
(``(?a)``) the classes are the ASCII ones.
"""
from __future__ import annotations

from functools import lru_cache

from .charset import Ranges, from_predicate, normalize

ASCII_DIGIT: Ranges = ((0x30, 0x39),)
ASCII_WORD: Ranges = normalize([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
ASCII_SPACE: Ranges = normalize([(0x09, 0x0D), (0x20, 0x20)])


@lru_cache(maxsize=None)
def unicode_digit() -> Ranges:
    return from_predicate(str.isdecimal)


@lru_cache(maxsize=None)
def unicode_word() -> Ranges:
    return from_predicate(lambda ch: ch.isalnum() or ch == "_")


@lru_cache(maxsize=None)
def unicode_space() -> Ranges:
    return from_predicate(str.isspace)


def class_ranges(letter: str, ascii_only: bool) -> tuple[Ranges, bool]:
    """Ranges for ``\\d``/``\\w``/``\\s`` (lower-case letter) and whether it is negated."""
    lower = letter.lower()
    if ascii_only:
        table = {"d": ASCII_DIGIT, "w": ASCII_WORD, "s": ASCII_SPACE}[lower]
    else:
        table = {"d": unicode_digit, "w": unicode_word, "s": unicode_space}[lower]()
    return table, letter.isupper()

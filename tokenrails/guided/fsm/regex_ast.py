"""The regex AST: code-point sets, concatenation, alternation, bounded/unbounded repetition.

Anchors only exist transiently (``Anchor``) until the parser checks they sit at the ends, where
under full-match semantics they match the empty string.
"""
from __future__ import annotations

from dataclasses import dataclass

from .charset import Ranges


class Node:
    """Base class of AST nodes (immutable)."""

    __slots__ = ()


@dataclass(frozen=True)
class CharSet(Node):
    """One character from ``ranges`` (code points)."""

    ranges: Ranges


@dataclass(frozen=True)
class Concat(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat(Node):
    """``item`` repeated ``min..max`` times (``max is None`` → unbounded)."""

    item: Node
    min: int
    max: int | None


@dataclass(frozen=True)
class Empty(Node):
    """Matches the empty string."""


@dataclass(frozen=True)
class Anchor(Node):
    """``^``/``\\A`` (kind "start") or ``$``/``\\Z`` (kind "end"); removed by the parser."""

    kind: str
    pos: int


EMPTY = Empty()


def literal(text: str) -> Node:
    """The AST matching exactly ``text``."""
    if not text:
        return EMPTY
    items = tuple(CharSet(((ord(c), ord(c)),)) for c in text)
    return items[0] if len(items) == 1 else Concat(items)


def expanded_size(node: Node) -> int:
    """Number of character positions after expanding every bounded repetition (NFA size guard)."""
    if isinstance(node, CharSet):
        return 1
    if isinstance(node, (Concat, Alt)):
        return sum(expanded_size(i) for i in node.items) + 1
    if isinstance(node, Repeat):
        inner = expanded_size(node.item)
        copies = node.max if node.max is not None else max(node.min, 1)
        return inner * max(copies, 1) + 1
    return 1

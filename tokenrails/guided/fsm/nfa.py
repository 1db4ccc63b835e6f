"""Thompson NFA over bytes, then epsilon elimination (no DFA code: the DFA builders import this).

Character sets become small byte DAGs (UTF-8 sequences with shared suffixes, as RE2 does), so
even Unicode ``\\w`` stays a few hundred states. The epsilon-free form keeps only the start and
the targets of byte edges ("important" states); the DFA is built over sets of those.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from .charset import Ranges
from .deadline import Deadline
from .dfa import nfa_limit_error
from .regex_ast import Alt, CharSet, Concat, Empty, Node, Repeat
from .utf8 import ByteSeq, utf8_sequences

# A character set's minimal byte DFA: (states, edges (src, lo, hi, dst), final state); see thompson.py
Fragment = tuple[int, tuple[tuple[int, int, int, int], ...], int]


@lru_cache(maxsize=256)
def _sequences(ranges: Ranges) -> tuple[ByteSeq, ...]:
    return tuple(utf8_sequences(ranges))


class ThompsonNFA:
    """States with epsilon lists and byte-range edges ``(lo, hi, target)``."""

    def __init__(self, max_states: int, deadline: Deadline,
                 fragment: Callable[[Ranges], Fragment] | None = None):
        """``fragment``: a character set's cached minimal DFA (``thompson.charset_fragment``);
        None for a scratch NFA that only builds ``raw_charset``."""
        self.fragment = fragment
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.max_states = max_states
        self.deadline = deadline

    def new(self) -> int:
        n = len(self.eps)
        if n & 4095 == 4095 or n >= self.max_states:
            return self.reserve(1)
        self.eps.append([])
        self.edges.append([])
        return n

    def reserve(self, count: int) -> int:
        """Append ``count`` fresh states; returns the first one's id."""
        n = len(self.eps)
        if n + count > self.max_states:
            raise nfa_limit_error(self.max_states, n + count)
        if (n & 4095) + count > 4095:
            self.deadline.check()
        if count == 1:
            self.eps.append([])
            self.edges.append([])
        else:
            self.eps.extend([[] for _ in range(count)])
            self.edges.extend([[] for _ in range(count)])
        return n

    def append(self, end: int, node: Node) -> int:
        """Continue the fragment ending at ``end`` with ``node``; returns the new end.

        A character set is built *from* ``end`` (no epsilon, no extra state): its start state has
        no incoming edges, so sharing it with ``end`` adds no path that the epsilon would not.
        """
        if isinstance(node, CharSet):
            return self._charset(node.ranges, end)[1]
        s, e = self.build(node)
        self.eps[end].append(s)
        return e

    def build(self, node: Node) -> tuple[int, int]:
        """Fragment ``(start, end)`` for ``node``."""
        if isinstance(node, CharSet):
            return self._charset(node.ranges)
        if isinstance(node, Concat):
            start, end = self.build(node.items[0])
            for item in node.items[1:]:
                end = self.append(end, item)
            return start, end
        if isinstance(node, Alt):
            start, end = self.new(), self.new()
            for item in node.items:
                s, e = self.build(item)
                self.eps[start].append(s)
                self.eps[e].append(end)
            return start, end
        if isinstance(node, Repeat):
            return self._repeat(node)
        if isinstance(node, Empty):
            s = self.new()
            return s, s
        raise TypeError(f"unexpected AST node {node!r}")

    def _charset(self, ranges: Ranges, at: int | None = None) -> tuple[int, int]:
        """Copy the cached minimal byte DFA of ``ranges`` (deterministic: cheap to determinize).

        With ``at``, the fragment's start state is ``at`` instead of a fresh state.
        """
        size, edges, final = self.fragment(ranges)
        if at is None:
            base = self.reserve(size)
            for src, lo, hi, dst in edges:
                self.edges[base + src].append((lo, hi, base + dst))
            return base, base + final
        base = self.reserve(size - 1) - 1  # fragment state i > 0 -> base + i; state 0 -> at
        out = self.edges
        for src, lo, hi, dst in edges:
            out[base + src if src else at].append((lo, hi, base + dst))
        return at, base + final

    def raw_charset(self, ranges: Ranges) -> tuple[int, int]:
        """UTF-8 sequences of ``ranges`` as a byte DAG with shared suffixes (may be nondeterministic)."""
        start, end = self.new(), self.new()
        suffix: dict[tuple[int, int, int], int] = {}
        for seq in _sequences(ranges):
            target = end
            for lo, hi in reversed(seq[1:]):
                key = (lo, hi, target)
                state = suffix.get(key)
                if state is None:
                    state = self.new()
                    self.edges[state].append(key)
                    suffix[key] = state
                target = state
            lo, hi = seq[0]
            self.edges[start].append((lo, hi, target))
        return start, end

    def _repeat(self, node: Repeat) -> tuple[int, int]:
        start = end = self.new()
        for _ in range(node.min):
            end = self.append(end, node.item)
        if node.max is None:
            loop = self.new()
            s, e = self.build(node.item)
            self.eps[end].append(loop)
            self.eps[loop].append(s)
            self.eps[e].append(loop)
            return start, loop
        optional = node.max - node.min
        if optional:
            final = self.new()
            for _ in range(optional):
                self.eps[end].append(final)
                end = self.append(end, node.item)
            self.eps[end].append(final)
            end = final
        return start, end


@dataclass
class ByteNFA:
    """Epsilon-free NFA: state 0 is the start; ``edges[p]`` = byte edges of p's closure."""

    edges: list[list[tuple[int, int, int]]]
    accepting: list[bool]


def eliminate_epsilons(nfa: ThompsonNFA, start: int, accept: int) -> ByteNFA:
    """Keep the start and every byte-edge target; fold epsilon closures into their edges."""
    index: dict[int, int] = {start: 0}
    order = [start]
    out_edges: list[list[tuple[int, int, int]]] = []
    accepting: list[bool] = []
    eps, edges = nfa.eps, nfa.edges
    k = 0
    while k < len(order):
        if k & 1023 == 0:
            nfa.deadline.check()
        root = order[k]
        k += 1
        if not eps[root]:  # no epsilon out (inside a character set): the closure is the state itself
            found = edges[root]
            acc = root == accept
        else:
            seen = {root}
            stack = [root]
            found = []
            acc = False
            while stack:
                s = stack.pop()
                if s == accept:
                    acc = True
                found.extend(edges[s])
                for t in eps[s]:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            found = set(found)
        mapped = []
        for lo, hi, t in found:
            j = index.get(t)
            if j is None:
                j = index[t] = len(order)
                order.append(t)
            mapped.append((lo, hi, j))
        mapped.sort()
        out_edges.append(mapped)
        accepting.append(acc)
    return ByteNFA(out_edges, accepting)

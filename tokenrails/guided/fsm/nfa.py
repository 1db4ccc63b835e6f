"""Thompson NFA over bytes, then epsilon elimination.

Character sets become small byte DAGs (UTF-8 sequences with shared suffixes, as RE2 does), so
even Unicode ``\\w`` stays a few hundred states. The epsilon-free form keeps only the start and
the targets of byte edges ("important" states); the DFA is built over sets of those.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

from ..errors import GuideLimitError, GuideTimeoutError
from .charset import Ranges
from .regex_ast import Alt, CharSet, Concat, Empty, Node, Repeat
from .utf8 import ByteSeq, utf8_sequences


class Deadline:
    """Wall-clock budget for one compile; ``check()`` raises ``GuideTimeoutError`` past it."""

    __slots__ = ("limit_s", "end")

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.end = time.perf_counter() + limit_s

    def check(self) -> None:
        if time.perf_counter() > self.end:
            raise self.error()

    def remaining(self) -> float:
        """Seconds left (may be negative): the budget handed to native code."""
        return self.end - time.perf_counter()

    def error(self) -> GuideTimeoutError:
        return GuideTimeoutError(
            f"limit compile_timeout_s={self.limit_s} exceeded while compiling the automaton",
            limit="compile_timeout_s",
            value=self.limit_s,
        )


def nfa_limit_error(max_states: int, value: int) -> GuideLimitError:
    return GuideLimitError(
        f"limit max_dfa_states exceeded: the pattern expands to more than {max_states} "
        "automaton states (large repetition counts?)",
        limit="max_dfa_states",
        value=value,
    )


@lru_cache(maxsize=256)
def _sequences(ranges: Ranges) -> tuple[ByteSeq, ...]:
    return tuple(utf8_sequences(ranges))


class ThompsonNFA:
    """States with epsilon lists and byte-range edges ``(lo, hi, target)``."""

    def __init__(self, max_states: int, deadline: Deadline):
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
        size, edges, final = _charset_fragment(ranges)
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


@lru_cache(maxsize=512)
def _charset_fragment(ranges: Ranges) -> tuple[int, tuple[tuple[int, int, int, int], ...], int]:
    """Minimal DFA of one character set as ``(num_states, edges (src, lo, hi, dst), final)``."""
    from .dfa import DEAD, START, determinize_raw

    if ranges and ranges[-1][1] <= 0x7F:  # ASCII: one byte per character, already deterministic
        return 2, tuple((0, lo, hi, 1) for lo, hi in ranges), 1
    scratch = ThompsonNFA(1 << 30, Deadline(1e9))
    start, end = scratch.raw_charset(ranges)
    if not any(scratch.edges[start]):
        return 2, (), 1
    trans, accepting, classmap = determinize_raw(eliminate_epsilons(scratch, start, end))
    k = len(trans[0])
    class_lo = [0] * k
    class_hi = [0] * k
    for b in range(255, -1, -1):
        class_lo[classmap[b]] = b
    for b in range(256):
        class_hi[classmap[b]] = b
    finals = [s for s in range(len(trans)) if accepting[s]]
    assert len(finals) == 1, "a character set has exactly one accepting state"
    edges = []
    for s in range(START, len(trans)):
        row = trans[s]
        c = 0
        while c < k:
            t = row[c]
            e = c
            while e + 1 < k and row[e + 1] == t:
                e += 1
            if t != DEAD:
                edges.append((s - 1, class_lo[c], class_hi[e], t - 1))
            c = e + 1
    return len(trans) - 1, tuple(edges), finals[0] - 1


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


# node kinds of the flattened AST handed to tokenrails._dfa_native.compile_ast
FLAT_SET, FLAT_CONCAT, FLAT_ALT, FLAT_REPEAT, FLAT_EMPTY = 0, 1, 2, 3, 4


def flatten_ast(node: Node) -> tuple[list[int], list[tuple]]:
    """Pre-order program of ``node`` plus the charset fragments it references (by index).

    CharSet ``[0, fragment]``, Concat ``[1, n, items...]``, Alt ``[2, n, items...]``, Repeat
    ``[3, min, max or -1, item]``, Empty ``[4]``; fragments are ``_charset_fragment`` results, so the
    C Thompson construction copies exactly what ``ThompsonNFA`` would.
    """
    prog: list[int] = []
    frags: list[tuple] = []
    ids: dict[Ranges, int] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        t = type(n)
        if t is CharSet:
            fid = ids.get(n.ranges)
            if fid is None:
                fid = ids[n.ranges] = len(frags)
                frags.append(_charset_fragment(n.ranges))
            prog += (FLAT_SET, fid)
        elif t is Concat or t is Alt:
            prog += (FLAT_CONCAT if t is Concat else FLAT_ALT, len(n.items))
            stack.extend(reversed(n.items))
        elif t is Repeat:
            prog += (FLAT_REPEAT, n.min, -1 if n.max is None else n.max)
            stack.append(n.item)
        elif t is Empty:
            prog.append(FLAT_EMPTY)
        else:
            raise TypeError(f"unexpected AST node {n!r}")
    return prog, frags


def build_thompson(node: Node, max_states: int, deadline: Deadline) -> tuple[ThompsonNFA, int, int]:
    """The Thompson NFA of ``node`` with its start and accepting state."""
    nfa = ThompsonNFA(max_states, deadline)
    start, accept = nfa.build(node)
    return nfa, start, accept


def build_nfa(node: Node, max_states: int, deadline: Deadline) -> ByteNFA:
    nfa, start, accept = build_thompson(node, max_states, deadline)
    return eliminate_epsilons(nfa, start, accept)

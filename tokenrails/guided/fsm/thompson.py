"""Thompson construction of a regex AST: the cached minimal DFA of every character set, the NFA
built in Python (the fallback path), and the flattened AST the C builder consumes (``flatten_ast``,
the Python reference of the walk ``_dfa_native.compile_tree`` does in C).

The pattern is parsed once, by ``regex_parser``; both builders start from its AST.
"""
from __future__ import annotations

from functools import lru_cache

from .charset import Ranges
from .deadline import Deadline
from .dfa import DEAD, START
from .native_builder import determinize
from .nfa import ByteNFA, Fragment, ThompsonNFA, eliminate_epsilons
from .regex_ast import Alt, CharSet, Concat, Empty, Node, Repeat


@lru_cache(maxsize=512)
def charset_fragment(ranges: Ranges) -> Fragment:
    """Minimal DFA of one character set as ``(num_states, edges (src, lo, hi, dst), final)``."""
    if ranges and ranges[-1][1] <= 0x7F:  # ASCII: one byte per character, already deterministic
        return 2, tuple((0, lo, hi, 1) for lo, hi in ranges), 1
    scratch = ThompsonNFA(1 << 30, Deadline(1e9))
    start, end = scratch.raw_charset(ranges)
    if not any(scratch.edges[start]):
        return 2, (), 1
    fragment_dfa = determinize(eliminate_epsilons(scratch, start, end), 1 << 30, Deadline(1e9))
    trans, accepting, classmap = fragment_dfa.rows, fragment_dfa.accepting_list, fragment_dfa.cls
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


# node types, in the order tokenrails._dfa_native.compile_tree takes them
AST_TYPES = (CharSet, Concat, Alt, Repeat, Empty)
# node kinds of the flattened AST handed to tokenrails._dfa_native.compile_ast
FLAT_SET, FLAT_CONCAT, FLAT_ALT, FLAT_REPEAT, FLAT_EMPTY = 0, 1, 2, 3, 4


def flatten_ast(node: Node) -> tuple[list[int], list[tuple]]:
    """Pre-order program of ``node`` plus the charset fragments it references (by index).

    CharSet ``[0, fragment]``, Concat ``[1, n, items...]``, Alt ``[2, n, items...]``, Repeat
    ``[3, min, max or -1, item]``, Empty ``[4]``; fragments are ``charset_fragment`` results, so the
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
                frags.append(charset_fragment(n.ranges))
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
    nfa = ThompsonNFA(max_states, deadline, charset_fragment)
    start, accept = nfa.build(node)
    return nfa, start, accept


def build_nfa(node: Node, max_states: int, deadline: Deadline) -> ByteNFA:
    nfa, start, accept = build_thompson(node, max_states, deadline)
    return eliminate_epsilons(nfa, start, accept)

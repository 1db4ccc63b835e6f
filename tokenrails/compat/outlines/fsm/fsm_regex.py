"""An interegular FSM (what outlines 0.x's ``generate.fsm`` takes) as a regex, by state elimination.

tokenrails compiles regexes, not hand-built automata, so ``generate.fsm(model, fsm)`` turns the
automaton back into a regex over its own alphabet (``anything_else`` becomes the complement of the
listed symbols) and compiles that: the language is the FSM's, exactly. Elimination can grow the
regex quickly, so automata above ``MAX_STATES`` states or a regex above ``MAX_REGEX_CHARS`` are
refused with an ``UnsupportedGuideError`` instead of compiling something huge.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional

from .... import UnsupportedGuideError

MAX_STATES = 256
MAX_REGEX_CHARS = 200_000

_CLASS_SPECIAL = set("\\]^-[")
_OUTSIDE_SPECIAL = set("\\.^$|?*+()[]{}")


def _escape_in_class(symbol: str) -> str:
    return "\\" + symbol if symbol in _CLASS_SPECIAL else symbol


def _escape(symbol: str) -> str:
    return "\\" + symbol if symbol in _OUTSIDE_SPECIAL else symbol


def _symbol_classes(fsm: Any) -> Dict[Hashable, str]:
    """Transition id → a regex matching exactly its symbols."""
    from interegular.fsm import anything_else

    by_transition = fsm.alphabet.by_transition
    listed = sorted(s for symbols in by_transition.values() for s in symbols if s is not anything_else)
    classes: Dict[Hashable, str] = {}
    for tid, symbols in by_transition.items():
        if any(s is anything_else for s in symbols):  # every symbol not listed under another id
            others = [s for s in listed if s not in symbols]
            classes[tid] = "[^" + "".join(_escape_in_class(s) for s in others) + "]" if others else "(?:.|\\n)"
        elif len(symbols) == 1:
            classes[tid] = _escape(symbols[0])
        else:
            classes[tid] = "[" + "".join(_escape_in_class(s) for s in sorted(symbols)) + "]"
    return classes


def _union(a: Optional[str], b: Optional[str]) -> Optional[str]:
    if a is None:
        return b
    if b is None or a == b:
        return a
    return f"(?:{a}|{b})"


def _concat(*parts: Optional[str]) -> Optional[str]:
    if any(p is None for p in parts):
        return None
    return "".join(parts)  # type: ignore[arg-type]


def _star(a: Optional[str]) -> str:
    return "" if a is None or a == "" else f"(?:{a})*"


def fsm_to_regex(fsm: Any) -> str:
    """A regex whose language is the (interegular) FSM's."""
    states: List[Hashable] = list(fsm.states)
    if len(states) > MAX_STATES:
        raise UnsupportedGuideError(f"FSM has {len(states)} states; at most {MAX_STATES} are converted",
                                    feature="interegular FSM")
    classes = _symbol_classes(fsm)
    start, end = object(), object()
    edges: Dict[Hashable, Dict[Hashable, Optional[str]]] = {s: {} for s in [*states, start, end]}
    edges[start][fsm.initial] = ""
    for state in fsm.finals:
        edges[state][end] = ""
    for state, transitions in fsm.map.items():
        for tid, target in transitions.items():
            edges[state][target] = _union(edges[state].get(target), classes[tid])
    remaining = list(states)
    while remaining:
        # eliminate the state with the fewest paths through it (keeps the regex small)
        def cost(k: Hashable) -> int:
            incoming = sum(1 for s in edges if s is not k and k in edges[s])
            return incoming * len([t for t in edges[k] if t is not k])

        k = min(remaining, key=cost)
        remaining.remove(k)
        loop = _star(edges[k].get(k))
        outgoing = {t: r for t, r in edges[k].items() if t is not k}
        for source in list(edges):
            if source is k or k not in edges[source]:
                continue
            into = edges[source].pop(k)
            for target, out in outgoing.items():
                edges[source][target] = _union(edges[source].get(target), _concat(into, loop, out))
                if len(edges[source][target] or "") > MAX_REGEX_CHARS:
                    raise UnsupportedGuideError("FSM's regex grows past the conversion limit",
                                                feature="interegular FSM")
        del edges[k]
    regex = edges[start].get(end)
    if regex is None:
        raise UnsupportedGuideError("FSM accepts no string", feature="interegular FSM")
    return regex

"""outlines' own state numbers for a regex guide's automaton states.

outlines 0.0.x / 0.1.x numbered a regex guide's states by labelling interegular's byte-level
automaton (:func:`.regex.make_deterministic_fsm`), and code written against it stores, compares
and resumes from those numbers. For small regexes the shim reproduces them: it builds outlines'
automaton for the same regex and walks it in step with tokenrails' DFA, byte by byte; each DFA
state takes the label of the outlines state it meets (mid-character states that outlines merges
get fresh numbers: tokenrails admits only well-formed UTF-8). Any disagreement between the two automata
(a dialect difference, a construct interegular lacks) means no labels: the guide then numbers
states in the order it meets them, as before. Bounded by ``MAX_REGEX_CHARS`` / ``MAX_STATES`` so
large guides never pay interegular's cost.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

MAX_REGEX_CHARS = 1_000
MAX_STATES = 512
_DEAD, _START = 0, 1  # tokenrails DFA conventions (guided.fsm.dfa)


def outlines_labels(regex: str, dfa: Any) -> Optional[Dict[int, int]]:
    """tokenrails DFA state → outlines' label, or None when they cannot be matched up."""
    if len(regex) > MAX_REGEX_CHARS or dfa.num_states > MAX_STATES:
        return None
    try:
        import interegular

        from .regex import byte_symbol, make_byte_level_fsm, make_deterministic_fsm

        theirs, _ = make_deterministic_fsm(
            make_byte_level_fsm(interegular.parse_pattern(regex).to_fsm().reduce(), keep_utf8=True))
    except Exception:  # noqa: BLE001 - interegular rejects or cannot build it: keep our numbering
        return None
    if len(theirs.states) > 4 * MAX_STATES:
        return None
    # dense tables: ours[state] over the 256 bytes, theirs[label] over the 256 bytes (-1: none)
    ours_by_byte = np.asarray(dfa.trans)[:, np.asarray(dfa.cls, dtype=np.int64)]
    keys = np.asarray([theirs.alphabet[byte_symbol(b)] for b in range(256)], dtype=np.int64)
    n_labels = max(theirs.states) + 1
    theirs_by_key = np.full((n_labels, int(max([int(keys.max())] + [k for _, k in theirs.flat_transition_map])) + 1),
                            -1, dtype=np.int64)
    for (label, key), target in theirs.flat_transition_map.items():
        theirs_by_key[label, key] = target
    theirs_by_byte = theirs_by_key[:, keys]
    finals = np.zeros(n_labels, dtype=bool)
    finals[list(theirs.finals)] = True
    accepting = np.asarray(dfa.accepting_list, dtype=bool)

    labels = {_START: theirs.initial}
    seen = {(_START, theirs.initial)}
    queue = [(_START, theirs.initial)]
    while queue:  # breadth-first over pairs: every pair must agree, the first pair names the state
        ours, label = queue.pop(0)
        if accepting[ours] != finals[label]:
            return None
        ours_next = ours_by_byte[ours]
        live = ours_next != _DEAD  # outlines also admits some ill-formed UTF-8; ours never does
        theirs_next = theirs_by_byte[label]
        if (theirs_next[live] < 0).any():
            return None  # tokenrails reads on where outlines stops: not the same language
        for nxt, other in set(zip(ours_next[live].tolist(), theirs_next[live].tolist())):
            labels.setdefault(nxt, other)
            if (nxt, other) not in seen:
                if len(seen) > 4 * MAX_STATES:
                    return None
                seen.add((nxt, other))
                queue.append((nxt, other))
    return _distinct(labels, n_labels)


def _distinct(labels: Dict[int, int], first_free: int) -> Dict[int, int]:
    """One id per DFA state. outlines' automaton admits some ill-formed UTF-8 (any continuation
    byte after any lead byte), so several of tokenrails' stricter mid-character states can meet
    one outlines state; the first met keeps its label, the others get fresh numbers."""
    taken: set = set()
    out: Dict[int, int] = {}
    for ours, label in labels.items():  # breadth-first order
        if label in taken:
            label, first_free = first_free, first_free + 1
        taken.add(label)
        out[ours] = label
    return out

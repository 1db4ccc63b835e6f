r"""outlines' own state numbers for a regex guide's automaton states.

outlines 0.0.x / 0.1.x numbered a regex guide's states by labelling interegular's byte-level
automaton (:func:`.regex.make_deterministic_fsm`), and code written against it stores, compares
and resumes from those numbers (SGLang's jump-forward map is keyed by them). For small regexes the
shim reproduces them: it builds outlines' automaton for the same regex and walks it in step with
tokenrails' DFA, byte by byte, over the bytes both read; each DFA state takes the label of the
outlines state it meets first. States outlines does not have (where the dialects differ, e.g.
Unicode ``\d``) are numbered by the guide as it meets them, and mid-character states that
outlines merges (it admits some ill-formed UTF-8) get fresh numbers: one number always names one
DFA state. A construct interegular cannot read means no labels at all. Bounded by
``MAX_REGEX_CHARS`` / ``MAX_STATES`` so large guides never pay interegular's cost.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

MAX_REGEX_CHARS = 1_000
MAX_STATES = 512


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

    labels = {dfa.START: theirs.initial}
    seen = {(dfa.START, theirs.initial)}
    queue = [(dfa.START, theirs.initial)]
    while queue:  # breadth-first over pairs, bytes in order: the first pair met names the state
        ours, label = queue.pop(0)
        ours_next, theirs_next = ours_by_byte[ours], theirs_by_byte[label]
        # only bytes both read: outlines also admits some ill-formed UTF-8 (tokenrails never does),
        # and where the dialects differ (outlines 0.0's interegular `\d` is ASCII, outlines-core's
        # is Unicode) the states only tokenrails has are numbered by the guide as it meets them
        both = (ours_next != dfa.DEAD) & (theirs_next >= 0)
        for nxt, other in dict.fromkeys(zip(ours_next[both].tolist(), theirs_next[both].tolist())):
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

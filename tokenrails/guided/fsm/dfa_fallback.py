"""The pure-Python DFA builder: the fallback when the C extension is not built, and the oracle the
C builder (csrc/dfa_native/) is tested against, step for step (tests/fsm/test_dfa_native.py).

Subset construction over byte classes with sparse rows, dead-end pruning, Hopcroft minimization
with whole blocks as splitters, canonical numbering; and the minimal DFA of a finite string set
(Revuz). Same ``DFA``, array for array, as the C builder.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidGuideError
from .deadline import Deadline
from .dfa import DEAD, DFA, EMPTY_LANGUAGE, START, state_limit_error
from .nfa import ByteNFA

MINIMIZE_MAX_TRANSITIONS = 300_000  # beyond this many sparse edges Hopcroft (pure Python) is skipped
SMALL_TABLE = 8192  # dense tables up to this many entries are written in Python, larger ones in numpy


def _classes_from_cuts(cuts: set[int]) -> list[int]:
    """Classmap as a list: a new class starts at every cut point (1..255)."""
    out: list[int] = []
    c = 0
    for x in sorted(cuts):
        if 0 < x < 256:
            out += [c] * (x - len(out))
            c += 1
    out += [c] * (256 - len(out))
    return out


# ---- construction over class intervals ------------------------------------------------------
# A row is a list of edges ``(first class, last class, target)``, sorted and disjoint; classes it
# does not cover go to DEAD. JSON regexes have wide edges ([^"\\] spans ~60 of ~70 classes), so
# rows stay a few edges long where a dense row would be K entries: subset construction, pruning
# and minimization all work on these sparse rows, and the dense table is written once at the end.
Edge = tuple[int, int, int]
Row = list[Edge]


def _merge(edges: list[Edge]) -> list[tuple[int, int, tuple[int, ...]]]:
    """Overlapping class intervals → disjoint ones, each with the sorted tuple of its targets."""
    if len(edges) == 1:
        lo, hi, t = edges[0]
        return [(lo, hi, (t,))]
    edges = sorted(edges)
    prev_hi = -1
    for lo, hi, _ in edges:
        if lo <= prev_hi:
            break
        prev_hi = hi
    else:  # already disjoint: the common case (deterministic fragments)
        return [(lo, hi, (t,)) for lo, hi, t in edges]
    events: dict[int, list[tuple[int, int]]] = {}
    for lo, hi, t in edges:
        events.setdefault(lo, []).append((t, 1))
        events.setdefault(hi + 1, []).append((t, -1))
    points = sorted(events)
    active: dict[int, int] = {}
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for i in range(len(points) - 1):
        for t, d in events[points[i]]:
            n = active.get(t, 0) + d
            if n:
                active[t] = n
            else:
                del active[t]
        if active:
            ts = tuple(sorted(active))
            lo, hi = points[i], points[i + 1] - 1
            if out and out[-1][2] == ts and out[-1][1] == lo - 1:
                out[-1] = (out[-1][0], hi, ts)
            else:
                out.append((lo, hi, ts))
    return out


def subset_construction(nfa: ByteNFA, max_states: int, deadline: Deadline) -> tuple[list[Row], list[bool], np.ndarray]:
    """Determinize; returns (sparse rows, accepting flags, classmap). State 0 is dead.

    A DFA state is a sorted tuple of NFA states. Character sets are already deterministic
    fragments, so most DFA states are a single NFA state: those are found by index, not hashing.
    """
    cuts = {lo for es in nfa.edges for lo, _, _ in es}
    cuts.update(hi + 1 for es in nfa.edges for _, hi, _ in es)
    cm = _classes_from_cuts(cuts)
    classmap = np.asarray(cm, dtype=np.int32)
    cedges = [[(cm[lo], cm[hi], t) for lo, hi, t in es] for es in nfa.edges]
    nfa_acc = nfa.accepting
    single: list[int] = [-1] * len(cedges)
    single[0] = START
    ids: dict[tuple[int, ...], int] = {}
    keys: list[tuple[int, ...]] = [(), (0,)]
    rows: list[Row] = [[]]
    accepting = [False]
    j = 1
    while j < len(keys):
        if j & 255 == 0:
            deadline.check()
        key = keys[j]
        if len(key) == 1:
            p = key[0]
            accepting.append(nfa_acc[p])
            es = cedges[p]
            segs = _merge(es) if es else []
        else:
            accepting.append(any(nfa_acc[p] for p in key))
            segs = _merge([e for p in key for e in cedges[p]])
        row: Row = []
        for lo, hi, ts in segs:
            if len(ts) == 1:
                one = ts[0]
                t = single[one]
                if t < 0:
                    t = single[one] = len(keys)
                    keys.append(ts)
                    if len(keys) > max_states:
                        raise state_limit_error(max_states, len(keys))
            else:
                t = ids.get(ts, -1)
                if t < 0:
                    t = ids[ts] = len(keys)
                    keys.append(ts)
                    if len(keys) > max_states:
                        raise state_limit_error(max_states, len(keys))
            row.append((lo, hi, t))
        rows.append(row)
        j += 1
    return rows, accepting, classmap


def prune_dead_ends(rows: list[Row], accepting: list[bool]) -> tuple[list[Row], list[bool]]:
    """Drop every edge into a state that cannot reach acceptance; returns (rows, alive).

    Raises ``InvalidGuideError`` when the start state itself cannot reach acceptance.
    """
    n = len(rows)
    rev: list[list[int]] = [[] for _ in range(n)]
    for s in range(1, n):
        for _, _, t in rows[s]:
            rev[t].append(s)
    alive = [False] * n
    stack = [s for s in range(1, n) if accepting[s]]
    for s in stack:
        alive[s] = True
    while stack:
        for s in rev[stack.pop()]:
            if not alive[s]:
                alive[s] = True
                stack.append(s)
    if not alive[START]:
        raise InvalidGuideError(EMPTY_LANGUAGE)
    if n - 1 - sum(alive):
        rows = [[e for e in row if alive[e[2]]] if alive[s] else [] for s, row in enumerate(rows)]
    return rows, alive


def hopcroft(rows: list[Row], accepting: list[bool], alive: list[bool], deadline: Deadline) -> list[int]:
    """Block id of every state in the coarsest congruence respecting acceptance (Hopcroft).

    Splitters are whole blocks (all classes at once): the signature of a source state is the
    bitmask of classes leading into the splitter, so a wide edge costs one big-int OR, not one
    step per class. Multi-way splits keep the largest part in place and queue the others, which
    keeps Hopcroft's "all but one part" rule and its O(k n log n) bound. Requires pruned rows:
    DEAD and every state that cannot reach acceptance form block 0, which is never a splitter
    (omitting one block of the initial partition is allowed) and never splits.
    """
    n = len(rows)
    inv: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for s in range(1, n):
        row = rows[s]
        if len(row) == 1:
            lo, hi, t = row[0]
            inv[t].append((s, (2 << hi) - (1 << lo)))
        elif row:
            masks: dict[int, int] = {}
            for lo, hi, t in row:
                masks[t] = masks.get(t, 0) | ((2 << hi) - (1 << lo))
            for t, m in masks.items():
                inv[t].append((s, m))
    block_of = [0] * n
    acc = {s for s in range(1, n) if alive[s] and accepting[s]}
    rej = {s for s in range(1, n) if alive[s] and not accepting[s]}
    blocks: list[set[int]] = [set()]
    work: list[int] = []
    for b in (acc, rej):
        if b:
            z = len(blocks)
            blocks.append(b)
            for s in b:
                block_of[s] = z
            work.append(z)
    steps = 0
    while work:
        steps += 1
        if steps & 255 == 0:
            deadline.check()
        sig: dict[int, int] = {}
        for t in blocks[work.pop()]:
            for s, m in inv[t]:
                sig[s] = sig.get(s, 0) | m
        split: dict[int, dict[int, list[int]]] = {}
        for s, m in sig.items():
            y = block_of[s]
            parts = split.get(y)
            if parts is None:
                split[y] = {m: [s]}
            else:
                lst = parts.get(m)
                if lst is None:
                    parts[m] = [s]
                else:
                    lst.append(s)
        for y, parts in split.items():
            members = blocks[y]
            groups = list(parts.values())
            touched = sum(map(len, groups)) if len(groups) > 1 else len(groups[0])
            rest = len(members) - touched
            if len(groups) == 1 and not rest:
                continue
            big = max(groups, key=len)
            if rest >= len(big):  # the untouched remainder stays as y
                new = groups
                for g in groups:
                    members.difference_update(g)
            else:  # the largest touched part stays as y
                new = [g for g in groups if g is not big]
                if rest:
                    remainder = members.difference(*groups)
                    new.append(remainder)
                blocks[y] = set(big)
            for g in new:
                z = len(blocks)
                blocks.append(g if isinstance(g, set) else set(g))
                for s in g:
                    block_of[s] = z
                work.append(z)
    return block_of


def _dense(rows: list[Row], accepting: list[bool], k: int, classmap: np.ndarray, block_of: list[int] | None) -> DFA:
    """Quotient by ``block_of`` (None: identity), renumber (0 dead, 1 start, BFS), densify."""
    if block_of is None:
        block_of = list(range(len(rows)))
    rep: dict[int, int] = {}
    for s in range(len(rows) - 1, 0, -1):
        rep[block_of[s]] = s
    dead_block = block_of[DEAD]
    start_block = block_of[START]
    if start_block == dead_block:
        raise InvalidGuideError(EMPTY_LANGUAGE)
    new_id = {dead_block: DEAD, start_block: START}
    order = [start_block]
    src: list[int] = []
    lo_l: list[int] = []
    cnt_l: list[int] = []
    tgt: list[int] = []
    acc: list[bool] = [False]
    for b in order:  # grows while iterating: BFS
        s = rep[b]
        sid = new_id[b]
        acc.append(accepting[s])
        for lo, hi, t in rows[s]:
            tb = block_of[t]
            nt = new_id.get(tb)
            if nt is None:
                nt = new_id[tb] = len(order) + 1
                order.append(tb)
            src.append(sid)
            lo_l.append(lo)
            cnt_l.append(hi - lo + 1)
            tgt.append(nt)
    num = len(order) + 1
    accepting_arr = np.asarray(acc, dtype=bool)
    if num * k <= SMALL_TABLE:  # Python rows, one conversion: numpy's per-call overhead dominates here
        dense = [[DEAD] * k for _ in range(num)]
        for s, lo, c, t in zip(src, lo_l, cnt_l, tgt):
            if c == 1:
                dense[s][lo] = t
            else:
                dense[s][lo:lo + c] = [t] * c
        return DFA(np.array(dense, dtype=np.int32).reshape(num, k), classmap, accepting_arr, dense)
    trans = np.zeros(num * k, dtype=np.int32)
    if src:
        counts = np.asarray(cnt_l, dtype=np.int64)
        total = int(counts.sum())
        first = np.asarray(src, dtype=np.int64) * k + np.asarray(lo_l, dtype=np.int64)
        shift = first - (np.cumsum(counts) - counts)
        trans[np.repeat(shift, counts) + np.arange(total)] = np.repeat(np.asarray(tgt, dtype=np.int32), counts)
    return DFA(trans.reshape(num, k), classmap, accepting_arr)


def minimize(rows: list[Row], accepting: list[bool], classmap: np.ndarray, deadline: Deadline) -> DFA:
    """Prune, minimize and renumber (0 dead, 1 start, BFS order). Raises if nothing matches."""
    rows, alive = prune_dead_ends(rows, accepting)
    k = int(classmap[-1]) + 1
    if sum(map(len, rows)) > MINIMIZE_MAX_TRANSITIONS:  # pruned but unminimized: exact, just larger
        block_of = [s if alive[s] else DEAD for s in range(len(rows))]
    else:
        block_of = hopcroft(rows, accepting, alive, deadline)
    return _dense(rows, accepting, k, classmap, block_of)


def determinize_python(nfa: ByteNFA, max_states: int, deadline: Deadline) -> DFA:
    """Subset construction, pruning and minimization in Python."""
    rows, accepting, classmap = subset_construction(nfa, max_states, deadline)
    return minimize(rows, accepting, classmap, deadline)


def strings_dfa_python(strings: list[bytes], max_states: int, deadline: Deadline) -> DFA:
    """The minimal DFA of a finite set of byte strings, built directly (no NFA, no Hopcroft).

    The trie of the strings is an acyclic DFA in which every node leads to a string end. Its
    minimal DFA is found bottom-up (Revuz): children are created after their parent, so in reverse
    creation order every child's class is known, and a node's class is the register entry of
    (final, [(byte class, child class)]).
    """
    used = set(b"".join(strings))
    cm = _classes_from_cuts(used | {b + 1 for b in used})
    classmap = np.asarray(cm, dtype=np.int32)
    limit = max_states * 4  # the trie shrinks a lot under minimization
    children: list[dict[int, int]] = [{}]
    final = [False]
    for i, s in enumerate(strings):
        if i & 1023 == 0:
            deadline.check()
        node = 0
        for b in s:
            ch = children[node]
            c = cm[b]
            nxt = ch.get(c)
            if nxt is None:
                nxt = ch[c] = len(children)
                children.append({})
                final.append(False)
            node = nxt
        final[node] = True
        if len(children) > limit:
            raise state_limit_error(max_states, len(children))
    n = len(children)
    if not children[0] and not final[0]:
        raise InvalidGuideError(EMPTY_LANGUAGE)
    canon = [0] * n
    register: dict[tuple, int] = {}
    reps: list[int] = []
    for node in range(n - 1, -1, -1):
        if node & 4095 == 0:
            deadline.check()
        ch = children[node]
        if len(ch) == 1:
            (c, t), = ch.items()
            key: tuple = (final[node], c, canon[t])
        else:
            key = (final[node], *sorted((c, canon[t]) for c, t in ch.items()))
        cid = register.get(key)
        if cid is None:
            cid = register[key] = len(reps)
            reps.append(node)
        canon[node] = cid
    # sparse rows, numbered in reverse registration order: the root (registered last) is START
    m = len(reps)
    rows: list[Row] = [[]] + [sorted((c, c, m - canon[t]) for c, t in children[r].items()) for r in reversed(reps)]
    accepting = [False] + [final[r] for r in reversed(reps)]
    k = int(classmap[-1]) + 1
    return _dense(rows, accepting, k, classmap, None)

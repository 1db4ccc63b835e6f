"""Byte DFA: subset construction over byte equivalence classes, then Hopcroft minimization.

Bytes that no edge distinguishes share a class, so tables are ``[states, classes]`` (a JSON regex
has ~30 classes, not 256). The minimal DFA has one dead state; every other state can still
reach acceptance, which is what makes "token allowed iff the DFA stays alive" exact.
Numbering: 0 = dead, 1 = start, the rest in breadth-first order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import GuideLimitError, InvalidGuideError
from .nfa import ByteNFA, Deadline

DEAD = 0
START = 1
MINIMIZE_MAX_TRANSITIONS = 300_000  # beyond this many live transitions Hopcroft (pure Python) is skipped


@dataclass
class DFA:
    """Minimal complete DFA over byte classes."""

    trans: np.ndarray        # int32 [S, K]
    classmap: np.ndarray     # int32 [256]: byte -> class
    accepting: np.ndarray    # bool [S]
    rows: list[list[int]] = field(init=False, repr=False)   # trans as Python lists (scalar stepping)
    cls: list[int] = field(init=False, repr=False)
    forced: list[int] = field(init=False, repr=False)       # per state: the only live byte, or -1

    def __post_init__(self) -> None:
        self.rows = self.trans.tolist()
        self.cls = self.classmap.tolist()
        self.accepting_list = self.accepting.tolist()
        # forced byte per state: exactly one live class, of exactly one byte, and not accepting
        live = self.trans != DEAD
        n_live = live.sum(axis=1)
        only = live.argmax(axis=1)
        class_size = np.bincount(self.classmap, minlength=self.num_classes)
        first_byte = np.full(self.num_classes, -1, dtype=np.int64)
        first_byte[self.classmap[::-1]] = np.arange(255, -1, -1)
        forced = np.where((n_live == 1) & (class_size[only] == 1) & ~self.accepting, first_byte[only], -1)
        forced[DEAD] = -1
        self.forced = forced.tolist()

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.trans.shape[1])

    def walk(self, state: int, data: bytes) -> int:
        """State after feeding ``data`` (DEAD once it dies)."""
        rows, cls = self.rows, self.cls
        for b in data:
            state = rows[state][cls[b]]
            if state == DEAD:
                return DEAD
        return state

    def fullmatch(self, data: bytes) -> bool:
        return self.accepting_list[self.walk(START, data)]

    @property
    def memory_bytes(self) -> int:
        return int(self.trans.nbytes * 4 + self.accepting.nbytes + 2048)


def byte_classes(edge_ranges) -> np.ndarray:
    """Byte → class id such that every ``(lo, hi)`` range is a union of whole classes."""
    marks = np.zeros(257, dtype=np.int32)
    for lo, hi in edge_ranges:
        marks[lo] = 1
        marks[hi + 1] = 1
    marks[0] = 0
    return np.cumsum(marks[:256]).astype(np.int32)


def _limit(max_states: int, n: int) -> GuideLimitError:
    return GuideLimitError(
        f"limit max_dfa_states={max_states} exceeded: the automaton needs more than {max_states} "
        "states (a pattern like (a|b)*a(a|b){n} grows exponentially)",
        limit="max_dfa_states",
        value=n,
    )


def subset_construction(nfa: ByteNFA, max_states: int, deadline: Deadline) -> tuple[list[list[int]], list[bool], np.ndarray]:
    """Determinize; returns (transition rows, accepting flags, classmap). State 0 is dead.

    A DFA state is a sorted tuple of NFA states. Character sets are already deterministic
    fragments, so most DFA states are a single NFA state: those are found by index, not hashing.
    """
    classmap = byte_classes((lo, hi) for es in nfa.edges for lo, hi, _ in es)
    cm = classmap.tolist()
    k = int(classmap[-1]) + 1
    moves: list[list[tuple[int, tuple[int, ...]]]] = []  # per NFA state: (class, sorted targets)
    for es in nfa.edges:
        acc: dict[int, list[int]] = {}
        for lo, hi, t in es:
            for c in range(cm[lo], cm[hi] + 1):
                lst = acc.get(c)
                if lst is None:
                    acc[c] = [t]
                else:
                    lst.append(t)
        moves.append([(c, tuple(sorted(set(ts))) if len(ts) > 1 else (ts[0],)) for c, ts in acc.items()])
    nfa_acc = nfa.accepting

    single: list[int] = [-1] * len(nfa.edges)
    single[0] = START
    ids: dict[tuple[int, ...], int] = {}
    keys: list[tuple[int, ...]] = [(), (0,)]
    rows: list[list[int]] = [[DEAD] * k]
    accepting = [False]
    j = 1
    while j < len(keys):
        if j & 255 == 0:
            deadline.check()
        key = keys[j]
        if len(key) == 1:
            accepting.append(nfa_acc[key[0]])
            targets = moves[key[0]]
        else:
            accepting.append(any(nfa_acc[p] for p in key))
            tmp: dict[int, set[int]] = {}
            for p in key:
                for c, ts in moves[p]:
                    cur = tmp.get(c)
                    if cur is None:
                        tmp[c] = set(ts)
                    else:
                        cur.update(ts)
            targets = [(c, tuple(sorted(ts))) for c, ts in tmp.items()]
        row = [DEAD] * k
        for c, ts in targets:
            if len(ts) == 1:
                one = ts[0]
                t = single[one]
                if t < 0:
                    t = single[one] = len(keys)
                    keys.append(ts)
                    if len(keys) > max_states:
                        raise _limit(max_states, len(keys))
            else:
                t = ids.get(ts, -1)
                if t < 0:
                    t = ids[ts] = len(keys)
                    keys.append(ts)
                    if len(keys) > max_states:
                        raise _limit(max_states, len(keys))
            row[c] = t
        rows.append(row)
        j += 1
    return rows, accepting, classmap


def prune_dead_ends(rows: list[list[int]], accepting: list[bool]) -> list[list[int]]:
    """Redirect every transition into a state that cannot reach acceptance to DEAD.

    Raises ``InvalidGuideError`` when the start state itself cannot reach acceptance.
    """
    trans = np.asarray(rows, dtype=np.int64)
    n, k = trans.shape
    src = np.repeat(np.arange(n), k)
    dst = trans.reshape(-1)
    keep = dst != DEAD
    src, dst = src[keep], dst[keep]
    order = np.argsort(dst, kind="stable")
    src_sorted = src[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    alive = np.zeros(n, dtype=bool)
    frontier = np.flatnonzero(np.asarray(accepting, dtype=bool))
    alive[frontier] = True
    while frontier.size:
        starts, ends = ptr[frontier], ptr[frontier + 1]
        counts = ends - starts
        if not counts.sum():
            break
        idx = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts) + np.arange(counts.sum())
        preds = np.unique(src_sorted[idx])
        frontier = preds[~alive[preds]]
        alive[frontier] = True
    alive[DEAD] = False
    if not alive[START]:
        raise InvalidGuideError("the pattern matches no string (its language is empty)")
    if alive[1:].all():
        return rows
    trans[~alive[trans]] = DEAD
    trans[~alive] = DEAD
    return trans.tolist()


def hopcroft(rows: list[list[int]], accepting: list[bool], deadline: Deadline) -> list[int]:
    """Block id of every state in the coarsest partition compatible with the transitions.

    Requires every non-dead state to reach acceptance (``prune_dead_ends``): then DEAD is a
    singleton block that never splits, so it is never a splitter and edges into it are ignored.
    """
    n = len(rows)
    inv: list[dict[int, list[int]]] = [{} for _ in range(n)]  # target -> class -> sources
    for s, row in enumerate(rows):
        if s == DEAD:
            continue
        for c, t in enumerate(row):
            if t != DEAD:
                d = inv[t]
                lst = d.get(c)
                if lst is None:
                    d[c] = [s]
                else:
                    lst.append(s)
    acc_set = {s for s in range(1, n) if accepting[s]}
    rej_set = set(range(1, n)) - acc_set
    blocks: list[set[int]] = [{DEAD}] + [b for b in (acc_set, rej_set) if b]
    block_of = [0] * n
    for b, members in enumerate(blocks):
        for s in members:
            block_of[s] = b
    in_work = [False] + [True] * (len(blocks) - 1)
    work = list(range(1, len(blocks)))
    steps = 0
    while work:
        a = work.pop()
        in_work[a] = False
        by_class: dict[int, list[int]] = {}
        for t in blocks[a]:
            for c, lst in inv[t].items():
                cur = by_class.get(c)
                if cur is None:
                    by_class[c] = list(lst)
                else:
                    cur.extend(lst)
        for sources in by_class.values():
            hit: dict[int, list[int]] = {}
            for s in sources:
                y = block_of[s]
                h = hit.get(y)
                if h is None:
                    hit[y] = [s]
                else:
                    h.append(s)
            for y, members in hit.items():
                ys = blocks[y]
                if len(members) == len(ys):
                    continue
                z = len(blocks)
                ys.difference_update(members)
                blocks.append(set(members))
                for s in members:
                    block_of[s] = z
                if in_work[y]:
                    in_work.append(True)
                    work.append(z)
                elif len(members) <= len(ys):
                    in_work.append(True)
                    work.append(z)
                else:
                    in_work.append(False)
                    in_work[y] = True
                    work.append(y)
        steps += 1
        if steps & 255 == 0:
            deadline.check()
    return block_of


def refine(rows: list[list[int]], accepting: list[bool], deadline: Deadline) -> list[int] | None:
    """Moore partition refinement, vectorized: block signatures hashed with random 64-bit weights.

    Much faster than pure-Python Hopcroft when there are many byte classes. A hash collision could
    only merge states wrongly, so the result is verified to be a congruence that respects
    acceptance (which makes the quotient DFA exactly equivalent); None if verification fails.
    """
    trans = np.asarray(rows, dtype=np.int64)
    n, k = trans.shape
    acc = np.asarray(accepting, dtype=bool)
    block = acc.astype(np.int64)
    block[DEAD] = 2  # every non-dead state can reach acceptance: DEAD is alone
    weights = np.random.default_rng(0x5EED).integers(1, 2**62, size=k + 1, dtype=np.int64).astype(np.uint64) | np.uint64(1)
    count = len(np.unique(block))
    while True:
        deadline.check()
        with np.errstate(over="ignore"):
            sig = (block[trans].astype(np.uint64) * weights[1:]).sum(axis=1, dtype=np.uint64)
            sig += block.astype(np.uint64) * weights[0]
        _, block = np.unique(sig, return_inverse=True)
        block = block.reshape(-1).astype(np.int64)
        new_count = int(block.max()) + 1
        if new_count == count:
            break
        count = new_count
    rep = np.full(count, -1, dtype=np.int64)
    rep[block[::-1]] = np.arange(n - 1, -1, -1)  # first state of each block
    ok = (block[trans] == block[trans[rep[block]]]).all() and (acc == acc[rep[block]]).all()
    ok = ok and int((block == block[DEAD]).sum()) == 1
    return block.tolist() if ok else None


def minimize(rows: list[list[int]], accepting: list[bool], classmap: np.ndarray, deadline: Deadline) -> DFA:
    """Minimize and renumber (0 dead, 1 start, BFS order). Raises if nothing matches."""
    rows = prune_dead_ends(rows, accepting)
    block_of = refine(rows, accepting, deadline)
    if block_of is None:
        live = sum(1 for row in rows for t in row if t != DEAD)
        if live <= MINIMIZE_MAX_TRANSITIONS:
            block_of = hopcroft(rows, accepting, deadline)
        else:  # pruned but unminimized: still exact, just more states than necessary
            block_of = list(range(len(rows)))
    dead_block = block_of[DEAD]
    start_block = block_of[START]
    if start_block == dead_block:
        raise InvalidGuideError("the pattern matches no string (its language is empty)")
    block = np.asarray(block_of, dtype=np.int64)
    nblocks = int(block.max()) + 1
    rep = np.full(nblocks, -1, dtype=np.int64)
    rep[block[::-1]] = np.arange(len(block) - 1, -1, -1)
    quotient = block[np.asarray(rows, dtype=np.int64)[rep]]  # [blocks, K] target blocks
    new_id = np.full(nblocks, -1, dtype=np.int64)
    new_id[dead_block] = DEAD
    new_id[start_block] = START
    order = [start_block]
    nxt = 2
    head = 0
    qrows = quotient.tolist()
    while head < len(order):
        b = order[head]
        head += 1
        for tb in qrows[b]:
            if new_id[tb] < 0:
                new_id[tb] = nxt
                nxt += 1
                order.append(tb)
    keep = np.flatnonzero(new_id >= 0)
    trans = np.zeros((nxt, quotient.shape[1]), dtype=np.int32)
    trans[new_id[keep]] = new_id[quotient[keep]]
    acc = np.zeros(nxt, dtype=bool)
    acc[new_id[keep]] = np.asarray(accepting, dtype=bool)[rep[keep]]
    return DFA(trans, classmap, acc)


def determinize_raw(nfa: ByteNFA) -> tuple[list[list[int]], list[bool], list[int]]:
    """Minimal DFA as plain lists (no limits): used for small cached fragments."""
    unlimited = Deadline(1e9)
    d = determinize(nfa, 1 << 30, unlimited)
    return d.rows, d.accepting_list, d.cls


def determinize(nfa: ByteNFA, max_states: int, deadline: Deadline) -> DFA:
    rows, accepting, classmap = subset_construction(nfa, max_states, deadline)
    return minimize(rows, accepting, classmap, deadline)


def dfa_from_strings(strings: list[bytes], max_states: int, deadline: Deadline) -> DFA:
    """The minimal DFA of a finite set of byte strings, built from their trie (no NFA needed)."""
    used = sorted({b for s in strings for b in s})
    classmap = byte_classes((b, b) for b in used)
    cm = classmap.tolist()
    k = int(classmap[-1]) + 1
    rows: list[list[int]] = [[DEAD] * k, [DEAD] * k]
    accepting = [False, False]
    for i, s in enumerate(strings):
        if i & 1023 == 0:
            deadline.check()
        state = START
        for b in s:
            c = cm[b]
            nxt = rows[state][c]
            if nxt == DEAD:
                nxt = len(rows)
                rows.append([DEAD] * k)
                accepting.append(False)
                rows[state][c] = nxt
                if len(rows) > max_states * 4:  # the trie shrinks a lot under minimization
                    raise _limit(max_states, len(rows))
            state = nxt
        accepting[state] = True
    return minimize(rows, accepting, classmap, deadline)

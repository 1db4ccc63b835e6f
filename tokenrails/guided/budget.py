"""The budget rule: structured output that completes within ``max_new_tokens``.

A request that asks for it (``budget="close"``) gets, at each step, the grammar's mask
intersected with the tokens after which the output can still be completed in the steps left:
with ``R`` steps left, token ``t`` is allowed in DFA state ``s`` iff the grammar allows it and
either ``t`` is EOS in an accepting state or ``D(s·t) <= R - 1``, ``D(q)`` being the fewest tokens
(the final EOS included) that complete the output from ``q``. ``D`` is exact: a breadth-first
search over the token graph the matcher allows, computed once per compiled guide (in the C walker;
numpy without it) and cached with it. When every allowed token fits, the mask is exactly the
grammar's (greedy output is byte-identical to plain guided decoding); a sequence whose
``D(start)`` exceeds the budget is refused up front (``GuideLimitError(limit="max_tokens")``).

Exact only where the constraint is a DFA: a spec that asks for the rule is routed to the fsm
backend only (``budget_spec``), and what fsm cannot compile is refused (``UnsupportedGuideError``)
rather than enforced by an estimate that could leave the output unfinished. Thinking tokens count
against the same budget: a free thinking token is allowed only while the end marker and the
shortest answer still fit after it. docs/semantics.md section 4b states the rule in full.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from functools import cached_property
from typing import Sequence

import numpy as np
import torch

from .backend import CompiledGuide, Matcher
from .bitmask import set_only
from .errors import GuideLimitError, UnsupportedGuideError
from .fsm.dfa import DEAD, START
from .fsm.matcher import FSMMatcher
from .limits import GuideLimits
from .reasoning import ReasoningPhase, ReasoningTracker, ThinkState
from .spec import GuideSpec

__all__ = ["BUDGET_KINDS", "Budget", "BudgetTable", "budget_spec", "budget_table", "is_budget_spec"]

BUDGET_OPTION = "budget"
BUDGET_KINDS = frozenset({"regex", "choice", "json_schema"})
INF = 2**31 - 1
# Distinct (state, next state) token edges one table may hold (~4 bytes each, transient).
MAX_EDGES = 1 << 26
ROW_CACHE_BYTES = 8 << 20  # restricted rows kept per guide (~1,300 rows of a 49k vocabulary)
NEEDS_DFA = ("budget closing (budget='close') needs a constraint the fsm backend compiles to a DFA "
             "(a regex, a choice, or a JSON schema its lowering enforces) so that the shortest completion "
             "is exact")

_LOCK = threading.Lock()


def budget_spec(spec: GuideSpec) -> GuideSpec:
    """``spec`` asking for the budget rule: marked (part of the key, so the fsm compile builds the
    table in the compile pool) and routed to the fsm backend only."""
    if spec.kind not in BUDGET_KINDS:
        raise UnsupportedGuideError(f"{NEEDS_DFA}; got a {spec.kind} constraint", feature=spec.kind,
                                    backend="fsm")
    opts = dict(spec.options)
    opts[BUDGET_OPTION] = "close"
    marked = GuideSpec(spec.kind, spec.payload, tuple(sorted(opts.items())))
    return marked.with_routing("fsm", fallback=False)


def is_budget_spec(spec: GuideSpec) -> bool:
    return spec.option(BUDGET_OPTION) == "close"


class BudgetTable:
    """Per DFA state: ``dist`` (fewest tokens to finish, EOS included; ``INF``: never) and
    ``maxnext`` (the largest ``dist`` an allowed token leads to); both read-only. Plus the rows
    the rule restricted (keyed by state and bound; a bounded LRU shared by the guide's
    sequences, so a tight step another sequence already took is one row copy, not a trie walk)."""

    def __init__(self, dist: np.ndarray, maxnext: np.ndarray, edges: int, row_bytes: int = ROW_CACHE_BYTES):
        self.dist = dist
        self.maxnext = maxnext
        self.edges = edges
        self._rows: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self._row_bytes = 0
        self._row_budget = row_bytes
        self._lock = threading.Lock()

    @property
    def start(self) -> int:
        return int(self.dist[START])

    @cached_property
    def maxnext_list(self) -> list[int]:
        return self.maxnext.tolist()

    @property
    def memory_bytes(self) -> int:
        return int(self.dist.nbytes + self.maxnext.nbytes + self._row_bytes)

    def cached_row(self, state: int, bound: int) -> torch.Tensor | None:
        key = (state, bound)
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
            return row

    def clear_rows(self) -> None:
        """Forget the restricted rows (benchmarks measuring first visits)."""
        with self._lock:
            self._rows.clear()
            self._row_bytes = 0

    def store_row(self, state: int, bound: int, row: torch.Tensor) -> None:
        size = row.numel() * 4
        if size > self._row_budget:
            return
        with self._lock:
            if (state, bound) in self._rows:
                return
            self._rows[(state, bound)] = row
            self._row_bytes += size
            while self._row_bytes > self._row_budget:
                _, old = self._rows.popitem(last=False)
                self._row_bytes -= old.numel() * 4


def budget_table(guide: CompiledGuide, limits: GuideLimits | None = None) -> BudgetTable:
    """The guide's table, computed on first use and cached on the guide (raises
    ``UnsupportedGuideError`` for a non-DFA guide, ``GuideLimitError`` past the edge bound)."""
    table = guide.__dict__.get("_budget_table")
    if table is not None:
        return table
    if guide.backend != "fsm":
        raise UnsupportedGuideError(f"{NEEDS_DFA}; this one was compiled by {guide.backend}",
                                    feature="budget", backend=guide.backend)
    index = guide.index  # type: ignore[attr-defined]
    walker = index.walker
    with _LOCK:
        table = guide.__dict__.get("_budget_table")
        if table is None:
            states = guide.dfa.num_states  # type: ignore[attr-defined]
            if limits is not None:
                limits.check("max_budget_states", states)
            dist = np.empty(states, dtype=np.int32)
            maxnext = np.empty(states, dtype=np.int32)
            try:
                if walker is not None:
                    edges = walker.budget_table(dist, maxnext, MAX_EDGES)
                else:
                    edges = _numpy_table(index, guide.dfa.accepting, dist, maxnext)  # type: ignore[attr-defined]
            except OverflowError as exc:
                raise GuideLimitError(f"the budget table is too large: {exc}", limit="budget_edges",
                                      value=MAX_EDGES) from None
            dist.setflags(write=False)
            maxnext.setflags(write=False)
            table = BudgetTable(dist, maxnext, int(edges))
            guide.__dict__["_budget_table"] = table
    return table


def _numpy_table(index, accepting: np.ndarray, dist: np.ndarray, maxnext: np.ndarray) -> int:
    """The native ``budget_table`` in numpy (``TOKENRAILS_NATIVE=0``, or no C compiler): the same
    graph from ``TokenIndex.end_states``, the same backward breadth-first search."""
    states = dist.shape[0]
    succ = [np.zeros(0, dtype=np.int64)] * states
    edges = 0
    for s in range(1, states):
        ends = index.end_states(s)
        succ[s] = np.unique(ends[ends != DEAD])
        edges += succ[s].size
        if edges > MAX_EDGES:
            raise OverflowError(f"more than {MAX_EDGES} token edges between DFA states")
    preds: list[list[int]] = [[] for _ in range(states)]
    for s in range(1, states):
        for t in succ[s].tolist():
            preds[t].append(s)
    dist[:] = INF
    queue = [s for s in range(1, states) if accepting[s]]
    dist[queue] = 1
    for u in queue:  # grows while it is read: breadth-first
        for p in preds[u]:
            if dist[p] == INF:
                dist[p] = dist[u] + 1
                queue.append(p)
    maxnext[0] = 0
    for s in range(1, states):
        maxnext[s] = int(dist[succ[s]].max()) if succ[s].size else 0
    return edges


def _marker_costs(tracker: ReasoningTracker) -> tuple[int, ...]:
    """Tokens the end marker takes when forced from each partial position (``forced_token`` then
    ``advance``, as the thinking cap forces it)."""
    costs = []
    for pos in range(len(tracker.marker)):
        think, n = ThinkState(False, pos=pos), 0
        while not think.done:
            tok = tracker.forced_token(think)
            nxt = tracker.advance(ThinkState(False, pos=think.pos, count=0), tok) if tok is not None else None
            if nxt is None or n > len(tracker.marker):
                raise UnsupportedGuideError("the end-of-thinking marker cannot be forced token by token",
                                            feature="budget")
            think, n = nxt, n + 1
        costs.append(n)
    return tuple(costs)


class Budget:
    """One sequence's budget: ``max_tokens`` and the guide's table. The count emitted so far is
    the sequence's (its accepted tokens, thinking included); ``closed`` records whether the rule
    ever removed a token the grammar allowed."""

    def __init__(self, max_tokens: int, guide: CompiledGuide, table: BudgetTable,
                 tracker: ReasoningTracker | None = None):
        self.max_tokens = int(max_tokens)
        self.guide = guide
        self.table = table
        self._dist = table.dist
        self._maxnext = table.maxnext_list  # a list: the per-step lookup is the fast path's whole cost
        self._walker = guide.index.walker  # type: ignore[attr-defined]
        self._words = guide.index.words  # type: ignore[attr-defined]
        self.tracker = tracker
        self.marker = _marker_costs(tracker) if tracker is not None else ()
        self.marker_max = max(self.marker) if self.marker else 0
        self.start_len = len(tracker.start) if tracker is not None and tracker.start is not None else 0
        self.closed = False

    # ---- how far from done -----------------------------------------------------------------
    def need(self, matcher: Matcher | ReasoningPhase) -> int:
        """The fewest tokens (EOS included) that complete the output from ``matcher``'s position
        (an upper bound while thinking: the marker forced, then the shortest answer)."""
        answer = self.table.start
        if isinstance(matcher, ReasoningPhase):
            think = matcher.think
            if think.opening:  # answer now (from where the fed prefix stands), or open and think
                opened = (self.start_len - think.pos) + self.marker_max + answer
                inner = matcher.inner
                if not think.answer_ok:
                    return opened
                now = answer if inner is None else (0 if inner.is_terminated() else int(self._dist[inner.state]))
                return min(now, opened)
            if not think.done:
                return self.marker[think.pos] + answer
            if think.gap is not None or matcher.inner is None:
                return answer
            matcher = matcher.inner
        if matcher.is_terminated():
            return 0
        assert isinstance(matcher, FSMMatcher)
        return int(self._dist[matcher.state])

    def check_fits(self, matcher: Matcher | ReasoningPhase) -> None:
        """Refuse up front when even the shortest output cannot fit ``max_tokens``."""
        need = self.need(matcher)
        if need > self.max_tokens:
            what = "the shortest output this constraint allows" if need < INF else "no output"
            raise GuideLimitError(
                f"max_tokens={self.max_tokens} is too small: {what} needs {need if need < INF else 'more'} "
                f"tokens (the final EOS and any end-of-thinking marker included) under this vocabulary",
                limit="max_tokens", value=need,
            )

    # ---- the mask --------------------------------------------------------------------------
    def restrict(self, matcher: Matcher | ReasoningPhase, bitmask: torch.Tensor, j: int, left: int) -> None:
        """Row ``j`` holds the grammar's mask at ``matcher``'s position with ``left`` steps to go:
        intersect it with the budget rule (in place; untouched on the fast path)."""
        if isinstance(matcher, ReasoningPhase):
            self._restrict_thinking(matcher, bitmask, j, left)
            return
        if matcher.is_terminated():
            return
        state = matcher.state  # type: ignore[attr-defined]
        if self._maxnext[state] <= left - 1:
            return
        self._fill_within(state, bitmask, j, left - 1)

    def _restrict_thinking(self, m: ReasoningPhase, bitmask: torch.Tensor, j: int, left: int) -> None:
        think, answer = m.think, self.table.start
        if think.done:
            inner = m.inner
            if inner is None or inner.is_terminated():
                return
            state = inner.state  # type: ignore[attr-defined]
            if self._maxnext[state] <= left - 1 and (think.gap is None or answer <= left - 1):
                return  # (gap whitespace keeps the grammar at its start state)
            self._fill_within(state, bitmask, j, left - 1)
            return
        if not think.opening:  # thinking: a free token only while the marker and answer fit after it
            if left - 1 >= self.marker_max + answer or self.tracker.forcing(think):
                return
            set_only(bitmask[j], self.tracker.forced_token(think))
            self.closed = True
            return
        # undecided optional thinking: the grammar's row (after the fed prefix) or the start marker
        start_ok = left - 1 >= (self.start_len - think.pos - 1) + self.marker_max + answer
        inner = m.inner if think.answer_ok else None
        tight = inner is not None and self._maxnext[inner.state] > left - 1  # type: ignore[attr-defined]
        if start_ok and not tight:
            return
        if inner is not None:
            if tight:
                self._fill_within(inner.state, bitmask, j, left - 1)  # type: ignore[attr-defined]
            else:
                inner.fill_next_token_bitmask(bitmask, j)
        else:
            bitmask[j].zero_()
        if start_ok:
            self.tracker.fill_start(think, bitmask, j, union=True)
        self.closed = True

    def _fill_within(self, state: int, bitmask: torch.Tensor, j: int, bound: int) -> None:
        """Row ``j``: the tokens of ``state`` whose end state finishes within ``bound`` more
        tokens (+ EOS when it accepts): from the guide's cache, else one trie walk."""
        self.closed = True
        table = self.table
        row = table.cached_row(state, bound)
        if row is None:
            row = torch.zeros(self._words, dtype=torch.int32)
            if self._walker is not None:
                self._walker.fill_within(state, self._dist, bound, row.data_ptr(), self._words)
            else:
                row.copy_(self._numpy_row(state, bound))
            table.store_row(state, bound, row)
        width = bitmask.shape[1]
        target = bitmask[j]
        if width == self._words:
            target.copy_(row)
        elif width > self._words:
            target[: self._words].copy_(row)
            target[self._words:].zero_()
        else:
            raise ValueError(f"bitmask row has {width} words; this vocabulary needs {self._words}")

    def _numpy_row(self, state: int, bound: int) -> torch.Tensor:
        """``fill_within`` in numpy: the tokens whose end state finishes within ``bound``."""
        index = self.guide.index  # type: ignore[attr-defined]
        ends = index.end_states(state)
        keep = (ends != DEAD) & (self._dist[ends] <= bound)
        if bound >= 0 and self.guide.dfa.accepting[state]:  # type: ignore[attr-defined]
            keep[list(self.guide.vocab.eos_ids)] = True
        packed = np.packbits(keep, bitorder="little").view("<i4")[: self._words]
        return torch.from_numpy(packed.astype(np.int32))

    # ---- jumps -----------------------------------------------------------------------------
    def jump_fits(self, matcher: Matcher | ReasoningPhase, history: Sequence[int], rollback: int, append: Sequence[int],
                  left: int) -> bool:
        """Whether rolling back ``rollback`` tokens and appending ``append`` leaves the output
        completable in the steps left then (the matcher is restored)."""
        if rollback:
            matcher.rollback(rollback)
        fed, ok = 0, True
        for t in append:
            if not matcher.accept_token(int(t)):
                ok = False
                break
            fed += 1
        need = self.need(matcher) if ok else INF
        if fed:
            matcher.rollback(fed)
        for t in history[len(history) - rollback:] if rollback else ():
            assert matcher.accept_token(int(t)), "re-accepting the sequence's own tokens failed"
        return ok and need <= left + rollback - len(append)

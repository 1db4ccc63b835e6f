"""Integer guide states on top of tokenrails matchers (outlines' functional ``Guide`` protocol).

Outlines guides are pure functions of ``(state, token) -> state`` with int states, ``0`` the
initial state and ``-1`` the final one. Matchers are mutable, so each state id names a token
path; only a bounded number of states keep a live matcher (the most recently used — usually
one per sequence being decoded). A state whose matcher was evicted is rebuilt by replaying its
path, so any old state can still be walked from, exactly. When the matcher exposes its automaton
state (the FSM backend's DFA state), paths reaching the same automaton state share one id, as
outlines' DFA states do: the state space stays as small as the automaton. Given ``labels``
(automaton state → id, e.g. outlines' own numbers from ``outlines_labels``) those ids are used
instead, and any labelled id can be resumed from even if it was never handed out.
"""
from __future__ import annotations

import copy

from collections import OrderedDict
from typing import Callable

import torch

from .... import CompiledGuide, Matcher, allocate_token_bitmask

FINAL = -1


def allowed_token_ids(bitmask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Ids whose bit is set in one int32 bitmask row (xgrammar layout), ascending, int64."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask_row.to(torch.int32).unsqueeze(-1) >> shifts) & 1
    return bits.reshape(-1)[:vocab_size].nonzero().reshape(-1).to(torch.long)


class StateSpace:
    """State ids → token paths, with live matchers for the most recently used states."""

    def __init__(self, compiled: CompiledGuide, max_live: int = 64,
                 labels: Callable[[], dict[int, int] | None] | None = None):
        self.compiled = compiled
        self.vocab = compiled.vocab
        self.max_live = max_live
        self._parent: list[tuple[int, int]] = [(FINAL, FINAL)]  # state 0 = the start
        self._children: dict[tuple[int, int], int] = {}
        self._live: OrderedDict[int, Matcher] = OrderedDict()
        self._accepting: dict[int, bool] = {}
        self._by_automaton: dict[int, int] = {}  # automaton state -> id (matchers that expose one)
        self._row = allocate_token_bitmask(1, self.vocab.vocab_size)
        start = compiled.matcher()
        where = _automaton_state(start)
        self._labelled: dict[int, int] = {}  # id -> automaton state (labels given)
        self._issued: set[int] = {0}
        # labels are read on the first step (only id 0 exists before it): building a guide stays cheap
        self._labels = labels if where is not None and hasattr(start, "seek") else None
        if where is not None:
            self._by_automaton[where] = 0
        self._start_where = where
        self._keep(0, start)

    def copy(self) -> "StateSpace":
        """The same ids → paths so far, its own from here on (live matchers are rebuilt by replay
        when needed: a matcher moves on with its path, so none is shared)."""
        other = copy.copy(self)
        other._parent, other._children = list(self._parent), dict(self._children)
        other._live = OrderedDict()
        other._accepting, other._by_automaton = dict(self._accepting), dict(self._by_automaton)
        other._labelled, other._issued = dict(self._labelled), set(self._issued)
        other._row = allocate_token_bitmask(1, self.vocab.vocab_size)
        return other

    def _read_labels(self) -> None:
        source, self._labels = self._labels, None
        labels = source() if source is not None else None
        if labels and labels.get(self._start_where) == 0:
            self._by_automaton = dict(labels)
            self._labelled = {i: a for a, i in labels.items()}

    def __len__(self) -> int:
        """How many distinct states were handed out (the start included)."""
        return len(self._issued)

    def path(self, state: int) -> list[int]:
        """The tokens from the start to ``state`` (for a labelled guide: from its nearest
        labelled ancestor, see ``_anchor``)."""
        return self._anchor(state)[1]

    def _anchor(self, state: int) -> tuple[int, list[int]]:
        """(the start or the nearest labelled ancestor of ``state``, the tokens from it)."""
        out: list[int] = []
        while state > 0 and state not in self._labelled:
            state, token = self._parent[state]
            out.append(token)
        return state, out[::-1]

    def matcher(self, state: int) -> Matcher:
        """The live matcher positioned at ``state`` (rebuilt by replay if it was evicted)."""
        m = self._live.get(state)
        if m is not None:
            self._live.move_to_end(state)
            return m
        if self._labels is not None:
            self._read_labels()
        m = self.compiled.matcher()
        anchor, tokens = self._anchor(state)
        if anchor in self._labelled:
            m.seek(self._labelled[anchor])  # type: ignore[attr-defined]
        for token in tokens:
            if not m.accept_token(token):  # pragma: no cover - paths only hold accepted tokens
                raise RuntimeError(f"replay of guide state {state} failed at token {token}")
        self._keep(state, m)
        return m

    def _keep(self, state: int, m: Matcher) -> None:
        self._live[state] = m
        self._live.move_to_end(state)
        while len(self._live) > self.max_live:
            self._live.popitem(last=False)

    def advance(self, state: int, token: int) -> int:
        """outlines' ``get_next_state``: EOS, a forbidden token or the final state give ``-1``."""
        if self._labels is not None:
            self._read_labels()
        if state < 0 or (state >= len(self._parent) and state not in self._labelled):
            return FINAL
        key = (state, token)
        hit = self._children.get(key)
        if hit is not None:
            return hit
        vocab = self.vocab
        if token in vocab.eos_ids or token in vocab.special_ids or not 0 <= token < vocab.num_tokens:
            nxt = FINAL
        else:
            m = self.matcher(state)
            if m.accept_token(token):
                self._live.pop(state, None)  # the matcher moves on with the path
                where = _automaton_state(m)
                nxt = self._by_automaton.get(where, -1) if where is not None else -1
                if nxt < 0:
                    while len(self._parent) in self._labelled:  # path ids skip the labels
                        self._parent.append((FINAL, FINAL))
                    nxt = len(self._parent)
                    self._parent.append((state, token))
                    if where is not None:
                        self._by_automaton[where] = nxt
                if nxt not in self._live:
                    self._keep(nxt, m)
            else:
                nxt = FINAL
        self._children[key] = nxt
        if nxt >= 0:
            self._issued.add(nxt)
        return nxt

    def is_accepting(self, state: int) -> bool:
        """Whether the text so far is complete (EOS allowed now); ``-1`` is always final."""
        if state < 0:
            return True
        hit = self._accepting.get(state)
        if hit is None:
            hit = self._accepting[state] = bool(self.matcher(state).is_accepting())
        return hit

    def fill(self, state: int, bitmask: torch.Tensor, row: int) -> None:
        """Allowed tokens of ``state`` into ``bitmask[row]``; the final state allows only EOS."""
        if state < 0:
            bitmask[row].zero_()
            for e in self.vocab.eos_ids:
                bitmask[row, e // 32] |= _bit(e % 32)
            return
        self.matcher(state).fill_next_token_bitmask(bitmask, row)

    def allowed(self, state: int) -> torch.Tensor:
        self.fill(state, self._row, 0)
        return allowed_token_ids(self._row[0], self.vocab.vocab_size)

    def token_maps(self, max_states: int = 1_000, max_transitions: int = 200_000) -> dict[int, dict[int, int]]:
        """outlines' ``states_to_token_maps``: ``{state: {token: next state}}`` over every state
        reachable from the start (EOS left out; states without transitions absent), numbered in
        breadth-first order over ascending token ids. Only finite automata can be listed: a state
        space that keeps growing (matchers without automaton states) past ``max_states`` or
        ``max_transitions`` raises ``NotImplementedError``."""
        out: dict[int, dict[int, int]] = {}
        queue, seen, transitions = [0], {0}, 0
        eos = set(self.vocab.eos_ids)
        while queue:
            state = queue.pop(0)
            row: dict[int, int] = {}
            for token in self.allowed(state).tolist():
                if token in eos:
                    continue
                nxt = self.advance(state, token)
                row[token] = nxt
                transitions += 1
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
            if row:
                out[state] = row
            if len(seen) > max_states or transitions > max_transitions:
                raise NotImplementedError(
                    f"states_to_token_maps lists at most {max_states} states / {max_transitions} transitions")
        return out


def _automaton_state(matcher: Matcher) -> int | None:
    """The matcher's automaton state, when it has one (the FSM backend's DFA state)."""
    if getattr(matcher, "is_terminated", lambda: False)():
        return None
    state = getattr(matcher, "state", None)
    return state if isinstance(state, int) else None


def _bit(i: int) -> int:
    return -(1 << 31) if i == 31 else 1 << i

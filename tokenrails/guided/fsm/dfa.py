"""The minimal byte DFA every FSM guide runs on (``DFA``), its numbering and its errors.

Bytes that no edge distinguishes share a class, so tables are ``[states, classes]`` (a JSON regex
has ~30 classes, not 256). The minimal DFA has one dead state; every other state can still
reach acceptance, which is what makes "token allowed iff the DFA stays alive" exact.
Numbering: 0 = dead, 1 = start, the rest in breadth-first order. Built by the C builder
(``native_builder``) or, without it, by the Python fallback (``dfa_fallback``).
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from ..errors import GuideLimitError

DEAD = 0
START = 1
EMPTY_LANGUAGE = "the pattern matches no string (its language is empty)"


@dataclass(eq=False)
class DFA:
    """Minimal complete DFA over byte classes.

    ``rows`` (``trans`` as Python lists, for scalar stepping), ``forced``, ``cls`` and
    ``accepting_list`` are built on first use, and ``walk`` converts only the rows it visits: a
    500-state JSON DFA's full ``tolist`` costs more than building the DFA natively, a guided run
    visits a few dozen states, and a compile whose stepping runs in C never needs the lists.
    """

    DEAD: ClassVar[int] = DEAD  # the state numbers, for code that walks ``trans`` from outside
    START: ClassVar[int] = START
    trans: np.ndarray        # int32 [S, K]
    classmap: np.ndarray     # int32 [256]: byte -> class
    accepting: np.ndarray    # bool [S]
    rows_hint: InitVar[list[list[int]] | None] = None       # ``trans`` as lists, when already built

    def __post_init__(self, rows_hint: list[list[int]] | None = None) -> None:
        self._row_cache: list[list[int] | None] = rows_hint if rows_hint is not None else [None] * len(self.trans)
        self._all_rows = rows_hint is not None
        self._forced: list[int] | None = None

    @cached_property
    def cls(self) -> list[int]:
        """``classmap`` as a list: byte -> class."""
        return self.classmap.tolist()

    @cached_property
    def accepting_list(self) -> list[bool]:
        """``accepting`` as a list."""
        return self.accepting.tolist()

    @property
    def rows(self) -> list[list[int]]:
        """``trans`` as Python lists (every row)."""
        if not self._all_rows:
            self._row_cache[:] = self.trans.tolist()
            self._all_rows = True
        return self._row_cache

    def _row(self, state: int) -> list[int]:
        row = self._row_cache[state] = self.trans[state].tolist()
        return row

    @property
    def forced(self) -> list[int]:
        """Per state: the only live byte, or -1 (exactly one live class, of one byte, not accepting)."""
        if self._forced is None:
            self._forced = self._compute_forced()
        return self._forced

    def _compute_forced(self) -> list[int]:
        live = self.trans != DEAD
        n_live = live.sum(axis=1)
        only = live.argmax(axis=1)
        class_size = np.bincount(self.classmap, minlength=self.num_classes)
        first_byte = np.full(self.num_classes, -1, dtype=np.int64)
        first_byte[self.classmap[::-1]] = np.arange(255, -1, -1)
        forced = np.where((n_live == 1) & (class_size[only] == 1) & ~self.accepting, first_byte[only], -1)
        forced[DEAD] = -1
        return forced.tolist()

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.trans.shape[1])

    def walk(self, state: int, data: bytes) -> int:
        """State after feeding ``data`` (DEAD once it dies)."""
        rows, cls = self._row_cache, self.cls
        for b in data:
            row = rows[state]
            if row is None:
                row = self._row(state)
            state = row[cls[b]]
            if state == DEAD:
                return DEAD
        return state

    def fullmatch(self, data: bytes) -> bool:
        return self.accepting_list[self.walk(START, data)]

    @property
    def memory_bytes(self) -> int:
        return int(self.trans.nbytes * 4 + self.accepting.nbytes + 2048)


def _max_states_error(message: str, value: int) -> GuideLimitError:
    """``max_dfa_states`` exceeded, the one limit every construction stage checks."""
    return GuideLimitError(message, limit="max_dfa_states", value=value)


def state_limit_error(max_states: int, n: int) -> GuideLimitError:
    return _max_states_error(f"limit max_dfa_states={max_states} exceeded: the automaton needs more than "
                             f"{max_states} states (a pattern like (a|b)*a(a|b){{n}} grows exponentially)", n)


def nfa_limit_error(max_states: int, value: int) -> GuideLimitError:
    return _max_states_error(f"limit max_dfa_states exceeded: the pattern expands to more than {max_states} "
                             "automaton states (large repetition counts?)", value)


def expanded_size_error(max_states: int, size: int) -> GuideLimitError:
    return _max_states_error(f"limit max_dfa_states={max_states} exceeded: the pattern expands to {size} "
                             "character positions (nested or large repetition counts)", size)

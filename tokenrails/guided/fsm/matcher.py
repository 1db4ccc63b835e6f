"""``FSMMatcher``: one sequence's DFA state; a fill is a copy of the state's cached mask row.

With the native walker a fill is one C call writing the cached row straight into a CPU int32
bitmask and an accept is one C call stepping the DFA over the token's bytes; other targets
(GPU bitmasks, odd dtypes or layouts) and the numpy fallback copy a cached row tensor.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..backend import Matcher
from ..vocabulary import Vocabulary
from .dfa import DEAD, START
from .token_index import TokenIndex

MAX_JUMP_BYTES = 4096  # bound on one jump-forward string
_INT32 = torch.int32
EOS_ONLY = -1  # the native fill's state for "terminated: only EOS"


def grammar_bytes(vocab: Vocabulary) -> list[bytes | None]:
    """Per token id: its bytes, or None for specials/EOS/empty tokens (never grammar tokens)."""

    def build() -> list[bytes | None]:
        special = vocab.special_ids
        return [None if (i in special or not b) else b for i, b in enumerate(vocab.token_bytes)]

    return vocab.cached("fsm:grammar_bytes", build)


class FSMMatcher(Matcher):
    """State + exact undo history. Not thread-safe (one sequence, one thread), like xgrammar's."""

    __slots__ = ("vocab", "_index", "_dfa", "_bytes", "_eos", "_state", "_history", "_terminated", "_fill_into",
                 "_advance")

    def __init__(self, index: TokenIndex):
        self.vocab = index.vocab
        self._index = index
        self._dfa = index.dfa
        walker = index.walker
        self._bytes = grammar_bytes(index.vocab) if walker is None else None  # the Python step's table
        self._eos = index.eos_set
        self._state = START
        self._history: list[int] = []
        self._terminated = False
        self._fill_into = walker.fill_into if walker is not None else None  # C: row -> address
        self._advance = walker.advance if walker is not None else None  # C: (state, token) -> state

    # ---- masks --------------------------------------------------------------------------
    def current_row(self) -> torch.Tensor:
        """The packed mask row for the current position (EOS-only once terminated)."""
        if self._terminated:
            return self._index.eos_row
        return self._index.row(self._state)

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, index: int = 0) -> bool:
        fill = self._fill_into
        # the cheapest torch checks that pin down the address: a contiguous 2-D int32 CPU tensor
        # has row i at data_ptr + i * width * 4 (about 0.3 us; strides cost 0.2 us each)
        if fill is not None and type(index) is int and bitmask.dtype is _INT32 and bitmask.is_cpu \
                and bitmask.is_contiguous():
            shape = bitmask.shape
            if len(shape) == 2 and 0 <= index < shape[0]:
                width = shape[1]
                return fill(EOS_ONLY if self._terminated else self._state, bitmask.data_ptr() + index * width * 4, width)
        idx = self._index
        if self._terminated:
            row, everything = idx.eos_row, False
        else:
            state = self._state
            row = idx.cached_row(state)
            everything = idx.allows_everything(state)
        width = idx.words
        have = bitmask.shape[1]
        if have == width:
            bitmask[index] = row  # one indexed copy (cheaper than bitmask[index].copy_(row))
        elif have > width:
            target = bitmask[index]
            target[:width].copy_(row)
            target[width:].zero_()
        else:
            raise ValueError(f"bitmask row has {have} words; this vocabulary needs {width}")
        return not everything

    @classmethod
    def batch_fill(cls, matchers: Sequence[Matcher], bitmask: torch.Tensor, rows: Sequence[int],
                   threads: int = 1) -> None:
        """CPU: one native row write per matcher (microseconds: threads would not pay, so
        ``threads`` is ignored). Elsewhere one indexed copy for the whole group (rows are cached
        tensors; one host-to-device transfer)."""
        if bitmask.is_cpu or len(matchers) < 4 or any(not isinstance(m, FSMMatcher) for m in matchers):
            for m, r in zip(matchers, rows):
                m.fill_next_token_bitmask(bitmask, r)
            return
        src = torch.stack([m.current_row() for m in matchers])  # type: ignore[attr-defined]
        if src.shape[1] != bitmask.shape[1]:
            for m, r in zip(matchers, rows):
                m.fill_next_token_bitmask(bitmask, r)
            return
        idx = torch.as_tensor(list(rows), dtype=torch.long, device=bitmask.device)
        bitmask.index_copy_(0, idx, src.to(bitmask.device))

    # ---- stepping -----------------------------------------------------------------------
    def _next(self, state: int, token_id: int) -> int:
        """State after ``token_id`` from ``state`` (grammar tokens only); DEAD if not allowed.
        The Python twin of the native ``advance``."""
        if not 0 <= token_id < len(self._bytes):
            return DEAD
        data = self._bytes[token_id]
        if data is None:
            return DEAD
        return self._dfa.walk(state, data)

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        token_id = int(token_id)
        if token_id in self._eos:
            if not self._dfa.accepting_list[self._state]:
                return False
            self._history.append(self._state)
            self._terminated = True
            return True
        advance = self._advance
        nxt = advance(self._state, token_id) if advance is not None else self._next(self._state, token_id)
        if nxt == DEAD:
            return False
        self._history.append(self._state)
        self._state = nxt
        return True

    def validate_tokens(self, tokens: Sequence[int]) -> int:
        if self._terminated:
            return 0
        state = self._state
        accepting = self._dfa.accepting_list
        step = self._advance or self._next
        n = 0
        for t in tokens:
            t = int(t)
            if t in self._eos:
                if accepting[state]:
                    n += 1
                break
            state = step(state, t)
            if state == DEAD:
                break
            n += 1
        return n

    def rollback(self, num_tokens: int) -> None:
        num_tokens = int(num_tokens)
        if num_tokens < 0 or num_tokens > len(self._history):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {len(self._history)} were accepted")
        for _ in range(num_tokens):
            self._state = self._history.pop()
            self._terminated = False

    def reset(self) -> None:
        self._state = START
        self._history.clear()
        self._terminated = False

    def seek(self, state: int) -> None:
        """Stand at DFA ``state`` with no history: for callers that name automaton states
        themselves (outlines' guide protocol hands out state numbers and may resume from any)."""
        if not START <= int(state) < self._dfa.num_states:
            raise ValueError(f"no live DFA state {state}")
        self._state = int(state)
        self._history.clear()
        self._terminated = False

    # ---- queries ------------------------------------------------------------------------
    def is_terminated(self) -> bool:
        return self._terminated

    def is_accepting(self) -> bool:
        return self._terminated or self._dfa.accepting_list[self._state]

    @property
    def state(self) -> int:
        """Current DFA state (for tests and diagnostics)."""
        return self._state

    def jump_forward_probe(self) -> str | None:
        text = self.find_jump_forward_string()
        if text or self._terminated or self._dfa.forced[self._state] < 0:
            return text
        return None  # a forced byte that starts no whole character

    def find_jump_forward_string(self) -> str:
        """Bytes forced while the DFA has exactly one live byte and is not accepting, as text.

        Returns '' at a mid-character position (the forced bytes would start inside a character)
        and stops before a trailing incomplete UTF-8 character.
        """
        if self._terminated:
            return ""
        forced, rows, cls = self._dfa.forced, self._dfa.rows, self._dfa.cls
        out = bytearray()
        state = self._state
        while len(out) < MAX_JUMP_BYTES:
            b = forced[state]
            if b < 0:
                break
            out.append(b)
            state = rows[state][cls[b]]
        if not out or 0x80 <= out[0] <= 0xBF:
            return ""
        end = len(out)
        for cut in range(end, max(end - 4, 0) - 1, -1):
            try:
                return out[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return ""

"""Where each reasoning row's constrained answer begins in its generated tokens.

The manager's per-sequence state says whether the row is thinking, undecided (optional
thinking) or answering; watching it after every accepted token gives the answer's first index:
the token after the end marker and the whitespace the model may write right after it (the gap:
``ReasoningConfig.whitespace_after_end``), or 0 when the row answered directly (an undecided row whose first
tokens were the answer) or the prompt had already closed the section. Only the answer is
validated; the thinking text is returned apart.
"""
from __future__ import annotations

from typing import Any, Sequence


class AnswerTracker:
    """Per row: generated tokens accepted so far and the answer's start (None: not begun)."""

    def __init__(self, rows: int):
        self._states: dict[int, Any] = {}
        self._count = [0] * rows
        self._start: dict[int, int | None] = {}
        self._thought: dict[int, bool] = {}
        self._gap_end: dict[int, int] = {}  # index just past the end marker's whitespace gap so far

    def watch(self, i: int, state: Any) -> None:
        """Follow row ``i``'s ``SequenceState`` (from ``begin_sequence``), before its first token."""
        self._states[i] = state
        self._thought[i] = state.thinking
        self._start[i] = 0 if state.answering else None

    def answering(self, i: int) -> bool:
        """The row's answer has begun (unwatched rows always answer)."""
        return self._start.get(i, 0) is not None

    def after_accept(self, fed: Sequence[bool]) -> None:
        """Call after each ``accept_tokens``; ``fed[i]``: row ``i`` was given a token."""
        for i, state in self._states.items():
            if not fed[i]:
                continue
            self._count[i] += 1
            if self._start[i] is not None:
                continue
            if state.thinking:
                self._thought[i] = True
            elif state.in_gap:  # the end marker or whitespace after it: the answer comes next
                self._gap_end[i] = self._count[i]
            elif state.answering:
                # the grammar's first token: it came right after the gap (or the end marker)
                self._start[i] = (self._gap_end.get(i, self._count[i]) if self._thought[i] else 0)

    def start(self, i: int) -> int | None:
        """Index of the answer's first generated token (0 for rows without reasoning)."""
        return self._start.get(i, 0)

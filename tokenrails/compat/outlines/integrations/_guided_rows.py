"""One guide walked along many token sequences: the state after a sequence of generated tokens,
memoised by the sequence itself (what outlines 0.0.x's integrations kept, keyed by hashes)."""
from __future__ import annotations

from typing import Any, Sequence


class GuideWalker:
    """``state(generated)``: the guide's state after ``generated`` (a tuple of token ids)."""

    def __init__(self, guide: Any):
        self.guide = guide
        self._states: dict[tuple, int] = {(): guide.initial_state}

    def state(self, generated: Sequence[int]) -> int:
        key = tuple(generated)
        found = self._states.get(key)
        if found is None:
            start = len(key) - 1
            while key[:start] not in self._states:  # a sequence we did not see grow: walk it
                start -= 1
            found = self._states[key[:start]]
            for i in range(start, len(key)):
                found = self.guide.get_next_state(found, key[i])
                self._states[key[:i + 1]] = found
        return found

    def allowed(self, generated: Sequence[int]) -> list[int]:
        return list(self.guide.get_next_instruction(self.state(generated)).tokens)

    def forget(self) -> None:
        self._states = {(): self.guide.initial_state}

"""The wall-clock budget of one compile, checked inside every construction loop."""
from __future__ import annotations

import time

from ..errors import GuideTimeoutError


class Deadline:
    """Wall-clock budget for one compile; ``check()`` raises ``GuideTimeoutError`` past it."""

    __slots__ = ("limit_s", "end")

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.end = time.perf_counter() + limit_s

    def check(self) -> None:
        if time.perf_counter() > self.end:
            raise self.error()

    def remaining(self) -> float:
        """Seconds left (may be negative): the budget handed to native code."""
        return self.end - time.perf_counter()

    def error(self) -> GuideTimeoutError:
        return GuideTimeoutError(
            f"limit compile_timeout_s={self.limit_s} exceeded while compiling the automaton",
            limit="compile_timeout_s",
            value=self.limit_s,
        )

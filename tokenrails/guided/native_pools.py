"""The native batch-fill pools (xgrammar's ``BatchGrammarMatcher``, llguidance's ``LLExecutor``):
one per thread count for the whole process, used under one lock.

Engines fill from whichever worker thread runs the step (``asyncio.to_thread``: up to 32 of
them), and a pool kept per calling thread multiplied with them: every ``LLExecutor`` starts its
own OS threads (32 workers x ``fill_threads`` 8 = 256 idle threads). Fills of one manager are
serialized by its step lock anyway, so sharing costs nothing there; the lock serializes fills of
different managers (neither backend promises that one pool runs two batch fills at once).
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable


class NativePools:
    """Pools made by ``make(threads)``, one per thread count (clamped to the CPU count)."""

    def __init__(self, make: Callable[[int], Any]):
        self._make = make
        self._pools: dict[int, Any] = {}
        self.lock = threading.Lock()  # held around every fill with a pool of this set

    def get(self, threads: int) -> Any:
        """The pool for ``threads`` threads (call under ``lock``)."""
        threads = min(max(1, int(threads)), os.cpu_count() or 1)
        pool = self._pools.get(threads)
        if pool is None:
            pool = self._pools[threads] = self._make(threads)
        return pool

    def __len__(self) -> int:
        return len(self._pools)

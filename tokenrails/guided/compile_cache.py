"""A thread-safe LRU of compiled guides, bounded in entries and bytes, plus a negative cache.

The negative cache remembers specs that failed to compile so a client repeating a bad request
costs a dict lookup, not a compile. An eviction asks for the freed heap pages to go back to the
OS (``memory_return``): without it a process keeps the RSS of the largest guides it ever held.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from .backend import CompiledGuide
from .errors import GuideError, detached_copy
from .memory_return import trim_soon


class CompileCache:
    def __init__(self, max_entries: int, max_bytes: int, max_negative: int = 1024):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_negative = max_negative
        self._ok: OrderedDict[str, CompiledGuide] = OrderedDict()
        self._bad: OrderedDict[str, GuideError] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> CompiledGuide | GuideError | None:
        with self._lock:
            hit = self._ok.get(key)
            if hit is not None:
                self._ok.move_to_end(key)
                return hit
            return self._bad.get(key)

    def put(self, key: str, guide: CompiledGuide) -> None:
        size = guide.memory_bytes
        evicted = False
        with self._lock:
            if key in self._ok:
                return
            self._ok[key] = guide
            self._bytes += size
            # the guide just put is never evicted by its own put: one larger than the whole budget
            # stays as the only entry until the next put, instead of being compiled again for
            # every sequence that uses it
            while len(self._ok) > 1 and (len(self._ok) > self.max_entries or self._bytes > self.max_bytes):
                _, old = self._ok.popitem(last=False)
                self._bytes -= old.memory_bytes
                evicted = True
        if evicted:
            del old
            trim_soon()

    def put_error(self, key: str, error: GuideError) -> None:
        """Remember a failure by its message only (see ``detached_copy``: no traceback, no payload)."""
        error = detached_copy(error)
        with self._lock:
            self._bad[key] = error
            self._bad.move_to_end(key)
            while len(self._bad) > self.max_negative:
                self._bad.popitem(last=False)

    @property
    def entries(self) -> int:
        return len(self._ok)

    @property
    def bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._ok.clear()
            self._bad.clear()
            self._bytes = 0

"""Compiles past their deadline, remembered for the requests that waited for them only.

A deadline says how long *one request* may wait; it says nothing about the spec. A compile that
missed it because the pool was busy, the machine loaded or the worker was killed may well finish
on a retry, so a timeout is not a verdict: the same spec sent again (a new request) is compiled
again, or joins the compile that still runs on its abandoned thread (no second thread starts).

What must still see the timeout are the requests that were waiting for that compile: an engine
lets a held row into its batch once its compile is past the deadline, and the row then fails
closed at once from here instead of starting a compile inside the step. They are known by
identity (each request builds its own ``GuideSpec`` object; equal specs compare equal), through
weak references, so a finished request leaves nothing behind.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from .errors import GuideTimeoutError
from .spec import GuideSpec


class Waiters:
    """A set of ``GuideSpec`` objects by identity, holding none of them alive."""

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, spec: GuideSpec) -> None:
        ref = self._refs.get(id(spec))
        if ref is not None and ref() is spec:
            return
        if len(self._refs) >= 64:  # drop the requests that ended
            self._refs = {k: r for k, r in self._refs.items() if r() is not None}
        self._refs[id(spec)] = weakref.ref(spec)

    def update(self, other: "Waiters") -> None:
        for ref in other._refs.values():
            spec = ref()
            if spec is not None:
                self.add(spec)

    def __contains__(self, spec: object) -> bool:
        ref = self._refs.get(id(spec))
        return ref is not None and ref() is spec

    def alive(self) -> bool:
        return any(r() is not None for r in self._refs.values())


@dataclass
class TimedOut:
    """One spec's compile past its deadline: the error its waiters get, and the compile itself
    (still running on an abandoned thread, or done: killed with its worker process)."""

    error: GuideTimeoutError
    future: Future
    waiters: Waiters = field(default_factory=Waiters)


class TimeoutBook:
    """Timed-out compiles by spec key, bounded; not thread-safe (the manager's lock guards it)."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._book: OrderedDict[str, TimedOut] = OrderedDict()

    def record(self, key: str, error: GuideTimeoutError, future: Future, waiters: Waiters) -> None:
        entry = TimedOut(error, future)
        old = self._book.pop(key, None)
        if old is not None:  # a retry timed out too: the first waiters still need their answer
            entry.waiters.update(old.waiters)
        entry.waiters.update(waiters)
        self._book[key] = entry
        while len(self._book) > self.max_entries:
            self._book.popitem(last=False)

    def get(self, key: str) -> TimedOut | None:
        return self._book.get(key)

    def error_for(self, key: str, spec: GuideSpec) -> GuideTimeoutError | None:
        """The timeout ``spec``'s request waited into, if it did; None for any other request."""
        entry = self._book.get(key)
        return entry.error if entry is not None and spec in entry.waiters else None

    def discard(self, key: str) -> None:
        """The spec compiled after all: the compile cache answers everyone now."""
        self._book.pop(key, None)

    def __len__(self) -> int:
        return len(self._book)


# ---- a request's own deadline -------------------------------------------------------------
# A compile's deadline starts when the compile does; a request may have spent part of its time
# before (an api_server's front check, a queue). The request's own deadline rides on its own
# ``GuideSpec`` object - the object that already stands for the request among a compile's
# waiters - beside the spec, never in its fields, equality or key: equal specs still share one
# compile and one cache entry, and each waiter fails at its own time.
_DEADLINE = "_tokenrails_deadline"


def with_deadline(spec: GuideSpec, deadline: float | None) -> GuideSpec:
    """``spec`` (this request's object) waiting at most until ``deadline`` (``time.monotonic()``)."""
    if deadline is not None:
        object.__setattr__(spec, _DEADLINE, float(deadline))
    return spec


def deadline_of(spec: GuideSpec) -> float | None:
    """The request's own deadline (``time.monotonic()``), or None: the compile's deadline only."""
    return getattr(spec, "__dict__", {}).get(_DEADLINE)


def overdue_error(limits_value: float) -> GuideTimeoutError:
    return GuideTimeoutError(
        f"limit compile_timeout_s={limits_value} exceeded: this request's time ran out before its "
        "constraint finished compiling", limit="compile_timeout_s", value=limits_value)

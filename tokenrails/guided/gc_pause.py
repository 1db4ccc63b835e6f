"""The one pause of the cyclic GC: off while any compile runs, back on after the last one.

A large schema parses into tens of thousands of dicts and strings that live for the length of the
compile; automaton construction allocates many short-lived lists and tuples. Surviving young
collections, they count toward a *full* collection, which then walks every tracked object of the
process while holding the GIL (decode ticks stall). Those objects are acyclic and freed by
reference counting when the compile ends, so the GC only needs to stay off while a compile runs.

One process-wide count of pauses, so pauses nest correctly however they interleave (a manager
compile around an FSM build, compiles on several threads): the first to start turns the GC off
*if it was on*, the last to end turns it back on *only if a pause turned it off*. A process that
disabled the GC itself is left as it was. No other code may save and restore ``gc.isenabled()``
around a compile: interleaved with this count, its exit would turn the GC back on in the middle
of another compile.

A compile can outlive its deadline (native code cannot be interrupted; the pool abandons it), so a
pause is bounded: after ``MAX_PAUSE_S`` the GC comes back on, and stays on until every compile of
that pause has ended. One lazily started watchdog thread does that by polling (every quarter of
``MAX_PAUSE_S``, at most 1 s) while pauses come and go, and sleeps untimed once the process has
been without one for two polls: entering and leaving a pause costs a lock and a counter, never a
thread wake-up (it wraps every FSM compile, some of which take microseconds).
"""
from __future__ import annotations

import gc
import os
import threading
import time

MAX_PAUSE_S = 5.0


class _Pause:
    """Process-wide pause state; ``gc_paused()`` hands out the one instance as a context manager."""

    __slots__ = ("_cond", "_depth", "_mine", "_we_disabled", "_started", "_watchdog", "_idle")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._depth = 0
        self._mine = threading.local()  # pauses open on each thread: what a forked child keeps
        self._we_disabled = False
        self._started = 0.0
        self._watchdog: threading.Thread | None = None
        self._idle = False  # the watchdog waits untimed: the next pause must wake it

    def __enter__(self) -> None:
        with self._cond:
            if self._depth == 0 and gc.isenabled():
                gc.disable()
                self._we_disabled = True
                self._started = time.monotonic()
                if self._idle:
                    self._cond.notify()
            if self._we_disabled and self._watchdog is None:  # first pause (or first since a fork)
                self._watchdog = threading.Thread(target=self._watch, name="tokenrails-gc-pause", daemon=True)
                self._watchdog.start()
            self._depth += 1
            self._mine.n = getattr(self._mine, "n", 0) + 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            self._mine.n -= 1
            if self._depth == 0 and self._we_disabled:
                self._we_disabled = False
                gc.enable()

    def _watch(self) -> None:
        """Turn the GC back on once a pause has lasted ``MAX_PAUSE_S`` (polling, see the module doc)."""
        quiet = 0
        with self._cond:
            while True:
                if self._we_disabled and time.monotonic() - self._started >= MAX_PAUSE_S:
                    self._we_disabled = False
                    gc.enable()
                quiet = quiet + 1 if self._depth == 0 else 0
                if quiet > 2:
                    self._idle = True
                    self._cond.wait()
                    self._idle = False
                    quiet = 0
                    continue
                self._cond.wait(min(max(MAX_PAUSE_S / 4, 0.01), 1.0))

    def depth(self) -> int:
        """How many pauses are open now (diagnostics and tests)."""
        return self._depth

    def _after_fork(self) -> None:
        """A forked child has neither the watchdog nor the threads whose compiles held the pause
        (only the forking thread survives): give the GC back rather than leave it off for good,
        and count only the forking thread's own pauses, which it will close. The other threads'
        pauses would never close in the child, and the next compile there would find the count
        above zero and leave the GC on for good."""
        self._cond = threading.Condition(threading.Lock())
        self._watchdog = None
        self._idle = False
        self._depth = getattr(self._mine, "n", 0)
        if self._we_disabled:
            self._we_disabled = False
            gc.enable()


_PAUSE = _Pause()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_PAUSE._after_fork)


def gc_paused() -> _Pause:
    """``with gc_paused(): ...`` — the GC stays off for the block (re-entrant, thread-safe)."""
    return _PAUSE

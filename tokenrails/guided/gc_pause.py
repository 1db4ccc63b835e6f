"""Keep the cyclic GC from running while a compile thread holds a client's parsed payload.

A large schema parses into tens of thousands of dicts and strings that live for the length of the
compile. Surviving young collections, they count toward a *full* collection, which then walks every
tracked object of the process while holding the GIL: 112 ms measured in one pass (issue 16's
28k-property schema next to a 50 ms decode tick), longer in an engine process holding a model.
Those objects are acyclic and freed by reference counting when the compile ends, so the GC only
needs to stay off while a compile runs; the first compile to start turns it off and the last one
to finish turns it back on. A process that disabled the GC itself is left as it was.

A compile can outlive its deadline (native code cannot be interrupted; the pool abandons it), so a
pause is bounded: after ``MAX_PAUSE_S`` the GC comes back on, and stays on until every compile of
that pause has ended. Cyclic garbage made meanwhile waits at most that long.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

MAX_PAUSE_S = 5.0

_LOCK = threading.Lock()
_DEPTH = 0
_WE_DISABLED = False
_TIMER: threading.Timer | None = None


def _expire() -> None:
    global _WE_DISABLED
    with _LOCK:
        if _WE_DISABLED:
            _WE_DISABLED = False
            gc.enable()


@contextmanager
def gc_paused() -> Iterator[None]:
    global _DEPTH, _WE_DISABLED, _TIMER
    with _LOCK:
        if _DEPTH == 0 and gc.isenabled():
            gc.disable()
            _WE_DISABLED = True
            _TIMER = threading.Timer(MAX_PAUSE_S, _expire)
            _TIMER.daemon = True
            _TIMER.start()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                if _TIMER is not None:
                    _TIMER.cancel()
                    _TIMER = None
                if _WE_DISABLED:
                    _WE_DISABLED = False
                    gc.enable()

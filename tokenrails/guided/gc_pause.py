"""Keep the cyclic GC from running while a compile thread holds a client's parsed payload.

A large schema parses into tens of thousands of dicts and strings that live for the length of the
compile. Surviving young collections, they count toward a *full* collection, which then walks every
tracked object of the process while holding the GIL: 112 ms measured in one pass (issue 16's
28k-property schema next to a 50 ms decode tick), longer in an engine process holding a model.
Those objects are acyclic and freed by reference counting when the compile ends, so the GC only
needs to stay off while a compile runs; the first compile to start turns it off and the last one
to finish turns it back on. A process that disabled the GC itself is left as it was.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.Lock()
_DEPTH = 0
_WE_DISABLED = False


@contextmanager
def gc_paused() -> Iterator[None]:
    global _DEPTH, _WE_DISABLED
    with _LOCK:
        if _DEPTH == 0 and gc.isenabled():
            gc.disable()
            _WE_DISABLED = True
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WE_DISABLED:
                _WE_DISABLED = False
                gc.enable()

"""``outlines.base.vectorize`` (outlines 0.x): ``numpy.vectorize`` semantics — broadcasting,
generalized signatures such as ``"(m)->()"``, several outputs — for plain functions and for
coroutine functions (each call is run to completion)."""
from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from typing import Any, Callable, Optional


def _run(coro: Any) -> Any:
    """Run a coroutine to completion, also from inside a running event loop (in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict = {}

    def target() -> None:
        box["value"] = asyncio.run(coro)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return box["value"]


def vectorize(func: Callable, signature: Optional[str] = None) -> Callable:
    import numpy as np

    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            return _run(func(*args, **kwargs))
    else:
        call = func
    params = inspect.signature(func).parameters
    if not params:  # a thunk: nothing to broadcast
        @functools.wraps(func)
        def thunk() -> Any:
            return call()

        return thunk
    def as_object(value: Any) -> Any:
        # numpy sizes a string output array from the *first* result ('one' -> '<U3', so 'three'
        # became 'thr'); strings travel as 0-d object arrays instead
        return np.array(value, dtype=object) if isinstance(value, str) else value

    def object_call(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        return tuple(as_object(o) for o in out) if isinstance(out, tuple) else as_object(out)

    vectorized = np.vectorize(object_call, signature=signature)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return vectorized(*args, **kwargs)

    return wrapper

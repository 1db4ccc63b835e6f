"""Daemon threads that run native code (xgrammar, llguidance, torch) must not return during exit.

A daemon thread whose native call returns while the interpreter finalizes cannot take the GIL back:
CPython ends it with ``pthread_exit``, whose forced unwind runs through tvm-ffi's ``noexcept`` call
guard, and the C++ runtime aborts the whole process (exit status 134, a core dump), after the
program itself has finished. A compile that is still running when ``main`` returns is rare but not
impossible (an abandoned hostile compile, a compile started just before shutdown), so the threads
that make such calls are started here and interpreter exit waits for them, for a bounded time:

* ``atexit`` runs before finalization starts, so a thread that ends during the wait ends cleanly;
* the wait is bounded by ``TOKENRAILS_EXIT_WAIT_S`` (default 10 s) for all threads together: a
  compile stuck longer than that is left to end with the process (most such compiles outlive
  finalization; the bound only trades a slower exit for the rare abort);
* threads are still daemons, so nothing else in exit (``threading._shutdown``) waits for them.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

logger = logging.getLogger(__name__)

DEFAULT_EXIT_WAIT_S = 10.0

_live: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()
_lock = threading.Lock()


def exit_wait_s() -> float:
    raw = os.environ.get("TOKENRAILS_EXIT_WAIT_S", "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_EXIT_WAIT_S
    except ValueError:
        return DEFAULT_EXIT_WAIT_S


def start_native_thread(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    """Start a daemon thread that interpreter exit waits for (bounded, see the module doc)."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        _live.add(thread)
    thread.start()
    return thread


def running() -> list[threading.Thread]:
    with _lock:
        return [thread for thread in _live if thread.is_alive()]


def wait_for_native_threads(timeout_s: float) -> list[threading.Thread]:
    """Join the running native threads within ``timeout_s`` in total; return those still running."""
    deadline = time.monotonic() + timeout_s
    for thread in running():
        if thread is threading.current_thread():
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread for thread in running() if thread is not threading.current_thread()]


def _at_exit() -> None:
    pending = running()
    if not pending:
        return
    started = time.monotonic()
    left = wait_for_native_threads(exit_wait_s())
    waited = time.monotonic() - started
    if left:
        logger.warning("tokenrails: %d native call(s) still running at exit after %.1f s (%s); exiting anyway",
                       len(left), waited, ", ".join(sorted({thread.name for thread in left})))
    elif waited > 1.0:
        logger.info("tokenrails: waited %.1f s at exit for %d native call(s) to return", waited, len(pending))


atexit.register(_at_exit)

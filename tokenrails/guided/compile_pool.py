"""Compile threads that a hostile request cannot keep: stuck compiles are abandoned, not waited for.

A backend's compile (xgrammar's C++, llguidance's Rust) cannot be interrupted from Python. With a
fixed ``ThreadPoolExecutor`` a compile past its deadline kept its worker, so two hostile requests
made every later new spec time out, and interpreter exit joined the stuck threads (41 s measured).
Here:

* a compile gets a thread as soon as it is submitted while fewer than ``max_running`` compiles run
  (the rest queue), so a benign spec is not stuck behind slow ones;
* when the caller gives up on a compile (its deadline passed) the compile is *abandoned*: it stops
  counting against ``max_running`` and its thread exits when the backend returns. While
  ``max_abandoned`` are pending, ``submit`` refuses with ``GuideLimitError`` (each abandoned compile
  still holds a core and memory: a client sending hostile compiles in a loop must not get a thread
  each);
* threads are daemons started through ``native_threads``: interpreter exit waits for a running
  compile only for a bounded time (a compile returning during finalization aborts the process).
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import Any, Callable

from .errors import GuideLimitError
from .native_threads import start_native_thread


class CompilePool:
    def __init__(self, max_running: int, max_abandoned: int, name: str = "tokenrails-compile"):
        self.max_running = max(1, max_running)
        self.max_abandoned = max(0, max_abandoned)
        self._name = name
        self._lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._running: dict[Future, threading.Thread] = {}
        self._abandoned: set[Future] = set()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile pool is closed")
            if len(self._abandoned) >= self.max_abandoned:
                raise GuideLimitError(
                    f"limit max_abandoned_compiles={self.max_abandoned} reached: earlier compiles past "
                    "their deadline still hold their threads; try again later",
                    limit="max_abandoned_compiles", value=len(self._abandoned),
                )
            self._queue.append((future, fn, args))
            self._start_if_room()
        return future

    def abandon(self, future: Future) -> None:
        """The caller stopped waiting for ``future``: it no longer takes a running slot."""
        with self._lock:
            if future in self._running and future not in self._abandoned:
                self._abandoned.add(future)
                self._start_if_room()
            elif future.cancel():  # still queued: drop it
                self._queue = collections.deque(item for item in self._queue if item[0] is not future)

    @property
    def abandoned(self) -> int:
        return len(self._abandoned)

    @property
    def running(self) -> int:
        return len(self._running) - len(self._abandoned)

    def close(self) -> None:
        """Cancel queued compiles; running ones finish on their daemon threads."""
        with self._lock:
            self._closed = True
            while self._queue:
                self._queue.popleft()[0].cancel()

    # ---- internals (under self._lock) -------------------------------------------------------
    def _start_if_room(self) -> None:
        while self._queue and len(self._running) - len(self._abandoned) < self.max_running:
            future, fn, args = self._queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            self._running[future] = start_native_thread(self._run, future, fn, args, name=self._name)

    def _run(self, future: Future, fn: Callable[..., Any], args: tuple) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
            future.set_exception(exc)
        else:
            future.set_result(result)
        finally:
            with self._lock:
                self._running.pop(future, None)
                self._abandoned.discard(future)
                if not self._closed:
                    self._start_if_room()

"""Compile threads shared fairly between clients; stuck compiles are abandoned, not waited for.

A backend's compile (xgrammar's C++, llguidance's Rust) cannot be interrupted from Python. Here:

* compiles queue per client (``clients.py``); a free slot goes to the client with the fewest
  compiles running, and no client holds more than ``per_client`` slots, so one client's expensive
  specs queue behind its own (``LOCAL``, the process's own compiles, is one caller without a cap);
* a *heavy* compile runs in a worker process killed at its deadline (``compile_procs.py``); at most
  ``max_heavy`` run at once;
* a compile whose caller gave up (its deadline passed) is *abandoned*: it stops counting against
  ``max_running`` and its thread exits when the backend returns (a heavy one's process is killed).
  While one client has ``max_abandoned`` pending, ``submit`` refuses *that client* with
  ``GuideLimitError``: abandoned work is bounded per client, and no client can close the pool to
  the others;
* threads are daemons started through ``native_threads``: interpreter exit waits for a running
  compile only for a bounded time.
"""
from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from .clients import LOCAL, current_client
from .errors import GuideLimitError
from .native_threads import start_native_thread


@dataclass
class _Job:
    future: Future
    fn: Callable[..., Any]
    args: tuple
    client: str
    heavy: bool


class CompilePool:
    def __init__(self, max_running: int, max_abandoned: int, name: str = "tokenrails-compile", *,
                 per_client: int | None = None, max_heavy: int | None = None):
        self.max_running = max(1, max_running)
        self.max_abandoned = max(0, max_abandoned)
        # no cap by default: a library caller is one client, and its benign spec must not wait for its
        # own slow ones; a server sharing the pool between clients sets one (front_check.py)
        self.per_client = max(1, per_client if per_client is not None else self.max_running)
        self.max_heavy = max(1, max_heavy if max_heavy is not None else self.max_running)
        self._name = name
        self._lock = threading.Lock()
        self._queues: dict[str, collections.deque[_Job]] = {}
        self._running: dict[Future, _Job] = {}
        self._abandoned: dict[Future, str] = {}
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, client: str | None = None, heavy: bool = False) -> Future:
        client = current_client() if client is None else client
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the compile pool is closed")
            held = sum(1 for c in self._abandoned.values() if c == client)
            if held >= self.max_abandoned:
                raise GuideLimitError(
                    f"limit max_abandoned_compiles={self.max_abandoned} reached for this client: its earlier "
                    "compiles past their deadline still run; try again later",
                    limit="max_abandoned_compiles", value=held,
                )
            self._queues.setdefault(client, collections.deque()).append(_Job(future, fn, args, client, heavy))
            self._start_if_room()
        return future

    def abandon(self, future: Future) -> None:
        """The caller stopped waiting for ``future``: it no longer takes a running slot."""
        with self._lock:
            job = self._running.get(future)
            if job is not None and future not in self._abandoned:
                self._abandoned[future] = job.client
                self._start_if_room()
            elif future.cancel():  # still queued: drop it
                for client, queue in list(self._queues.items()):
                    kept = collections.deque(j for j in queue if j.future is not future)
                    if kept:
                        self._queues[client] = kept
                    else:
                        del self._queues[client]

    @property
    def abandoned(self) -> int:
        return len(self._abandoned)

    @property
    def running(self) -> int:
        return len(self._running) - len(self._abandoned)

    def queued(self, client: str | None = None) -> int:
        with self._lock:
            if client is not None:
                return len(self._queues.get(client, ()))
            return sum(len(q) for q in self._queues.values())

    def close(self) -> None:
        """Cancel queued compiles; running ones finish on their daemon threads."""
        with self._lock:
            self._closed = True
            for queue in self._queues.values():
                for job in queue:
                    job.future.cancel()
            self._queues.clear()

    # ---- internals (under self._lock) -------------------------------------------------------
    def _live(self) -> list[_Job]:
        return [j for f, j in self._running.items() if f not in self._abandoned]

    def _next(self) -> _Job | None:
        """The queued job to start: from the client with the fewest live compiles (the longest
        waiting client first on a tie), within ``per_client`` and the heavy lane's bound."""
        live = self._live()
        per_client = collections.Counter(j.client for j in live)
        heavy_live = sum(1 for j in live if j.heavy)
        best: tuple[int, str] | None = None
        for client, queue in self._queues.items():  # insertion order: longest waiting first
            if per_client[client] >= (self.max_running if client == LOCAL else self.per_client):
                continue
            if queue[0].heavy and heavy_live >= self.max_heavy:
                continue
            if best is None or per_client[client] < best[0]:
                best = (per_client[client], client)
        if best is None:
            return None
        client = best[1]
        queue = self._queues.pop(client)
        job = queue.popleft()
        if queue:
            self._queues[client] = queue  # to the back: the others go first next time
        return job

    def _start_if_room(self) -> None:
        while len(self._running) - len(self._abandoned) < self.max_running:
            job = self._next()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            self._running[job.future] = job
            start_native_thread(self._run, job, name=self._name)

    def _run(self, job: _Job) -> None:
        try:
            result = job.fn(*job.args)
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
            job.future.set_exception(exc)
        else:
            job.future.set_result(result)
        finally:
            with self._lock:
                self._running.pop(job.future, None)
                self._abandoned.pop(job.future, None)
                if not self._closed:
                    self._start_if_room()

"""LMDeploy's request handles, shared fairly between the api_server's clients.

The api_server's ``AsyncEngine`` lets at most ``max_batch_size`` requests into the engine at once:
``generate`` holds a handle from a first-come-first-served pool until the answer ends, also while
the engine keeps the row out of its batch for its grammar to compile, so one client sending many
fresh, slow specs could take every handle. Here:

* requests waiting for a handle queue per client (``guided.clients``: API key digest or address),
  and a freed handle goes to the clients in turn;
* a client's requests whose constraint the front check had not seen compiled hold handles for at
  most ``per_client`` distinct specs at once (``TOKENRAILS_HANDLES_PER_CLIENT``) until their first
  output or their end; its requests for further new specs wait in its own queue (its other
  requests pass them) and fail at their compile deadline there. Requests for known specs, a batch
  of one new spec, and a pipeline's requests (``LOCAL``) are never held back, so a batch still
  enters the engine together.
"""
from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import time
from typing import Any, Callable

from ....guided.clients import LOCAL, current_client
from ..boot.settings import handles_per_client

ATTR = "_tokenrails_share"  # on LMDeploy's Session: (client, (deadline, spec key) of a not yet compiled spec or None)
# the session whose ``request_handle`` is entering, for ``get`` (which LMDeploy calls without it)
_SESSION: contextvars.ContextVar[Any] = contextvars.ContextVar("tokenrails_handle_session", default=None)


def mark(session: Any, client: str, new_spec: tuple[float, str] | None) -> None:
    """Called by the front check: who sent the request and, when its spec was not compiled yet,
    its compile deadline (``time.time()``) and the spec's key."""
    try:
        setattr(session, ATTR, (client, new_spec))
    except (AttributeError, TypeError):  # not LMDeploy's Session: shared as an unmarked request
        pass


class _Held:
    """A handle as one request holds it: counted against its client until its first output."""

    __slots__ = ("handle", "pool", "client", "pending")

    def __init__(self, handle: Any, pool: "FairHandlePool", client: str, pending: str | None) -> None:
        self.handle, self.pool, self.client, self.pending = handle, pool, client, pending

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def async_stream_infer(self, *args: Any, **kwargs: Any) -> Any:
        inner = self.handle.async_stream_infer(*args, **kwargs)
        return self._until_first_output(inner) if self.pending is not None else inner

    async def _until_first_output(self, inner: Any):
        try:
            async for out in inner:
                self.pool.settle(self)
                yield out
        finally:
            self.pool.settle(self)
            await inner.aclose()


class FairHandlePool:
    """Drop-in for LMDeploy's ``RequestHandlePool`` (see the module doc)."""

    def __init__(self, engine: Any, size: int) -> None:
        self.size = size
        self.handles = [engine.create_instance() for _ in range(size)]
        self.per_client = handles_per_client(size)
        self._free: collections.deque | None = None
        self._queues: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._pending: dict[str, collections.Counter] = {}  # client -> new specs' keys -> handles held

    @property
    def pool(self) -> Any:  # stock code tests ``pool is None`` for "never used"
        return self._free

    @property
    def num_dispatched(self) -> int:
        return 0 if self._free is None else self.size - len(self._free)

    async def get(self) -> Any:
        if self._free is None:
            self._free = collections.deque(self.handles)
        session = _SESSION.get()
        client, new_spec = getattr(session, ATTR, None) or (current_client(), None)
        if client == LOCAL:  # one caller (a pipeline): nobody to be fair to, as in the compile pool
            new_spec = None
        deadline, key = new_spec or (None, None)
        waiter = asyncio.get_running_loop().create_future()
        self._queues.setdefault(client, collections.deque()).append((waiter, key))
        self._dispatch()
        if waiter.done():  # no yield: a batch's requests reach the engine in the same turn
            return waiter.result()
        try:
            if deadline is None:
                return await waiter
            return await asyncio.wait_for(asyncio.shield(waiter), max(0.0, deadline - time.time()))
        except (asyncio.CancelledError, asyncio.TimeoutError) as exc:
            self._leave(client, waiter)
            if isinstance(exc, asyncio.TimeoutError):
                raise _deadline_error() from None
            raise

    def put(self, handle: Any) -> None:
        if handle is None or self._free is None:
            return
        if isinstance(handle, _Held):
            self.settle(handle)
            handle = handle.handle
        self._free.append(handle)
        self._dispatch()

    def settle(self, held: _Held) -> None:
        """``held``'s request no longer waits for its grammar: its client may start another."""
        if held.pending is not None:
            keys = self._pending.get(held.client)
            if keys is not None:
                keys[held.pending] -= 1
                if keys[held.pending] <= 0:
                    del keys[held.pending]
                if not keys:
                    del self._pending[held.client]
            held.pending = None
            self._dispatch()

    def clear(self) -> None:
        self.handles = []
        self._free = None
        for queue in self._queues.values():
            for waiter, _ in queue:
                if not waiter.done():
                    waiter.cancel()
        self._queues.clear()
        self._pending.clear()

    def _leave(self, client: str, waiter: asyncio.Future) -> None:
        """A waiter gave up (cancelled, or its deadline passed): out of its queue; a handle handed
        to it meanwhile goes back."""
        if waiter.done() and not waiter.cancelled():
            self.put(waiter.result())
            return
        waiter.cancel()
        queue = self._queues.get(client)
        if queue is not None:
            self._queues[client] = collections.deque(w for w in queue if w[0] is not waiter)
            if not self._queues[client]:
                del self._queues[client]
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free handles to the clients in turn, each client's requests in order; one whose
        requests wait for ``per_client`` new specs gets only requests for known specs (or those)."""
        while self._free:
            for client in list(self._queues):
                queue = self._queues[client]
                while queue and queue[0][0].done():  # cancelled meanwhile
                    queue.popleft()
                if not queue:
                    del self._queues[client]
                    continue
                keys = self._pending.get(client) or {}
                full = len(keys) >= self.per_client
                pick = next((i for i, (w, key) in enumerate(queue)
                             if not w.done() and (key is None or key in keys or not full)), None)
                if pick is None:
                    continue
                waiter, key = queue[pick]
                del queue[pick]
                if queue:
                    self._queues.move_to_end(client)  # served: the others come first next time
                else:
                    del self._queues[client]
                if key is not None:
                    self._pending.setdefault(client, collections.Counter())[key] += 1
                waiter.set_result(_Held(self._free.popleft(), self, client, key))
                break
            else:
                return


def _deadline_error() -> Exception:
    """HTTP 400 with the reason, as the front check reports a compile past its deadline."""
    from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

    from ..boot.settings import configured_limits

    limit = configured_limits().compile_timeout_s
    return RequestError(ErrorCode.INVALID_REQUEST, (
        f"invalid response_format: limit compile_timeout_s={limit} exceeded: this client's earlier requests "
        "with new constraints still held its share of the engine when this request's time ran out"))


def patched_request_handle(original: Callable) -> Callable:
    """``Session.request_handle`` telling the pool which session asks (its mark)."""

    @functools.wraps(original)
    def request_handle(self: Any) -> Any:
        _SESSION.set(self)  # read by ``get`` as the context manager enters, in this task
        return original(self)

    return request_handle


def patched_build(original: Callable) -> Callable:
    @functools.wraps(original)
    def build_request_handle_pool(self: Any, engine: Any, size: int) -> None:
        self.request_handle_pool = FairHandlePool(engine, size)

    return build_request_handle_pool


def install(patcher: Any) -> None:
    """Called by ``activate()`` (reverted by ``deactivate()``); no-op without LMDeploy's serve core."""
    import importlib

    try:
        sm = importlib.import_module("lmdeploy.serve.managers.session_manager")
    except ImportError:
        return
    if "build_request_handle_pool" not in sm.SessionManager.__dict__ or "request_handle" not in sm.Session.__dict__:
        return
    patcher.set(sm.SessionManager, "build_request_handle_pool", patched_build(sm.SessionManager.build_request_handle_pool))
    patcher.set(sm.Session, "request_handle", patched_request_handle(sm.Session.request_handle))

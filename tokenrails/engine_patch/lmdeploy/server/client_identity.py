"""Who sent a request, for the fair sharing of compile capacity (guided/compile_pool.py), and when.

A pure ASGI middleware: the API key of the ``Authorization`` header (its digest), else the remote
address, set in ``guided.clients.CLIENT`` for the request's task, where the front check submits
its compile. Set before the app runs, in the same task, so the endpoint's coroutine sees it.
``ARRIVED``: when the request came in (``time.time()``), before its body was read and parsed: its
compile deadline counts from there (front_check.py).
"""
from __future__ import annotations

import contextvars
import time
from typing import Any

from ....guided.clients import CLIENT, client_id

ARRIVED: contextvars.ContextVar[float | None] = contextvars.ContextVar("tokenrails_arrived", default=None)


def identity_of(scope: dict) -> str:
    key = None
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            key = text[7:].strip() if text[:7].lower() == "bearer " else text
            break
    client = scope.get("client")
    return client_id(key, client[0] if client else None)


class ClientIdentityMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        token = CLIENT.set(identity_of(scope))
        arrived = ARRIVED.set(time.time())
        try:
            await self.app(scope, receive, send)
        finally:
            ARRIVED.reset(arrived)
            CLIENT.reset(token)

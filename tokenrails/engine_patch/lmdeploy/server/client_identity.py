"""Who sent a request, for the fair sharing of compile capacity (guided/compile_pool.py).

A pure ASGI middleware: the API key of the ``Authorization`` header (its digest), else the remote
address, set in ``guided.clients.CLIENT`` for the request's task, where the front check submits
its compile. Set before the app runs, in the same task, so the endpoint's coroutine sees it.
"""
from __future__ import annotations

from typing import Any

from ....guided.clients import CLIENT, client_id


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
        try:
            await self.app(scope, receive, send)
        finally:
            CLIENT.reset(token)

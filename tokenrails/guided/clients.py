"""Who asked for a compile: the identity compile capacity is shared fairly between.

A server sets it per request (API key, else remote address); everything else compiles as
``LOCAL``. A context variable, so the value follows the request's task into the code that submits
its compile without being passed through every call between them.
"""
from __future__ import annotations

import contextvars
import hashlib

LOCAL = "local"

CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("tokenrails_client", default=LOCAL)


def current_client() -> str:
    return CLIENT.get()


def client_id(api_key: str | None, address: str | None) -> str:
    """A stable, bounded identity: the API key's digest (never the key itself, which may be
    logged with pool state), else the remote address, else ``LOCAL``."""
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode("utf-8", "replace")).hexdigest()[:16]
    if address:
        return "addr:" + address[:64]
    return LOCAL

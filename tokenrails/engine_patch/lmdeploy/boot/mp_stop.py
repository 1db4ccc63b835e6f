"""A stopped api_server exits although its engine process is already gone.

``AsyncRPCClient.close_sockets`` (LMDeploy 0.18, the api_server's side of the engine RPC) closes
its two ZMQ sockets with ZMQ's default linger (forever) and then terminates their contexts. A
message still queued for the engine process, one it will never read because it died or was
signalled with the server's process group, makes ``Context.term()`` wait for its delivery forever:
the server hangs in shutdown (measured: a teardown killed after 30 s; stock LMDeploy has the same
code). The client closes only when it stops talking to the engine (``stop``, or its listen loop
ending), so nothing still queued needs delivering: the sockets are closed with linger 0, then the
contexts terminated as stock does.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["install", "patched_close_sockets"]


def patched_close_sockets(original: Callable) -> Callable:
    @functools.wraps(original)
    def close_sockets(self: Any) -> None:
        for name in ("async_socket", "sync_socket"):
            sock = getattr(self, name, None)
            if sock is not None and not getattr(sock, "closed", True):
                sock.close(linger=0)  # queued messages for a peer that is gone are dropped, not awaited
        return original(self)  # stock's close (a no-op on closed sockets) and term()

    close_sockets.__wrapped__ = original
    return close_sockets


def install(p: Any) -> None:
    """Patch ``AsyncRPCClient.close_sockets`` where this LMDeploy has it (else nothing to mend)."""
    import importlib

    try:
        zmq_rpc = importlib.import_module("lmdeploy.pytorch.engine.mp_engine.zmq_rpc")
    except ImportError:
        return
    owner = getattr(zmq_rpc, "AsyncRPCClient", None)
    if owner is not None and callable(owner.__dict__.get("close_sockets")):
        p.set(owner, "close_sockets", patched_close_sockets(owner.close_sockets))

"""The api_server's engine process survives LMDeploy 0.18's start-up race.

``ZMQMPEngine._start_mp_proc`` (server side) waits under a ``multiprocessing.Manager`` condition
for the spawned engine process to publish its RPC port, and leaves ``with mp.Manager()`` (shutting
the manager down) as soon as it reads it. The engine process publishes inside ``with condition:``;
its ``release()`` is a call to that manager, whose reply can be lost when the manager shuts down
first (``EOFError``, ``BrokenPipeError``). The engine process then dies before it loads the model
and the server exits with ``RPCServerDeadError`` (stock LMDeploy's failure, on loaded machines).

Once the port is published the condition has done its job: nothing waits on it, and its lock
lived in the manager that is gone. So the engine process's condition is wrapped: a lost reply of
the *release* is logged and ignored; everything before it (acquire, the port, ``notify``) is
stock's, so a failure to publish still fails.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

LOST_REPLY = (EOFError, OSError)  # OSError: BrokenPipeError, ConnectionResetError, ...

__all__ = ["PublishingCondition", "patched_mp_proc", "install"]


class PublishingCondition:
    """A manager condition whose release may lose its reply (the manager already shut down)."""

    def __init__(self, condition: Any) -> None:
        self._condition = condition

    def __enter__(self) -> Any:
        return self._condition.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        try:
            self._condition.__exit__(*exc)
        except LOST_REPLY as err:
            log.debug("engine start: the manager shut down before the condition's release replied (%r); "
                      "the RPC port was published, continuing", err)
        return False

    def __getattr__(self, name: str) -> Any:  # notify, wait, acquire, release: the real condition's
        return getattr(self._condition, name)


def patched_mp_proc(original: Callable) -> Callable:
    """``ZMQMPEngine._mp_proc`` (a static method, run in the spawned engine process) with the
    condition wrapped; same name and module, so the spawn pickles it by reference."""

    @functools.wraps(original)
    def _mp_proc(shared_dict: Any, condition: Any, *args: Any, **kwargs: Any) -> Any:
        return original(shared_dict, PublishingCondition(condition), *args, **kwargs)

    return staticmethod(_mp_proc)


def install(p: Any) -> None:
    """Patch ``ZMQMPEngine._mp_proc`` where this LMDeploy has it (else nothing to mend)."""
    import importlib

    try:
        zmq_engine = importlib.import_module("lmdeploy.pytorch.engine.mp_engine.zmq_engine")
    except ImportError:
        return
    owner = getattr(zmq_engine, "ZMQMPEngine", None)
    raw = None if owner is None else owner.__dict__.get("_mp_proc")
    if isinstance(raw, staticmethod):
        p.set(owner, "_mp_proc", patched_mp_proc(raw.__func__))

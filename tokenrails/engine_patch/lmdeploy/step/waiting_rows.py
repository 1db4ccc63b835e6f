"""A row waits, the batch does not: a sequence whose grammar is not compiled stays out of the batch.

A guided sequence's first sampled token (at the end of its prefill) needs its grammar's mask.
If the sequence entered the batch before its compile finished, that step - and every other
sequence in it - waited for the compile. Here LMDeploy's prefill scheduler is offered only the
waiting sequences whose grammar is ready (compiled, failed, refused or past its deadline: a
failure then fails the row closed at once); the others stay WAITING, their compile is started
on the first look, and they join the first prefill after it ends. Running sequences are never
held, so a sequence already decoding is never delayed by another's compile.

The readiness check asks the managers of the process where the scheduler runs: the agent's
(``manager._LIVE``) when the model agent runs in this process; with an executor whose ranks run
in other processes (TP), the engine process's own compiles (engine_grammars.py), whose guide the
ranks then take with the row instead of compiling it in their step (see docs/architecture.md).
A compile is started under the client the request came from (``client_of``: the api_server's
identity, carried in the request's format), so the engine's compile pool shares its capacity
fairly between clients (guided/compile_pool.py).
When every schedulable sequence is held, the engine loop is told a lookup is pending so it polls
again after 1 ms instead of backing off 100 ms with a "cache is full" warning.
"""
from __future__ import annotations

from typing import Any, Callable

from ....guided.clients import CLIENT
from ....guided.spec import GuideSpec
from ..server.request_parsing import client_of
from . import rank_manager as manager
from .engine_grammars import ATTR
from .strategies import format_for_param


def grammar_ready(seq: Any, grammars: Any = None) -> bool:
    """Whether ``seq`` may enter a batch now (unguided and failed formats always may);
    ``grammars``: the engine process's compiles for ranks elsewhere (else this process's ranks)."""
    param = seq.sampling_param
    spec = format_for_param(param)[0]
    if not isinstance(spec, GuideSpec):
        return True
    token = CLIENT.set(client_of(getattr(param, "response_format", None)))
    try:
        return all(m.poll(spec) for m in ([grammars.manager] if grammars is not None else list(manager._LIVE)))
    finally:
        CLIENT.reset(token)


def patched_schedule(original: Callable) -> Callable:
    def schedule(self, *, waiting, **kwargs):
        grammars = getattr(self, ATTR, None)
        ready = [s for s in waiting if grammar_ready(s, grammars)]
        running = original(self, waiting=ready, **kwargs)
        if len(ready) < len(waiting) and not running:
            self.last_schedule_had_pending_lookup = True  # poll again soon (engine_loop)
        return running

    schedule.__wrapped__ = original
    return schedule


def install(patcher: Any, prefill_module: Any) -> None:
    """Called by ``activate()`` (reverted by ``deactivate()``)."""
    cls = prefill_module._PrefillScheduler
    patcher.set(cls, "schedule", patched_schedule(cls.schedule))

"""A row waits, the batch does not: a sequence whose grammar is not compiled stays out of the batch.

A guided sequence's first sampled token (at the end of its prefill) needs its grammar's mask.
If the sequence entered the batch before its compile finished, that step - and every other
sequence in it - waited for the compile. Here LMDeploy's prefill scheduler is offered only the
waiting sequences whose grammar is ready (compiled, failed, refused or past its deadline: a
failure then fails the row closed at once); the others stay WAITING, their compile is started
on the first look, and they join the first prefill after it ends. Running sequences are never
held, so a sequence already decoding is never delayed by another's compile.

The readiness check asks this process's sampling managers (``manager._LIVE``); with an executor
that runs the model agent in another process there is none here, nothing is held, and a compile
is waited for inside that process's step as before (see docs/architecture.md).
When every schedulable sequence is held, the engine loop is told a lookup is pending so it polls
again after 1 ms instead of backing off 100 ms with a "cache is full" warning.
"""
from __future__ import annotations

from typing import Any, Callable

from ....guided.spec import GuideSpec
from . import rank_manager as manager
from .strategies import format_for_param


def grammar_ready(seq: Any) -> bool:
    """Whether ``seq`` may enter a batch now (unguided and failed formats always may)."""
    spec = format_for_param(seq.sampling_param)[0]
    if not isinstance(spec, GuideSpec):
        return True
    return all(m.poll(spec) for m in list(manager._LIVE))


def patched_schedule(original: Callable) -> Callable:
    def schedule(self, *, waiting, **kwargs):
        ready = [s for s in waiting if grammar_ready(s)]
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

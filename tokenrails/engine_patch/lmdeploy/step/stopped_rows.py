"""Rows that stopped before a decoding step: that step does no guided work for them.

LMDeploy sends a step before it reads the previous one's outputs, so a row that ended (EOS, stop
word, length) runs one more step, whose output the engine drops. Its stopping criteria say so
before that step (``num_appendable_ids <= 0``, read where the agent builds a decoding step's
inputs: ``BaseModelAgent._get_inputs_from_delta``). The rank's manager keeps the rows with the
step's ``session_ctx`` (``owner.stopped``); the plain step leaves them out of its rows (no mask,
no accept into a matcher whose round has ended) and the speculative helper hands out no handle
for them (no proposal either).
"""
from __future__ import annotations

from typing import Any, Callable

NONE: tuple[Any, frozenset[int]] = (None, frozenset())


def ended_flags(stopping_criteria: Any) -> list[bool]:
    """Per sequence, whether its stopping criteria say it ended before this step (no token left
    to append); empty when the criteria keep no such count."""
    left = getattr(stopping_criteria, "num_appendable_ids", None)
    return [] if left is None else (left.reshape(-1) <= 0).tolist()


def ended_rows(stopping_criteria: Any, session_ctx: Any) -> frozenset[int]:
    """The logits rows whose stopping criteria say they ended before this step. None when the
    logits rows are not the sequences (a dLLM block has one row per position): a row must never
    lose its constraint or its error by a wrong index."""
    flags = ended_flags(stopping_criteria)
    if session_ctx is None or not flags or len(flags) != len(session_ctx):
        return frozenset()
    return frozenset(i for i, ended in enumerate(flags) if ended)


def stopped(owner: Any, session_ctx: Any) -> frozenset[int]:
    """The rows that ended before the step whose inputs carry ``session_ctx`` (none when the
    marks were made for another step, e.g. a prefill, which has no stopped rows)."""
    ctx, rows = getattr(owner, "stopped", NONE)
    return rows if session_ctx is not None and ctx is session_ctx else frozenset()


def patched_inputs_from_delta(original: Callable) -> Callable:
    """``BaseModelAgent._get_inputs_from_delta``: mark the rows that ended before this step, on
    the manager and on its open step (opened by ``_async_step`` before these inputs existed)."""
    def _get_inputs_from_delta(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        owner = getattr(self, "guided_decoding_manager", None)
        if getattr(owner, "is_tokenrails", False):
            sampling_inputs = out[3]
            ctx = getattr(sampling_inputs, "session_ctx", None)
            ended = ended_rows(out[2], ctx)
            owner.stopped = (ctx, ended)
            step = owner.step
            if ended and step is not None and step.inputs is sampling_inputs:
                step.leave_out(ended)
        return out

    _get_inputs_from_delta.__wrapped__ = original
    return _get_inputs_from_delta


def install(p: Any) -> None:
    """Mark stopped rows for every decoding step (``patched_inputs_from_delta``)."""
    from lmdeploy.pytorch.engine.model_agent import agent

    from .._patching import require_params

    base = agent.BaseModelAgent
    original = base.__dict__["_get_inputs_from_delta"]
    require_params(original, ["delta", "sampling_inputs"], "BaseModelAgent._get_inputs_from_delta")
    p.set(base, "_get_inputs_from_delta", patched_inputs_from_delta(original))

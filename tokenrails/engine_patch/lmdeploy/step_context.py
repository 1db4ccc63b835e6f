"""Per-step context shared by the agent patch and the logits/spec patches (a ContextVar).

The agent's post-processing knows whether this step is a non-last prefill chunk and collects
per-row guided errors; the logits processor (created deep inside LMDeploy) reads and fills it.
``asyncio.to_thread`` copies the context, so the fill/accept threads see it too.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

from ...guided.errors import GuideError


@dataclass
class StepContext:
    skip_guided: bool = False                    # non-last prefill chunk: sample nothing into matchers
    errors: dict[int, GuideError] = field(default_factory=dict)  # logits row -> error (finish it)


_STEP: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("tokenrails_lmdeploy_step", default=None)


def current() -> StepContext | None:
    return _STEP.get()


def enter(ctx: StepContext) -> contextvars.Token:
    return _STEP.set(ctx)


def leave(token: contextvars.Token) -> None:
    _STEP.reset(token)


def report(errors: dict[int, GuideError]) -> None:
    """Record row errors for the running step (no-op outside a step, e.g. in unit use)."""
    ctx = _STEP.get()
    if ctx is not None:
        for row, err in errors.items():
            ctx.errors.setdefault(row, err)

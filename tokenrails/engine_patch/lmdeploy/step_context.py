"""Per-step context of the LMDeploy patches, and the one owner of ``session_ctx``'s tokenrails entry.

* ``session_ctx[i]["tokenrails"]`` is written once per row by the strategy patch (``put``) and
  read only here (``rows_of_ctx``, ``rows_from_inputs``): a ``GuidedRow`` (constraint + round-aware
  identity), a ``GuideError`` (that row fails closed), or None (unguided).
* ``StepContext`` (a ContextVar opened by the agent patch around the whole step: forward,
  sampling, accept) carries what the step's parts share: whether this is a non-last prefill
  chunk, the per-row errors, and the step's rows — read from the sampling inputs once and
  prepared (reasoning resolved, prompt read) once, whichever part needs them first.
  ``asyncio.to_thread`` copies the context, so the fill/accept threads see it too.
"""
from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass, field
from typing import Any

from ...guided.errors import GuideError, InvalidGuideError

CTX_KEY = "tokenrails"


def put(entry: dict, row: Any) -> None:
    """The strategy's one write: row ``entry``'s guided identity (``GuidedRow | GuideError | None``)."""
    entry[CTX_KEY] = row


def row_of(entry: Any) -> Any:
    return entry.get(CTX_KEY) if entry is not None else None


def rows_of_ctx(session_ctx: Any, n: int) -> list[Any]:
    """The first ``n`` rows' entries (None past the end)."""
    ctx = list(session_ctx or [])[:n]
    return [row_of(e) for e in ctx] + [None] * (n - len(ctx))


def rows_from_inputs(sampling_inputs: Any) -> list[Any]:
    """Per logits row: ``GuidedRow | GuideError | None``.

    A guided row without our entry (the strategy patch did not run for it) fails closed: without
    the round (``output_start_pos``) its identity is unknown, and guessing one would bind the
    previous round's matcher on a session's second round.
    """
    ctx = sampling_inputs.session_ctx or []
    formats = sampling_inputs.response_formats or ()
    n = int(sampling_inputs.batch_size or len(formats))
    rows: list[Any] = [None] * n
    for i in range(n):
        entry = ctx[i] if i < len(ctx) else None
        if entry is not None and CTX_KEY in entry:
            rows[i] = entry[CTX_KEY]
            continue
        fmt = formats[i] if i < len(formats) else None
        if fmt is None:
            continue
        from .requests import spec_of

        try:
            spec = spec_of(fmt)
        except GuideError as exc:
            rows[i] = exc
            continue
        if spec is None:
            continue
        rows[i] = InvalidGuideError(
            "guided row has no tokenrails identity (no session context, or the sampling strategy "
            "was not patched): its round is unknown, refusing it")
    return rows


@dataclass
class StepContext:
    skip_guided: bool = False                    # non-last prefill chunk: sample nothing into matchers
    errors: dict[int, GuideError] = field(default_factory=dict)  # logits row -> error (finish it)
    budget_rows: list[Any] | None = None  # the step's rows when one has a token budget (budget_report.py)
    _rows: dict[int, tuple[Any, list[Any]]] = field(default_factory=dict, repr=False)
    _prepared: dict[int, tuple[Any, list[Any]]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def rows(self, sampling_inputs: Any) -> list[Any]:
        """The rows of these sampling inputs, read once per step (keyed by the inputs object)."""
        key = id(sampling_inputs)
        with self._lock:
            hit = self._rows.get(key)
            if hit is not None and hit[0] is sampling_inputs:
                return hit[1]
        rows = rows_from_inputs(sampling_inputs)
        with self._lock:
            self._rows[key] = (sampling_inputs, rows)
        return rows

    def prepared(self, owner: Any, sampling_inputs: Any) -> list[Any]:
        """``owner.prepare_rows`` of those rows, once per step (may wait for the vocabulary:
        call it off the event loop unless ``owner.ready``)."""
        key = id(sampling_inputs)
        with self._lock:
            hit = self._prepared.get(key)
            if hit is not None and hit[0] is sampling_inputs:
                return hit[1]
        rows = owner.prepare_rows(self.rows(sampling_inputs))
        with self._lock:
            self._prepared[key] = (sampling_inputs, rows)
        return rows


_STEP: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("tokenrails_lmdeploy_step", default=None)


def current() -> StepContext | None:
    return _STEP.get()


def enter(ctx: StepContext) -> contextvars.Token:
    return _STEP.set(ctx)


def leave(token: contextvars.Token) -> None:
    _STEP.reset(token)


def rows(sampling_inputs: Any) -> list[Any]:
    """The step's rows of ``sampling_inputs`` (read once inside a step; read fresh outside one)."""
    ctx = _STEP.get()
    return ctx.rows(sampling_inputs) if ctx is not None else rows_from_inputs(sampling_inputs)


def prepared(owner: Any, sampling_inputs: Any) -> list[Any]:
    ctx = _STEP.get()
    if ctx is not None:
        return ctx.prepared(owner, sampling_inputs)
    return owner.prepare_rows(rows_from_inputs(sampling_inputs))


def report(errors: dict[int, GuideError]) -> None:
    """Record row errors for the running step (no-op outside a step, e.g. in unit use)."""
    ctx = _STEP.get()
    if ctx is not None:
        for row, err in errors.items():
            ctx.errors.setdefault(row, err)

"""Model-agent and engine-loop patches: one tokenrails manager per rank, errors that finish rows.

* ``agent.GuidedDecodingManager`` (the name the agent constructs) → ``LMDeployGuidedManager``;
  LMDeploy passes that object on to the logits processor and the speculative helper unchanged.
* ``_async_step``: start compiling every guided row's constraint *before* the forward, so
  compilation overlaps prefill instead of stalling sampling.
* ``_step_postprocess_with_output``: opens the per-step context (non-last prefill chunk →
  no guided fill/accept), then marks rows whose constraint failed or whose token was rejected as
  stopped and attaches the errors to the ``BatchedOutputs`` (``to_cpu``/``to_numpy``/
  ``to_tensor`` keep them across executors), and the budget rows' ``budget_closed`` flags
  (budget_report.py).
* ``EngineLoop._make_infer_outputs``: such a row's response becomes an error
  (``NOT_SUPPORTED`` → HTTP 400 for invalid/unsupported/limit errors, ``INTERNAL_ENGINE_ERROR``
  for a rejected token), never a normal finish.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from ...guided.sequence import GuidedRow
from ...guided.errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from . import budget_report, overlap, step_context

logger = logging.getLogger("tokenrails.lmdeploy")
ERRORS_ATTR = "tokenrails_errors"


def patched_async_step(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _async_step(self, *args, **kwargs):
        mgr = getattr(self, "guided_decoding_manager", None)
        if getattr(mgr, "is_tokenrails", False):
            try:
                si = sig.bind_partial(self, *args, **kwargs).arguments.get("sampling_inputs")
            except TypeError:
                si = None
            step = step_context.StepContext()
            ctx_token = step_context.enter(step)  # the step's rows are read and prepared once
            if si is not None:
                # the one prefetch: compiles start before the forward and overlap it
                rows = step.rows(si)
                specs = {r.spec.key: r.spec for r in rows if isinstance(r, GuidedRow)}
                if specs:
                    mgr.prefetch(specs.values())
                    step.budget_rows = rows if any(isinstance(r, GuidedRow) and r.max_tokens is not None
                                                   for r in rows) else None
            token = overlap.STEP_INPUTS.set(si)  # the forward wrapper starts the mask fill from it
            try:
                return await original(self, *args, **kwargs)
            finally:
                overlap.STEP_INPUTS.reset(token)
                overlap.PREFILL.set(None)
                step_context.leave(ctx_token)
        return await original(self, *args, **kwargs)

    _async_step.__wrapped__ = original
    return _async_step


def _is_nonlast_chunk(inputs: Any) -> bool:
    return bool(getattr(inputs, "is_chunk", False)) and not bool(getattr(inputs, "is_last_chunk", True))


def patched_postprocess(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _step_postprocess_with_output(self, *args, **kwargs):
        inputs = sig.bind_partial(self, *args, **kwargs).arguments.get("inputs")
        outer = step_context.current()  # opened by _async_step: the step's rows are on it
        ctx = outer if outer is not None else step_context.StepContext()
        ctx.skip_guided = _is_nonlast_chunk(inputs)
        ctx.errors = {}
        token = step_context.enter(ctx)
        try:
            result = await original(self, *args, **kwargs)
        finally:
            step_context.leave(token)
        if ctx.errors and not ctx.skip_guided:
            batched_output = result[-1]
            if batched_output is not None:
                _attach_errors(batched_output, ctx.errors)
        if ctx.budget_rows is not None and not ctx.skip_guided and result[-1] is not None:
            flags = budget_report.row_flags(self.guided_decoding_manager, ctx.budget_rows)
            if flags:
                setattr(result[-1], budget_report.ATTR, flags)
        return result

    _step_postprocess_with_output.__wrapped__ = original
    return _step_postprocess_with_output


def _attach_errors(batched_output: Any, errors: dict[int, GuideError]) -> None:
    stopped = batched_output.stopped
    if stopped is not None:
        for row in errors:
            if row < stopped.shape[0]:
                stopped[row] = True
    payload = {int(row): (type(err).__name__, str(err)) for row, err in errors.items()}
    setattr(batched_output, ERRORS_ATTR, payload)
    for row, (kind, msg) in payload.items():
        logger.warning("tokenrails: guided row %d finished with %s: %s", row, kind, msg)


def patched_convert(original: Callable) -> Callable:
    def convert(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        for attr in (ERRORS_ATTR, budget_report.ATTR):
            value = getattr(self, attr, None)
            if value:
                setattr(out, attr, value)
        return out

    convert.__wrapped__ = original
    return convert


_CLIENT_ERRORS = {c.__name__ for c in (InvalidGuideError, UnsupportedGuideError, GuideLimitError)} | {
    "GuideTimeoutError"}


def patched_make_infer_outputs(original: Callable) -> Callable:
    sig = inspect.signature(original)

    def _make_infer_outputs(self, *args, **kwargs):
        bound = sig.bind_partial(self, *args, **kwargs).arguments
        outputs = original(self, *args, **kwargs)
        batched = bound.get("batched_outputs")
        flags = getattr(batched, budget_report.ATTR, None) if batched is not None else None
        if flags:
            budget_report.note(bound.get("running") or [], flags)
        errors = getattr(batched, ERRORS_ATTR, None) if batched is not None else None
        if not errors:
            return outputs
        from lmdeploy.messages import ResponseType

        running = bound.get("running") or []
        for row, (kind, msg) in errors.items():
            if row >= len(running):
                continue
            seq = running[row]
            out = outputs.get(seq.session_id)
            if out is None:
                continue
            out.finish = False
            out.resp.type = ResponseType.NOT_SUPPORTED if kind in _CLIENT_ERRORS else ResponseType.INTERNAL_ENGINE_ERROR
            out.resp.is_done = True
            out.resp.err_msg = f"{kind}: {msg}"
        return outputs

    _make_infer_outputs.__wrapped__ = original
    return _make_infer_outputs

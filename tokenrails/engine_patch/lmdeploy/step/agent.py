"""Model-agent and engine-loop patches: one tokenrails manager per rank, errors that finish rows.

* ``agent.GuidedDecodingManager`` (the name the agent constructs) → ``LMDeployGuidedManager``;
  LMDeploy passes that object on to the logits processor and the speculative helper unchanged.
* ``attach_errors`` (called by the step's post-processing, lmdeploy_step.py): marks the sequences whose
  constraint failed or whose token was rejected as stopped and attaches the errors to the
  ``BatchedOutputs`` (``to_cpu``/``to_numpy``/``to_tensor`` keep them across executors), and the
  budget rows' ``budget_closed`` flags (budget_report.py).
* ``EngineLoop._make_infer_outputs``: such a row's response becomes an error
  (``NOT_SUPPORTED`` → HTTP 400 for invalid/unsupported/limit errors, ``INTERNAL_ENGINE_ERROR``
  for a rejected token), never a normal finish.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

from ....guided.errors import GuideError, GuideLimitError, InvalidGuideError, UnsupportedGuideError
from ..server import budget_report

logger = logging.getLogger("tokenrails.lmdeploy")
ERRORS_ATTR = "tokenrails_errors"


def attach_errors(batched_output: Any, errors: dict[int, GuideError]) -> None:
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

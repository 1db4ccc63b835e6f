"""Model-agent and engine-loop patches: one tokenrails manager per rank, errors that finish rows.

* ``agent.GuidedDecodingManager`` (the name the agent constructs) → ``LMDeployGuidedManager``;
  LMDeploy passes that object on to the logits processor and the speculative helper unchanged.
* ``_async_step``: start compiling every guided row's constraint *before* the forward, so
  compilation overlaps prefill instead of stalling sampling.
  The step opens the rank's ``LMDeployStep`` (step.py; a non-last prefill chunk → no guided
  fill/accept) and closes it after the step.
* ``_step_postprocess_with_output``: marks the sequences whose constraint failed or whose token
  was rejected as stopped and attaches the errors to the ``BatchedOutputs`` (``to_cpu``/``to_numpy``/
  ``to_tensor`` keep them across executors).
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

logger = logging.getLogger("tokenrails.lmdeploy")
ERRORS_ATTR = "tokenrails_errors"


def patched_async_step(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _async_step(self, *args, **kwargs):
        owner = getattr(self, "guided_decoding_manager", None)
        if not getattr(owner, "is_tokenrails", False):
            return await original(self, *args, **kwargs)
        bound = sig.bind_partial(self, *args, **kwargs).arguments
        step = owner.open_step(bound.get("sampling_inputs"), skip_guided=_is_nonlast_chunk(bound.get("inputs")))
        # the one prefetch: compiles start before the forward and overlap it
        specs = {r.spec.key: r.spec for r in step.rows if isinstance(r, GuidedRow)}
        if specs:
            owner.prefetch(specs.values())
        try:
            return await original(self, *args, **kwargs)
        finally:
            owner.close_step(step)

    _async_step.__wrapped__ = original
    return _async_step


def _is_nonlast_chunk(inputs: Any) -> bool:
    return bool(getattr(inputs, "is_chunk", False)) and not bool(getattr(inputs, "is_last_chunk", True))


def patched_postprocess(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _step_postprocess_with_output(self, *args, **kwargs):
        owner = getattr(self, "guided_decoding_manager", None)
        if not getattr(owner, "is_tokenrails", False):
            return await original(self, *args, **kwargs)
        opened = None
        if owner.step is None:  # called without the step wrapper (a subclass's own step)
            bound = sig.bind_partial(self, *args, **kwargs).arguments
            opened = owner.open_step(bound.get("sampling_inputs"), skip_guided=_is_nonlast_chunk(bound.get("inputs")))
        step = owner.step
        try:
            result = await original(self, *args, **kwargs)
        finally:
            if opened is not None:
                owner.close_step(opened)
        if step.errors and not step.skip_guided and result[-1] is not None:
            _attach_errors(result[-1], step.seq_errors())
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
        errors = getattr(self, ERRORS_ATTR, None)
        if errors:
            setattr(out, ERRORS_ATTR, errors)
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

"""The guided part of LMDeploy's ``FusedLogitsProcessor``, replaced.

* The grammar mask is applied *last*, after custom processors, penalties, bad words and stop
  words, through the manager's batched step (persistent bitmask, only guided rows filled,
  threaded fill above a threshold, one kernel call). Masking first and banning words afterwards
  can leave a row with only grammar-illegal tokens.
* A guided row left with no finite logit (every grammar-legal token was banned) gets EOS when the
  grammar is complete, and otherwise fails with a ``GuideError`` (EOS-only, finished with an error).
* Fill and accept run in a worker thread: a compile still running never blocks the event loop.
  Small steps whose work is known to be short run inline instead (a thread hop costs more than
  they do): the apply of a mask the overlapped fill already finished, the fill + apply of at most
  ``INLINE_MAX_ROWS`` rows on CPU logits whose constraints are all compiled, and the accept of at
  most ``INLINE_MAX_ROWS`` rows on host tokens (their matchers exist: the step's fill built them).
* ``accept_token`` failures (REJECTED) and constraint errors are reported per row, never ignored.
* Non-last prefill chunks neither fill nor accept (LMDeploy samples and discards a token there).
* Reasoning: rows are resolved by ``LMDeployGuidedManager.prepare_row`` (config + prompt
  reading) in the worker thread before the first fill; a row still thinking is never "complete".
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import torch

from ...guided.sequence import GuidedRow, StepStatus
from ...guided.errors import GuideError, InvalidGuideError
from . import overlap


INLINE_MAX_ROWS = 8  # guided rows up to which a short step skips the worker thread


def _is_ours(manager: Any) -> bool:
    return bool(getattr(manager, "is_tokenrails", False))


def eos_only_(scores: torch.Tensor, row: int, eos_ids: tuple[int, ...]) -> None:
    """Leave only EOS finite in ``scores[row]`` (0 when EOS itself had been banned)."""
    eos = torch.tensor(eos_ids, device=scores.device)
    keep = scores[row].index_select(0, eos)
    keep = torch.where(torch.isfinite(keep), keep, torch.zeros_like(keep))
    scores[row].fill_(-float("inf"))
    scores[row].index_copy_(0, eos, keep)


def _may_empty_rows(si: Any) -> bool:
    """Whether anything before the mask can set logits to -inf (so a row can end up empty)."""
    return (si.bad_words is not None or si.stop_words is not None or any(si.logits_processors or ())
            or (si.max_repetition_ngram_size or 0) > 0)


def patched_init(original: Callable) -> Callable:
    def __init__(self, sampling_inputs, logprobs_mode=None, guided_decoding_manager=None):
        if not _is_ours(guided_decoding_manager):
            return original(self, sampling_inputs, logprobs_mode, guided_decoding_manager)
        self.sampling_inputs = sampling_inputs
        self.logprobs_mode = logprobs_mode
        self.guided_decoding_manager = guided_decoding_manager
        self.guided_processors = {}  # stock paths see no xgrammar matchers
        if sampling_inputs.session_to_cleanup:
            self.cleanup_sessions(sampling_inputs.session_to_cleanup)
        step = guided_decoding_manager.step
        if step is None or step.inputs is not sampling_inputs:  # outside an engine step (unit use)
            step = guided_decoding_manager.new_step(sampling_inputs)
        self.tokenrails_step = step

    __init__.__wrapped__ = original
    return __init__


def _guided_step(self, scores: torch.Tensor, stream: Any) -> None:
    """Runs in a worker thread: fill + apply the mask, then repair rows left empty."""
    step = self.tokenrails_step
    try:
        mgr = self.guided_decoding_manager.core()
    except GuideError as exc:
        step.fail({i: exc for i, r in enumerate(step.rows) if r is not None})
        mgr = None
    # Inference mode is thread-local: this worker thread must re-enter it to write the engine's
    # inference tensors (an EOS repair on them outside it raised and stopped the whole engine).
    with torch.inference_mode(scores.is_inference()):
        if stream is not None:
            with torch.cuda.stream(stream):
                _guided_step_inner(step, mgr, scores)
        else:
            _guided_step_inner(step, mgr, scores)
    step.filled = mgr is not None  # this step's matchers exist: its accept cannot compile


def _guided_step_inner(step: Any, mgr: Any, scores: torch.Tensor) -> None:
    errors = step.errors
    run_rows: list[GuidedRow | None] = step.run_rows() if mgr is not None else []
    if any(r is not None for r in run_rows):
        filled = overlap.take(step, run_rows)  # filled during the forward (overlap.py), or None
        statuses = mgr.apply_filled(scores, filled) if filled is not None else mgr.fill_and_apply(scores, run_rows)
        step.fail({i: st.error for i, st in enumerate(statuses) if st is not None and st.error is not None})
    step.fail({i: r for i, r in enumerate(step.prepared() if mgr is not None else step.rows)
               if isinstance(r, GuideError)})
    eos_ids = mgr.vocab.eos_ids if mgr is not None else _fallback_eos(step.inputs)
    if run_rows and _may_empty_rows(step.inputs):
        idx = [i for i, r in enumerate(run_rows) if r is not None and i not in errors]
        if idx:
            empty = torch.isneginf(scores[idx]).all(dim=1).tolist()
            for i, is_empty in zip(idx, empty):
                if not is_empty:
                    continue
                if mgr.may_end(run_rows[i]):
                    scores[i, eos_ids[0]] = 0.0  # the output is complete: end it
                else:
                    errors[i] = InvalidGuideError(
                        "no token is allowed by both the constraint and the request's bad words / "
                        "stop words / logits processors")
    for i in errors:
        eos_only_(scores, i, eos_ids)


def _fallback_eos(si: Any) -> tuple[int, ...]:
    sw = si.stop_words
    if sw is not None and sw.numel():
        return (int(sw.reshape(-1)[0].item()),)
    return (0,)


def _fill_is_short(self, scores: torch.Tensor) -> bool:
    """Logits on the CPU, no overlapped fill pending, and nothing the fill could wait for (the
    vocabulary is built and every guided row's constraint compiled): the fill of at most
    ``INLINE_MAX_ROWS`` rows is then shorter than the hop to a worker thread and back, which on a
    CPU forward also hands the GIL around (the CPU path at batch 1: see docs/lmdeploy.md)."""
    if scores.is_cuda or self.tokenrails_step.prefill is not None:
        return False
    owner = self.guided_decoding_manager
    if not owner.ready:
        return False
    try:
        mgr = owner.core(wait=False)
    except GuideError:
        return True  # every row fails at once: nothing to wait for
    return mgr is not None and mgr.compiled([r for r in self.tokenrails_step.rows if isinstance(r, GuidedRow)])


def patched_call(original: Callable) -> Callable:
    async def __call__(self, scores: torch.Tensor):
        scores, logprobs = await original(self, scores)
        step = getattr(self, "tokenrails_step", None)
        if step is None or step.skip_guided or not any(r is not None for r in step.rows):
            return scores, logprobs
        if step.guided <= INLINE_MAX_ROWS and (
                overlap.ready(step, [r if isinstance(r, GuidedRow) else None for r in step.rows])
                or _fill_is_short(self, scores)):
            overlap.STATS.inline += 1
            _guided_step(self, scores, None)  # the current stream, this thread
            return scores, logprobs
        stream = None
        if scores.is_cuda:
            await self._wait_stream_once()
            stream = torch.cuda.current_stream()
        await asyncio.to_thread(_guided_step, self, scores, stream)
        return scores, logprobs

    __call__.__wrapped__ = original
    return __call__


def _accept(step: Any, token_ids: list[int]) -> None:
    rows = [r if i not in step.errors else None for i, r in enumerate(step.run_rows())]
    if not any(r is not None for r in rows):
        return
    statuses = step.owner.core().accept_tokens(token_ids, rows)
    step.fail({i: st.error or InvalidGuideError("guided token rejected") for i, st in enumerate(statuses)
               if st is not None and st.state in (StepStatus.REJECTED, StepStatus.ERROR)})


def patched_accept(original: Callable) -> Callable:
    async def accept_guided_tokens(self, next_token_ids: torch.Tensor):
        step = getattr(self, "tokenrails_step", None)
        if step is None:
            return await original(self, next_token_ids)
        if step.skip_guided or not step.guided:
            return None  # the token of a non-last chunk is thrown away: never feed it to matchers
        if not next_token_ids.is_cuda and step.guided <= INLINE_MAX_ROWS and step.filled:
            _accept(step, next_token_ids.reshape(-1).tolist())
            return None
        ready = None
        if next_token_ids.is_cuda:
            ready = torch.cuda.Event()
            ready.record()

        def run() -> None:
            if ready is not None:
                ready.synchronize()
            _accept(step, next_token_ids.reshape(-1).tolist())

        await asyncio.to_thread(run)
        return None

    accept_guided_tokens.__wrapped__ = original
    return accept_guided_tokens


def patched_cleanup(original: Callable) -> Callable:
    def cleanup_sessions(self, session_ids):
        mgr = self.guided_decoding_manager
        if not _is_ours(mgr):
            return original(self, session_ids)
        for session_id in session_ids:
            mgr.end_session(session_id)

    cleanup_sessions.__wrapped__ = original
    return cleanup_sessions

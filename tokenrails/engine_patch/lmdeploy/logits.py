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
from . import overlap, step_context


INLINE_MAX_ROWS = 8  # guided rows up to which a short step skips the worker thread


def _guided_count(rows: list[Any]) -> int:
    return sum(isinstance(r, GuidedRow) for r in rows)


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
        self.guided_errors: dict[int, GuideError] = {}
        if sampling_inputs.session_to_cleanup:
            self.cleanup_sessions(sampling_inputs.session_to_cleanup)
        rows = step_context.rows(sampling_inputs)  # read once per step (step_context.py)
        self._tr_rows = rows if any(r is not None for r in rows) else []
        for r in self._tr_rows:
            if isinstance(r, GuidedRow):
                guided_decoding_manager.note_round(r.session_id, r.seq_id)

    __init__.__wrapped__ = original
    return __init__


def _prepared(self) -> list[Any]:
    """This step's rows, prepared once per step (shared with the overlapped fill)."""
    if not any(type(r) is not GuidedRow and isinstance(r, GuidedRow) for r in self._tr_rows):
        return self._tr_rows  # nothing left to prepare
    return step_context.prepared(self.guided_decoding_manager, self.sampling_inputs)


def _guided_step(self, scores: torch.Tensor, stream: Any) -> None:
    """Runs in a worker thread: fill + apply the mask, then repair rows left empty."""
    owner = self.guided_decoding_manager
    try:
        mgr = owner.core()
    except GuideError as exc:
        for i, r in enumerate(self._tr_rows):
            if r is not None:
                self.guided_errors[i] = exc
        mgr = None
    # Inference mode is thread-local: this worker thread must re-enter it to write the engine's
    # inference tensors (an EOS repair on them outside it raised and stopped the whole engine).
    with torch.inference_mode(scores.is_inference()):
        if stream is not None:
            with torch.cuda.stream(stream):
                _guided_step_inner(self, mgr, scores)
        else:
            _guided_step_inner(self, mgr, scores)
    self._tr_filled = mgr is not None  # this step's matchers exist: its accept cannot compile


def _guided_step_inner(self, mgr: Any, scores: torch.Tensor) -> None:
    if mgr is not None:
        self._tr_rows = _prepared(self)
    rows = self._tr_rows
    run_rows: list[GuidedRow | None] = [r if isinstance(r, GuidedRow) else None for r in rows]
    if mgr is not None and any(r is not None for r in run_rows):
        filled = overlap.take(run_rows)  # filled during the forward (overlap.py), or None
        statuses = mgr.apply_filled(scores, filled) if filled is not None else mgr.fill_and_apply(scores, run_rows)
        for i, st in enumerate(statuses):
            if st is not None and st.error is not None:
                self.guided_errors[i] = st.error
    for i, r in enumerate(rows):
        if isinstance(r, GuideError):
            self.guided_errors[i] = r
    eos_ids = mgr.vocab.eos_ids if mgr is not None else _fallback_eos(self)
    if mgr is not None and _may_empty_rows(self.sampling_inputs):
        idx = [i for i, r in enumerate(run_rows) if r is not None and i not in self.guided_errors]
        if idx:
            empty = torch.isneginf(scores[idx]).all(dim=1).tolist()
            for i, is_empty in zip(idx, empty):
                if not is_empty:
                    continue
                r = run_rows[i]
                if mgr.may_end(r):
                    scores[i, eos_ids[0]] = 0.0  # the output is complete: end it
                else:
                    self.guided_errors[i] = InvalidGuideError(
                        "no token is allowed by both the constraint and the request's bad words / "
                        "stop words / logits processors")
    for i in self.guided_errors:
        eos_only_(scores, i, eos_ids)


def _fallback_eos(self) -> tuple[int, ...]:
    sw = self.sampling_inputs.stop_words
    if sw is not None and sw.numel():
        return (int(sw.reshape(-1)[0].item()),)
    return (0,)


def _fill_is_short(self, scores: torch.Tensor) -> bool:
    """Logits on the CPU, no overlapped fill pending, and nothing the fill could wait for (the
    vocabulary is built and every guided row's constraint compiled): the fill of at most
    ``INLINE_MAX_ROWS`` rows is then shorter than the hop to a worker thread and back, which on a
    CPU forward also hands the GIL around (the CPU path at batch 1: see docs/lmdeploy.md)."""
    if scores.is_cuda or overlap.PREFILL.get() is not None:
        return False
    owner = self.guided_decoding_manager
    if not owner.ready:
        return False
    try:
        mgr = owner.core(wait=False)
    except GuideError:
        return True  # every row fails at once: nothing to wait for
    return mgr is not None and mgr.compiled([r for r in self._tr_rows if isinstance(r, GuidedRow)])


def patched_call(original: Callable) -> Callable:
    async def __call__(self, scores: torch.Tensor):
        scores, logprobs = await original(self, scores)
        rows = getattr(self, "_tr_rows", None)
        if not rows:
            return scores, logprobs
        ctx = step_context.current()
        if ctx is not None and ctx.skip_guided:
            return scores, logprobs
        run_rows = [r if isinstance(r, GuidedRow) else None for r in rows]
        if _guided_count(rows) <= INLINE_MAX_ROWS and (overlap.ready(run_rows) or _fill_is_short(self, scores)):
            overlap.STATS.inline += 1
            _guided_step(self, scores, None)  # the current stream, this thread
            step_context.report(self.guided_errors)
            return scores, logprobs
        stream = None
        if scores.is_cuda:
            await self._wait_stream_once()
            stream = torch.cuda.current_stream()
        await asyncio.to_thread(_guided_step, self, scores, stream)
        step_context.report(self.guided_errors)
        return scores, logprobs

    __call__.__wrapped__ = original
    return __call__


def _accept(self, token_ids: list[int]) -> None:
    if not any(isinstance(r, GuidedRow) for r in self._tr_rows):
        return
    mgr = self.guided_decoding_manager.core()
    self._tr_rows = _prepared(self)  # the step's prepared rows: no work after a fill
    rows = [r if isinstance(r, GuidedRow) and i not in self.guided_errors else None
            for i, r in enumerate(self._tr_rows)]
    if not any(r is not None for r in rows):
        return
    for i, st in enumerate(mgr.accept_tokens(token_ids, rows)):
        if st is not None and st.state in (StepStatus.REJECTED, StepStatus.ERROR):
            self.guided_errors[i] = st.error or InvalidGuideError("guided token rejected")


def patched_accept(original: Callable) -> Callable:
    async def accept_guided_tokens(self, next_token_ids: torch.Tensor):
        rows = getattr(self, "_tr_rows", None)
        if rows is None:
            return await original(self, next_token_ids)
        if not rows:
            return None
        ctx = step_context.current()
        if ctx is not None and ctx.skip_guided:
            return None  # the token of a non-last chunk is thrown away: never feed it to matchers
        if not next_token_ids.is_cuda and _guided_count(rows) <= INLINE_MAX_ROWS \
                and getattr(self, "_tr_filled", False):
            _accept(self, next_token_ids.reshape(-1).tolist())
            step_context.report(self.guided_errors)
            return None
        ready = None
        if next_token_ids.is_cuda:
            ready = torch.cuda.Event()
            ready.record()

        def run() -> None:
            if ready is not None:
                ready.synchronize()
            _accept(self, next_token_ids.reshape(-1).tolist())

        await asyncio.to_thread(run)
        step_context.report(self.guided_errors)
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

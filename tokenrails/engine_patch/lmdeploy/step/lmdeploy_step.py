"""One LMDeploy engine step: its guided state (``LMDeployStep``) and the patches that drive it.

An engine step enters tokenrails through LMDeploy's calls only: the sampling strategy (writes each
row's identity into ``session_ctx``), the agent's ``_async_step`` (opens the step), the logits
processor's ``__init__`` / ``__call__`` (mask) / ``accept_guided_tokens`` and the agent's
post-processing (errors finish their sequences). Everything those share lives on the step object,
hung on the rank's manager (``owner.step``) for the step's length: the rows (read once), the
prepared rows (reasoning resolved, prompt read: once per round, memoized by the manager), the
overlapped fill's future, the per-row errors, and whether the fill ran.

* ``session_ctx[i]["tokenrails"]``: a ``GuidedRow``, a ``GuideError`` (that row fails closed) or
  None (unguided). dLLM block expansion also writes the row's sequence index (``SEQ_KEY``).
* The grammar mask is applied *last*, after custom processors, penalties, bad words and stop
  words (masking first and banning words afterwards can leave a row with only illegal tokens).
  A guided row left with no finite logit gets EOS when its output is complete, else a
  ``GuideError`` (EOS-only, finished with an error).
* Fill and accept run on a worker thread unless the work is known to be short (at most
  ``INLINE_MAX_ROWS`` rows on CPU tensors, every constraint compiled, or an overlapped fill
  already done): a compile still running never blocks the event loop. The step lock is the core
  manager's; the loop never waits for it (session ends and round releases are queued).
* Non-last prefill chunks neither fill nor accept (LMDeploy samples and discards a token there),
  nor do rows that stopped before the step (``leave_out``, stopped_rows.py: its output is dropped).
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Callable

import torch

from ....guided.errors import GuideError, InvalidGuideError
from ....guided.sequence import GuidedRow, StepStatus
from ..server import budget_report
from . import overlap
from .agent import attach_errors

CTX_KEY = "tokenrails"
SEQ_KEY = "tokenrails_seq"


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
        from ..server.request_parsing import spec_of

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


INLINE_MAX_ROWS = 8  # guided rows up to which a short step skips the worker thread


class LMDeployStep:
    """Everything the parts of one engine step share (see module doc)."""

    def __init__(self, owner: Any, sampling_inputs: Any, *, skip_guided: bool = False):
        self.owner = owner
        self.inputs = sampling_inputs
        self.rows: list[Any] = rows_from_inputs(sampling_inputs) if sampling_inputs is not None else []
        view = owner.view
        if view.failed:
            self._refail(view.failed)
        self._count_rows()
        self.skip_guided = skip_guided  # non-last prefill chunk: sample nothing into matchers
        self.errors: dict[int, GuideError] = {}  # logits row -> error (finish its sequence)
        self.prefill: tuple[tuple, Any] | None = None  # (row keys, future of FilledMask): overlap.py
        self.filled = False  # the fill ran: every guided row's matcher exists
        self._prepared: list[Any] | None = None
        self._lock = threading.Lock()
        # a row seen for the first time (a new round): note it (releases the previous round's
        # matcher, queued) and start its compile before the forward
        new = [r for r in self.rows if isinstance(r, GuidedRow)
               and view.rounds.get((r.session_id, r.seq_id[0])) != r.seq_id]
        if new:
            for r in new:
                owner.note_round(r.session_id, r.seq_id)
            handed = [r for r in new if getattr(r, "guide", None) is not None]
            if handed:  # compiled in the engine process (engine_grammars.py): not again here
                owner.adopt(handed)
            owner.prefetch({r.spec.key: r.spec for r in new}.values())

    def _refail(self, failed: Any) -> None:
        """A round that failed is failed again, by its error, for every part of this step: its
        ``session_ctx`` entry too (the speculative helper and the proposer read the rows there)."""
        ctx = getattr(self.inputs, "session_ctx", None) or []
        for i, r in enumerate(self.rows):
            err = failed.get((r.session_id, r.seq_id)) if isinstance(r, GuidedRow) else None
            if err is not None:
                self.rows[i] = ctx[i][CTX_KEY] = err

    def leave_out(self, ended: frozenset[int]) -> None:
        """Rows that stopped before this step (stopped_rows.py): no fill, no accept, no error."""
        with self._lock:
            self.rows = [None if i in ended else r for i, r in enumerate(self.rows)]
            self._prepared = None
        self._count_rows()

    def _count_rows(self) -> None:
        """``guided`` (how many rows carry a grammar) and ``budget`` (any with a token budget), from ``rows``."""
        self.guided = sum(isinstance(r, GuidedRow) for r in self.rows)
        self.budget = any(isinstance(r, GuidedRow) and r.max_tokens is not None for r in self.rows)

    def prepared(self) -> list[Any]:
        """The rows with reasoning resolved (``owner.prepare_rows``; memoized per round by the
        manager, so a steady step makes no call). Preparing may wait for the vocabulary and, for
        a row that answers at once with a token budget, its compile: off the event loop unless
        compiled."""
        if self._prepared is None:
            begun = self.owner.view.begun
            rows = [begun.get((r.session_id, r.seq_id), r) if isinstance(r, GuidedRow) else r for r in self.rows]
            if any(isinstance(r, GuidedRow) and (type(r) is not GuidedRow or r.spec.key != o.spec.key)
                   for r, o in zip(rows, self.rows)):
                rows = self.owner.prepare_rows(self.rows)
            with self._lock:
                if self._prepared is None:
                    self._prepared = rows
        return self._prepared

    def run_rows(self) -> list[GuidedRow | None]:
        """The prepared guided rows (None elsewhere), as the core manager's step takes them."""
        return [r if isinstance(r, GuidedRow) else None for r in self.prepared()]

    def fail(self, errors: dict[int, GuideError]) -> None:
        """Record row errors (the first one of a row wins); the manager remembers their rounds."""
        rounds = {}
        for row, err in errors.items():
            if row in self.errors:
                continue
            self.errors[row] = err
            r = self.rows[row] if row < len(self.rows) else None
            if isinstance(r, GuidedRow):
                rounds[(r.session_id, r.seq_id)] = err
        if rounds:
            self.owner.fail_rounds(rounds)

    def seq_errors(self) -> dict[int, GuideError]:
        """The errors keyed by sequence index: a dLLM block's logits rows name their sequence."""
        ctx = getattr(self.inputs, "session_ctx", None) or []
        out: dict[int, GuideError] = {}
        for row, err in sorted(self.errors.items()):
            entry = ctx[row] if row < len(ctx) else None
            out.setdefault(int(entry.get(SEQ_KEY, row)) if entry is not None else row, err)
        return out

    def core(self) -> Any:
        """The core manager, or None when its vocabulary failed (every row then fails closed)."""
        mgr = self.owner.view.core
        if mgr is not None:
            return mgr
        try:
            return self.owner.core()
        except GuideError as exc:
            self.fail({i: exc for i, r in enumerate(self.rows) if r is not None})
            return None

    def compiled(self) -> bool:
        """Nothing this step's fill could wait for: the vocabulary is built and every guided
        row's constraint compiled (or failed)."""
        mgr = self.owner.view.core
        if mgr is None:
            return self.owner.ready  # building: the fill would wait; failed: every row fails at once
        return mgr.compiled([r for r in self.rows if isinstance(r, GuidedRow)])


def report(owner: Any, errors: dict[int, GuideError]) -> None:
    """Record row errors on ``owner``'s open step (no-op outside a step, e.g. in unit use)."""
    step = getattr(owner, "step", None)
    if step is not None:
        step.fail(errors)


def _is_ours(manager: Any) -> bool:
    return bool(getattr(manager, "is_tokenrails", False))


def _is_nonlast_chunk(inputs: Any) -> bool:
    return bool(getattr(inputs, "is_chunk", False)) and not bool(getattr(inputs, "is_last_chunk", True))


# ---- the agent: open the step around the whole engine step -----------------------------------
def patched_async_step(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _async_step(self, *args, **kwargs):
        owner = getattr(self, "guided_decoding_manager", None)
        if not _is_ours(owner):
            return await original(self, *args, **kwargs)
        bound = sig.bind_partial(self, *args, **kwargs).arguments
        inputs = bound.get("inputs")
        step = owner.step = LMDeployStep(owner, bound.get("sampling_inputs"), skip_guided=_is_nonlast_chunk(inputs))
        if step.guided >= overlap.CPU_MIN_ROWS or (step.guided and str(getattr(self, "device", "")) != "cpu"):
            overlap.start(self, step, inputs)  # the mask fills while the model runs
        try:
            return await original(self, *args, **kwargs)
        finally:
            if owner.step is step:
                owner.step = None

    _async_step.__wrapped__ = original
    return _async_step


def patched_postprocess(original: Callable) -> Callable:
    sig = inspect.signature(original)

    async def _step_postprocess_with_output(self, *args, **kwargs):
        owner = getattr(self, "guided_decoding_manager", None)
        if not _is_ours(owner):
            return await original(self, *args, **kwargs)
        step = opened = owner.step
        if step is None:  # called without the step wrapper (a subclass's own step)
            bound = sig.bind_partial(self, *args, **kwargs).arguments
            step = owner.step = LMDeployStep(owner, bound.get("sampling_inputs"),
                                             skip_guided=_is_nonlast_chunk(bound.get("inputs")))
        try:
            result = await original(self, *args, **kwargs)
        finally:
            if opened is None:
                owner.step = None
        if not step.skip_guided and result[-1] is not None:
            if step.errors:
                attach_errors(result[-1], step.seq_errors())
            if step.budget:
                flags = budget_report.row_flags(owner, step.rows)
                if flags:
                    setattr(result[-1], budget_report.ATTR, flags)
        return result

    _step_postprocess_with_output.__wrapped__ = original
    return _step_postprocess_with_output


# ---- the logits processor --------------------------------------------------------------------
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


def _fallback_eos(si: Any) -> tuple[int, ...]:
    sw = si.stop_words
    if sw is not None and sw.numel():
        return (int(sw.reshape(-1)[0].item()),)
    return (0,)


def patched_init(original: Callable) -> Callable:
    def __init__(self, sampling_inputs, logprobs_mode=None, guided_decoding_manager=None):
        if not _is_ours(guided_decoding_manager):
            return original(self, sampling_inputs, logprobs_mode, guided_decoding_manager)
        self.sampling_inputs = sampling_inputs
        self.logprobs_mode = logprobs_mode
        self.guided_decoding_manager = guided_decoding_manager
        self.guided_processors = {}  # stock paths see no xgrammar matchers
        if sampling_inputs.session_to_cleanup:
            for session_id in sampling_inputs.session_to_cleanup:
                guided_decoding_manager.end_session(session_id)  # queued: never waits for a step
        step = guided_decoding_manager.step
        if step is None or step.inputs is not sampling_inputs:  # outside an engine step (unit use)
            step = LMDeployStep(guided_decoding_manager, sampling_inputs)
        self.tokenrails_step = step

    __init__.__wrapped__ = original
    return __init__


def _guided_step(step: LMDeployStep, scores: torch.Tensor, stream: Any) -> None:
    """Fill + apply the mask, then repair rows left empty (on a worker thread unless short)."""
    mgr = step.core()
    # Inference mode is thread-local: a worker thread must re-enter it to write the engine's
    # inference tensors (an EOS repair on them outside it raised and stopped the whole engine).
    with torch.inference_mode(scores.is_inference()):
        if stream is not None:
            with torch.cuda.stream(stream):
                _mask(step, mgr, scores)
        else:
            _mask(step, mgr, scores)
    step.filled = mgr is not None  # this step's matchers exist: its accept cannot compile


def _mask(step: LMDeployStep, mgr: Any, scores: torch.Tensor) -> None:
    errors = step.errors
    rows = step.prepared() if mgr is not None else step.rows
    run_rows = [r if isinstance(r, GuidedRow) else None for r in rows]
    if mgr is not None and step.guided:
        filled = overlap.take(step, run_rows) if step.prefill is not None else None
        statuses = mgr.apply_filled(scores, filled) if filled is not None else mgr.fill_and_apply(scores, run_rows)
        step.fail({i: st.error for i, st in enumerate(statuses)
                   if st is not None and st.error is not None and run_rows[i] is not None})
    step.fail({i: r for i, r in enumerate(rows) if isinstance(r, GuideError)})
    eos_ids = mgr.vocab.eos_ids if mgr is not None else _fallback_eos(step.inputs)
    if mgr is not None and step.guided and _may_empty_rows(step.inputs):
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


def _is_short(step: LMDeployStep, scores: torch.Tensor) -> bool:
    """The guided work of this step is shorter than a hop to a worker thread and back (which on
    a CPU forward also hands the GIL around): at most ``INLINE_MAX_ROWS`` rows, and either the
    overlapped fill is done, or CPU logits and nothing the fill could wait for."""
    if step.guided > INLINE_MAX_ROWS:
        return False
    if step.prefill is not None:
        return step.prefill[1].done()
    return not scores.is_cuda and step.compiled()


def patched_call(original: Callable) -> Callable:
    async def __call__(self, scores: torch.Tensor):
        scores, logprobs = await original(self, scores)
        step = getattr(self, "tokenrails_step", None)
        if step is None or step.skip_guided or not any(r is not None for r in step.rows):
            return scores, logprobs
        if _is_short(step, scores):
            overlap.STATS.inline += 1
            _guided_step(step, scores, None)  # the current stream, this thread
            return scores, logprobs
        stream = None
        if scores.is_cuda:
            await self._wait_stream_once()
            stream = torch.cuda.current_stream()
        await asyncio.to_thread(_guided_step, step, scores, stream)
        return scores, logprobs

    __call__.__wrapped__ = original
    return __call__


def _accept(step: LMDeployStep, token_ids: list[int]) -> None:
    rows = [r if i not in step.errors else None for i, r in enumerate(step.run_rows())]
    if not any(r is not None for r in rows):
        return
    statuses = step.core().accept_tokens(token_ids, rows)
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

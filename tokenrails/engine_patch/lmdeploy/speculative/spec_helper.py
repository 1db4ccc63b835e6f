"""Speculative decoding (``GuidedSpecHelper``) on tokenrails: exact rollback, no matcher forks.

Stock LMDeploy forks every guided matcher twice per step (draft side and target side). Here:

* ``get_processors`` returns light handles; ``handle.fork()`` (called by LMDeploy's spec agent)
  returns a *draft cursor* that advances the sequence's own matcher and remembers how far.
* Before any target-side work (serial masks, accepting verified tokens, the next
  ``get_processors``) every outstanding cursor is rolled back exactly.
* Target verification uses the manager's ``fill_and_apply_spec`` (one mask row per position,
  tentative accept + rollback) and ``accept_tokens_spec``; failures are reported per row.
* Thread hops: a short step (``short``: at most ``INLINE_MAX_ROWS`` rows, CPU tensors, every
  constraint compiled) runs its guided work on the event loop's thread, as the plain step does.
  Otherwise the accept and the step's proposal (``SpecState.follow``, set by a proposer that
  proposes from the accepted state) share one hop: the proposal is left in ``SpecState.planned``.
* Rows that stopped get no handle: LMDeploy sends a step before it reads the previous one's
  outputs, so a row that ended (EOS, stop word, length) runs one more step, whose output the engine
  drops (``step/stopped_rows.py`` marks such rows); the step then proposes, masks and accepts
  nothing for the row (its matcher's round has ended).
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any, Callable

import torch

from ....guided.bitmask import MaskBuffer
from ....guided.errors import GuideError
from ....guided.sequence import GuidedRow
from ..step.lmdeploy_step import report, rows_of_ctx
from ..step import lmdeploy_step
from ..step.stopped_rows import stopped
from . import draft_ahead

# guided rows up to which a spec step runs its guided work inline (the plain step's limit): below
# it a hop to a worker thread and back costs more than the work it carries
INLINE_MAX_ROWS = lmdeploy_step.INLINE_MAX_ROWS


class RowHandle:
    """One guided row of a speculative step (what LMDeploy calls a processor).

    ``fork()`` gives a draft cursor: the manager's ``DraftCursor`` walks the sequence through
    its drafts (matcher advanced tentatively, thinking state carried along, so a reasoning row's
    drafts are masked and read exactly like its real tokens) under the manager's step lock, and
    is rolled back exactly before any target-side work.
    """

    def __init__(self, helper: "SpecState", row: GuidedRow | None, error: GuideError | None):
        self.helper = helper
        self.raw = row
        self.error = error
        self._row: GuidedRow | None = None
        self._cursor: Any = None

    @property
    def row(self) -> GuidedRow | None:
        """The prepared row (reasoning resolved, prompt read); None when the row failed."""
        if self._row is None and self.error is None and self.raw is not None:
            prepared = self.helper.owner.prepare_row(self.raw)
            if isinstance(prepared, GuideError):
                self.error = prepared
            else:
                self._row = prepared
        return self._row

    def cursor(self):
        """This handle's draft cursor (made on first use; holds the row's state)."""
        if self._cursor is None:
            row = self.row
            self._cursor = self.helper.owner.core().draft_cursor(row, self.error)
        if self._cursor.error is not None:
            self.error = self._cursor.error
        return self._cursor

    def fork(self) -> "RowHandle":
        """A draft cursor on the same sequence (rolled back before verification)."""
        cur = RowHandle(self.helper, self.raw, self.error)
        cur._row = self._row
        self.helper.track(cur)
        return cur

    def is_terminated(self) -> bool:
        done = self.cursor().is_terminated()
        self.error = self.error or self._cursor.error
        return done

    def fill(self, bitmask: torch.Tensor, index: int) -> None:
        self.cursor().fill(bitmask, index, self.helper.owner.core().vocab.eos_ids)
        self.error = self.error or self._cursor.error

    def accept_draft(self, token: int) -> None:
        self.cursor().advance(int(token))

    def rollback(self) -> None:
        if self._cursor is not None:
            self._cursor.rollback()


class SpecState:
    """Per-helper bookkeeping: outstanding cursors and the draft side's mask buffer."""

    def __init__(self, owner: Any):
        self.owner = owner
        self._cursors: list[RowHandle] = []
        self._lock = threading.Lock()
        self._buffer: MaskBuffer | None = None
        # the step's proposal, made right after the accept (same hop): follow(handles, batch) -> plan
        self.follow: Callable[[dict, int], Any] | None = None
        self.ctx: Any = None  # the session_ctx of the step the handles were made for
        self.planned: tuple[Any, Any] | None = None  # (ctx, plan) left by ``follow``
        # the next verification's masks, filled beside its forward (``draft_ahead.prefill_enabled``)
        self.prefill: Future | None = None

    def take_planned(self, ctx: Any) -> Any:
        """The proposal made after this step's accept (None when there was none for ``ctx``)."""
        planned, self.planned = self.planned, None
        if planned is None or planned[0] is not ctx:
            return None
        return planned[1]

    def take_prefill(self) -> Any:
        """The masks filled ahead for this verification (joined), or None."""
        fut, self.prefill = self.prefill, None
        if fut is None:
            return None
        try:
            return fut.result()
        except Exception:  # noqa: BLE001 - the verification fills its masks itself, and reports a failure
            return None

    def short(self, processors: dict, tensor: torch.Tensor | None = None) -> bool:
        """The step's guided work is shorter than a hop to a worker thread and back: at most
        ``INLINE_MAX_ROWS`` rows, CPU tensors (``tensor``: the step's, when it has one), and no
        compile a fill, accept or proposal could wait for."""
        if (tensor is not None and tensor.is_cuda) or len(processors) > INLINE_MAX_ROWS:
            return False
        core = self.owner.view.core
        return core is not None and core.compiled([h.raw for h in processors.values()])

    def track(self, cur: RowHandle) -> None:
        with self._lock:
            self._cursors.append(cur)

    def rollback_all(self) -> None:
        with self._lock:
            cursors, self._cursors = self._cursors, []
        for cur in cursors:
            cur.rollback()

    def buffer(self, vocab_size: int) -> MaskBuffer:
        buf = self._buffer
        if buf is None or buf.vocab_size != vocab_size:
            buf = self._buffer = MaskBuffer(vocab_size)
        return buf


def state_of(helper: Any) -> SpecState | None:
    owner = getattr(helper, "_mgr", None)
    if not getattr(owner, "is_tokenrails", False):
        return None
    st = helper.__dict__.get("_tokenrails_state")
    if st is None or st.owner is not owner:
        st = SpecState(owner)
        helper.__dict__["_tokenrails_state"] = st
    return st


def patched_get_processors(original: Callable) -> Callable:
    def get_processors(self, session_ctx, response_formats):
        st = state_of(self)
        if st is None:
            return original(self, session_ctx, response_formats)
        st.rollback_all()
        st.ctx, st.planned = session_ctx, None
        if session_ctx is None:
            return {}
        ended = stopped(st.owner, session_ctx)
        out = {}
        for i, r in enumerate(rows_of_ctx(session_ctx, len(session_ctx))):
            if i in ended:
                continue
            if isinstance(r, GuidedRow):
                st.owner.note_round(r.session_id, r.seq_id)
                out[i] = RowHandle(st, r, None)
            elif isinstance(r, GuideError):
                out[i] = RowHandle(st, None, r)
        return out

    get_processors.__wrapped__ = original
    return get_processors


def patched_cleanup(original: Callable) -> Callable:
    def cleanup_sessions(self, session_ids):
        st = state_of(self)
        if st is None:
            return original(self, session_ids)
        for sid in session_ids or ():
            st.owner.end_session(sid)

    cleanup_sessions.__wrapped__ = original
    return cleanup_sessions


def _fill_handles(st: SpecState, processors: dict, batch: int, device: torch.device) -> torch.Tensor:
    """The draft step's full-batch mask (unguided rows allow everything), on ``device``."""
    buffer = st.buffer(st.owner.core().vocab.vocab_size)
    bm = buffer.rows(batch, device)
    bm.fill_(-1)
    for idx, h in processors.items():
        h.fill(bm, idx)
    return buffer.to_device(bm, device)


def patched_prepare_bitmask(original: Callable) -> Callable:
    async def prepare_bitmask(self, logits, processors):
        st = state_of(self)
        if st is None:
            return await original(self, logits, processors)
        if not processors:
            return None
        if st.short(processors, logits):
            return _fill_handles(st, processors, logits.size(0), logits.device)
        return await asyncio.to_thread(_fill_handles, st, processors, logits.size(0), logits.device)

    prepare_bitmask.__wrapped__ = original
    return prepare_bitmask


def patched_apply_bitmask(original: Callable) -> Callable:
    def apply_bitmask(self, logits, bitmask):
        st = state_of(self)
        if st is None:
            return original(self, logits, bitmask)
        if bitmask is None:
            return None
        with torch.inference_mode():
            width = min(logits.shape[-1], bitmask.shape[-1] * 32)
            st.buffer(st.owner.core().vocab.vocab_size).apply(logits, bitmask, None, vocab_size=width)
        return None

    apply_bitmask.__wrapped__ = original
    return apply_bitmask


def patched_accept_draft(original: Callable) -> Callable:
    async def accept_draft_tokens(self, draft_token_ids, processors):
        st = state_of(self)
        if st is None:
            return await original(self, draft_token_ids, processors)
        if not processors:
            return None
        ids = draft_token_ids[:, 0].tolist()

        def run() -> None:
            for idx, h in processors.items():
                h.accept_draft(ids[idx])

        await asyncio.to_thread(run)
        return None

    accept_draft_tokens.__wrapped__ = original
    return accept_draft_tokens


def _report(processors: dict, statuses: list) -> None:
    errors = {}
    for idx, h in processors.items():
        if h.error is not None:
            errors[idx] = h.error
    for i, s in enumerate(statuses):
        if s is not None and s.failed and s.error is not None:
            errors.setdefault(i, s.error)
    if processors:
        report(next(iter(processors.values())).helper.owner, errors)


def patched_serial_bitmask(original: Callable) -> Callable:
    async def apply_serial_bitmask(self, scores_3d, processors, draft_token_ids, num_spec_tokens):
        st = state_of(self)
        if st is None:
            return await original(self, scores_3d, processors, draft_token_ids, num_spec_tokens)
        if not processors:
            return None
        st.rollback_all()
        batch, num_expand = scores_3d.size(0), scores_3d.size(1)
        drafts_all = draft_token_ids[:, : num_expand - 1].tolist()
        stream = torch.cuda.current_stream() if scores_3d.is_cuda else None

        def run():
            ahead = st.take_prefill()  # joined here: off the event loop when the step hops
            mgr = st.owner.core()
            rows = [processors[i].row if i in processors else None for i in range(batch)]
            flat = scores_3d.view(batch * num_expand, -1)
            with torch.inference_mode(), (torch.cuda.stream(stream) if stream is not None else nullcontext()):
                statuses = mgr.apply_filled_spec(flat, ahead, rows, drafts_all) if ahead is not None else None
                if ahead is not None:
                    draft_ahead.record_prefill(statuses is not None)
                return statuses if statuses is not None else mgr.fill_and_apply_spec(flat, rows, drafts_all)

        statuses = run() if st.short(processors, scores_3d) else await asyncio.to_thread(run)
        _report(processors, statuses)
        return None

    apply_serial_bitmask.__wrapped__ = original
    return apply_serial_bitmask


def patched_accept_rejection(original: Callable) -> Callable:
    async def accept_rejection_sampled_tokens(self, processors, num_rejected, output_token_ids,
                                              next_token_ids, num_spec_tokens):
        st = state_of(self)
        if st is None:
            return await original(self, processors, num_rejected, output_token_ids, next_token_ids,
                                  num_spec_tokens)
        if not processors:
            return None
        st.rollback_all()
        n_rej = num_rejected.reshape(-1).tolist()
        outs = output_token_ids.tolist()
        nxt = next_token_ids.reshape(-1).tolist()
        batch = len(nxt)

        def run():
            rows: list[GuidedRow | None] = [None] * batch
            accepted: list[list[int]] = [[] for _ in range(batch)]
            for idx, h in processors.items():
                if h.row is None or h.error is not None:
                    continue
                valid = num_spec_tokens - int(n_rej[idx])
                toks = [int(t) for t in outs[idx][:valid] if int(t) >= 0]
                accepted[idx] = toks + [int(nxt[idx])]
                rows[idx] = h.row
            statuses = st.owner.core().accept_tokens_spec(accepted, rows)
            follow, ctx = st.follow, st.ctx
            if follow is not None:
                for i, s in enumerate(statuses):
                    if s is not None and s.failed and i in processors:
                        processors[i].error = processors[i].error or s.error or GuideError("guided token rejected")
                try:
                    st.planned = (ctx, follow(processors, batch))
                except Exception:  # noqa: BLE001 - the proposer proposes again itself and reports it
                    st.planned = None
            return statuses

        statuses = run() if st.short(processors, num_rejected) else await asyncio.to_thread(run)
        _report(processors, statuses)
        return None

    accept_rejection_sampled_tokens.__wrapped__ = original
    return accept_rejection_sampled_tokens

"""One LMDeploy engine step's guided state, and the one owner of ``session_ctx``'s tokenrails entry.

* ``session_ctx[i]["tokenrails"]`` is written once per row by the strategy patch (``put``) and
  read only here: a ``GuidedRow`` (constraint + round-aware identity), a ``GuideError`` (that row
  fails closed), or None (unguided). dLLM block expansion also writes the row's sequence index
  (``SEQ_KEY``): a block of logits rows belongs to one sequence.
* ``LMDeployStep`` is opened by the agent patch around one engine step (forward, sampling,
  accept) and hung on the rank's manager (``owner.step``), where the forward wrapper, the logits
  processor and the post-processing find it: the step's rows (read once), its prepared rows
  (reasoning resolved, prompt read: once), the overlapped fill's future, the per-row errors, and
  whether the step's fill ran (its matchers exist, so its accept cannot compile).
"""
from __future__ import annotations

import threading
from typing import Any

from ...guided.errors import GuideError, InvalidGuideError
from ...guided.sequence import GuidedRow

CTX_KEY = "tokenrails"
SEQ_KEY = "tokenrails_seq"


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


def row_keys(rows: list[Any]) -> tuple:
    return tuple((r.session_id, r.seq_id, r.spec.key) if isinstance(r, GuidedRow) else None for r in rows)


class LMDeployStep:
    """Everything the parts of one engine step share (see module doc)."""

    def __init__(self, owner: Any, sampling_inputs: Any, *, skip_guided: bool = False):
        self.owner = owner
        self.inputs = sampling_inputs
        self.rows: list[Any] = rows_from_inputs(sampling_inputs) if sampling_inputs is not None else []
        self.skip_guided = skip_guided  # non-last prefill chunk: sample nothing into matchers
        self.errors: dict[int, GuideError] = {}  # logits row -> error (finish its sequence)
        self.prefill: tuple[tuple, Any] | None = None  # (row keys, future of FilledMask) of the overlapped fill
        self.filled = False  # the fill ran: every guided row's matcher exists
        self._prepared: list[Any] | None = None
        self._lock = threading.Lock()

    @property
    def guided(self) -> int:
        return sum(isinstance(r, GuidedRow) for r in self.rows)

    def run_rows(self) -> list[GuidedRow | None]:
        """The prepared guided rows (None elsewhere), as the core manager's step takes them."""
        return [r if isinstance(r, GuidedRow) else None for r in self.prepared()]

    def prepared(self) -> list[Any]:
        """``owner.prepare_rows`` of the rows, once per step (may wait for the vocabulary and,
        for a reasoning row that answers at once, its compile: call it off the event loop unless
        the rows are compiled). Rows with nothing to prepare are returned as they are."""
        if self._prepared is None:
            if not any(type(r) is not GuidedRow and isinstance(r, GuidedRow) for r in self.rows):
                return self.rows
            prepared = self.owner.prepare_rows(self.rows)
            with self._lock:
                if self._prepared is None:
                    self._prepared = prepared
        return self._prepared

    def fail(self, errors: dict[int, GuideError]) -> None:
        """Record row errors (the first one of a row wins)."""
        for row, err in errors.items():
            self.errors.setdefault(row, err)

    def seq_errors(self) -> dict[int, GuideError]:
        """The errors keyed by sequence index: a dLLM block's logits rows name their sequence."""
        ctx = getattr(self.inputs, "session_ctx", None) or []
        out: dict[int, GuideError] = {}
        for row, err in sorted(self.errors.items()):
            entry = ctx[row] if row < len(ctx) else None
            out.setdefault(int(entry.get(SEQ_KEY, row)) if entry is not None else row, err)
        return out


def report(owner: Any, errors: dict[int, GuideError]) -> None:
    """Record row errors on ``owner``'s open step (no-op outside a step, e.g. in unit use)."""
    step = getattr(owner, "step", None)
    if step is not None:
        step.fail(errors)

"""Speculative decoding: masks for every draft position from one matcher, then exact rollback.

For a guided row with drafts ``d_0 … d_{k-1}`` the verifier scores ``k + 1`` positions. Mask row
``j`` is the mask after tentatively accepting ``d_0 … d_{j-1}``; the matcher is advanced once per
draft and rolled back by exactly what was advanced (no matcher copies). Thinking rows look ahead
with the immutable ``ThinkState`` instead, so an end marker among the drafts switches the later
positions to the grammar. An undecided optional-thinking row (see reasoning.py) may feed the
matcher tentatively and roll it back when the start marker completes, also below the sequence's
real state: the look-ahead then re-accepts the sequence's own tokens on exit.

Positions after the first draft the grammar forbids get an EOS-only row: verification rejects
that draft (its target probability is 0 under the mask), so those positions are never sampled —
EOS-only only keeps them finite and safe.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..kernels import apply_token_bitmask_inplace
from ..kernels._common import eos_only_row
from .errors import InvalidGuideError
from .batch_step import GuidedRow, RowStatus, StepStatus
from .reasoning import open_step

if TYPE_CHECKING:
    from .batch_step import BatchedGuidedStep
    from .manager import SequenceState

__all__ = ["Lookahead", "accept_tokens_spec", "count_valid", "fill_and_apply_spec"]


def fill_and_apply_spec(
    step: "BatchedGuidedStep",
    logits: torch.Tensor,
    rows: Sequence[GuidedRow | None],
    drafts: Sequence[Sequence[int]],
) -> list[RowStatus | None]:
    """Fill ``1 + len(drafts[i])`` mask rows per guided row and apply them in one kernel call."""
    if len(drafts) != len(rows):
        raise ValueError(f"{len(drafts)} draft lists for {len(rows)} rows")
    drafts = [[int(t) for t in (d.tolist() if isinstance(d, torch.Tensor) else d)] for d in drafts]
    total = sum(1 + len(d) for d in drafts)
    if logits.dim() != 2 or logits.shape[0] != total:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {total} verification rows")
    mgr = step.manager
    statuses: list[RowStatus | None] = [None] * len(rows)
    blocks = []  # (row index, first logits row, first mask row, state, drafts)
    offset = mask_rows = 0
    for i, (row, d) in enumerate(zip(rows, drafts)):
        if row is not None:
            blocks.append((i, offset, mask_rows, step.state_of(row), d))
            mask_rows += 1 + len(d)
        offset += 1 + len(d)
    if not blocks:
        return statuses
    step._ensure(mask_rows, logits.device)
    bitmask = step._host[:mask_rows]
    valid = [0] * len(blocks)

    def run(lo: int, hi: int) -> None:
        for b in range(lo, hi):
            _, _, base, st, d = blocks[b]
            valid[b] = _fill_block(step, st, d, bitmask, base)

    # Serial on purpose: each block advances and rolls back its own matcher through the drafts,
    # and a Python thread pool over blocks measured slower than serial (the GIL).
    run(0, len(blocks))
    index = step._index_host[:mask_rows]
    index.numpy()[:] = [lo + j for (_, lo, _, _, d) in blocks for j in range(1 + len(d))]
    for b, (i, _, _, st, _) in enumerate(blocks):
        state = StepStatus.ERROR if st.error is not None else StepStatus.OK
        statuses[i] = RowStatus(state, st.error, valid_drafts=valid[b])
    if logits.device.type == "cpu":
        dev_mask, dev_index = bitmask, index
    else:
        buf_mask, buf_index = step._dev[logits.device]
        dev_mask, dev_index = buf_mask[:mask_rows], buf_index[:mask_rows]
        dev_mask.copy_(bitmask, non_blocking=True)
        dev_index.copy_(index, non_blocking=True)
    identity = mask_rows == total
    apply_token_bitmask_inplace(
        logits, dev_mask, indices=None if identity else dev_index, vocab_size=mgr.vocab.vocab_size
    )
    return statuses


def _fill_block(step: "BatchedGuidedStep", st: "SequenceState", drafts: list[int], bitmask: torch.Tensor, base: int) -> int:
    """Fill rows ``base … base+len(drafts)``; return how many leading drafts are allowed."""
    valid = 0
    dead = False
    eos = step.manager.vocab.eos_ids
    with Lookahead(step, st) as walk:
        for j in range(len(drafts) + 1):
            if dead:
                eos_only_row(bitmask[base + j], eos)
                continue
            step.fill_row(st, walk.think, bitmask, base + j)
            if st.error is None and not bool(bitmask[base + j].any()):
                # nothing allowed: an all -inf verification row would fail the engine's sampler
                # for the whole batch. EOS only; at the real position (j == 0) the row ends.
                eos_only_row(bitmask[base + j], eos)
                if j == 0:
                    st.error = InvalidGuideError(
                        "the constraint allows no token here, not even EOS (its language is empty at this point)")
                dead = True
                continue
            if j == len(drafts) or st.error is not None:
                dead = st.error is not None
                continue
            if not walk.advance(drafts[j]):
                dead = True
                continue
            valid += 1
    return valid


class Lookahead:
    """Walks one sequence through draft tokens tentatively (thinking section included) and
    restores its matcher exactly on exit: no matcher copies.

    ``advanced``: tokens accepted on top of the lowest point reached; ``dropped``: tokens of the
    sequence's own history rolled back below its real state (an undecided optional-thinking row
    whose drafts complete the start marker), re-accepted on exit.
    """

    def __init__(self, step: "BatchedGuidedStep", st: "SequenceState"):
        self.step, self.st = step, st
        self.think = st.think
        self.advanced = 0
        self.dropped = 0

    def __enter__(self) -> "Lookahead":
        return self

    def __exit__(self, *exc: object) -> None:
        if not (self.advanced or self.dropped):
            return
        matcher = self.st.matcher
        assert matcher is not None
        if self.advanced:
            matcher.rollback(self.advanced)
        hist = self.st.history
        for t in hist[len(hist) - self.dropped:] if self.dropped else ():
            ok = matcher.accept_token(t)
            assert ok, "re-accepting the sequence's own tokens failed"

    def advance(self, tok: int) -> bool:
        """Take one draft; False (state unchanged) when it is not allowed."""
        moved = _tentative(self.step, self.st, self.think, tok)
        if moved is None:
            return False
        self.think, delta = moved
        if delta >= 0:
            self.advanced += delta
        else:
            undo = min(-delta, self.advanced)
            self.advanced -= undo
            self.dropped += -delta - undo
        return True


def _tentative(step: "BatchedGuidedStep", st: "SequenceState", think, tok: int):
    """Advance by one draft: (new ThinkState, matcher change) or None (illegal, nothing changed)."""
    if think is not None and think.opening:
        assert st.tracker is not None
        matcher = step.manager.resolve_matcher(st)
        if matcher is None:
            return None
        nxt, delta = open_step(st.tracker, matcher, think, tok)
        return None if nxt is None else (nxt, delta)
    if think is not None and not think.done:
        assert st.tracker is not None
        nxt = st.tracker.advance(think, tok)
        return None if nxt is None else (nxt, 0)
    matcher = step.manager.resolve_matcher(st)
    if matcher is None or matcher.is_terminated():
        return None
    return (think, 1) if matcher.accept_token(tok) else None


def count_valid(step: "BatchedGuidedStep", st: "SequenceState", tokens: Sequence[int]) -> int:
    """Leading ``tokens`` allowed from ``st`` (thinking included); the state is left unchanged."""
    if st.error is not None:
        return 0
    think = st.think
    if think is None or think.done:
        matcher = step.manager.resolve_matcher(st)
        return 0 if matcher is None else matcher.validate_tokens([int(t) for t in tokens])
    n = 0
    with Lookahead(step, st) as walk:
        for tok in tokens:
            if not walk.advance(int(tok)):
                break
            n += 1
    return n


def accept_tokens_spec(
    step: "BatchedGuidedStep", accepted: Sequence[Sequence[int]], rows: Sequence[GuidedRow | None]
) -> list[RowStatus | None]:
    """Accept each row's verified tokens in order; stop at the first rejected one (fail closed)."""
    if len(accepted) != len(rows):
        raise ValueError(f"{len(accepted)} token lists for {len(rows)} rows")
    eos = set(step.manager.vocab.eos_ids)
    out: list[RowStatus | None] = [None] * len(rows)
    for i, (toks, row) in enumerate(zip(accepted, rows)):
        if row is None:
            continue
        st = step.state_of(row)
        toks = toks.tolist() if isinstance(toks, torch.Tensor) else list(toks)
        status = RowStatus(StepStatus.ERROR, st.error) if st.error is not None else RowStatus(StepStatus.OK)
        n = 0
        for tok in toks:
            status = step.accept_one(st, int(tok), eos)
            if status.failed:
                break
            n += 1
        out[i] = RowStatus(status.state, status.error, accepted=n)
    return out

"""Speculative decoding: masks for every draft position from one matcher, then exact rollback.

For a guided row with drafts ``d_0 … d_{k-1}`` the verifier scores ``k + 1`` positions. Mask row
``j`` is the mask after tentatively accepting ``d_0 … d_{j-1}``; the sequence is walked through
its drafts with ``sequence.Lookahead`` (matcher advanced once per draft and rolled back by exactly
what was advanced; a reasoning row's position carried along) — no matcher copies.

Positions after the first draft the grammar forbids get an EOS-only row: verification rejects
that draft (its target probability is 0 under the mask), so those positions are never sampled —
EOS-only only keeps them finite and safe.

Drafts a proposer took from the grammar itself (``note_proposal``: the forced run, from this very
state) are verified with what the proposer already saw: at a position where the mask allowed one
token, that token's one-hot row; where it filled a row (the run's end, a forced string's start), a
copy of it; the matcher is walked and filled only where neither is known (inside forced strings,
and at the lookup tokens a proposer put after the run: guesses the grammar allowed, masked here). Such a verifier keeps a
row's tokens up to its run's end only (the engine cuts the rest), so positions past the run get no
mask at all: whatever is sampled there is dropped before anything accepts it.

``DraftCursor``: the same walk kept open across an engine's draft steps (LMDeploy's spec agent
forks a processor per row, feeds it drafts, then verifies); every method runs under the lock the
manager hands in, so a cursor never races the manager's step.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import torch

from .bitmask import MaskBuffer, allowed, bit_value, eos_only_row
from .errors import GuideError, InvalidGuideError
from .forced import NOTHING, ForcedRun, SeenMask, forced_tokens
from .sequence import Lookahead, RowContext, RowStatus, SequenceState, StepStatus

__all__ = ["DraftCursor", "FilledSpec", "accept_tokens_spec", "apply_filled_spec", "fill_and_apply_spec", "fill_spec",
           "note_proposal"]

_PROPOSAL = "proposal"  # SequenceState.extra: ((tokens, history length) when proposed, ForcedRun)


def note_proposal(st: SequenceState, run: ForcedRun) -> None:
    """``run`` (the proposer's drafts from ``st`` as it stands: the forced run, lookup tokens after
    it, the masks it saw, None where it filled none) is the row's drafts for the next verification,
    which keeps the row's tokens up to the run's end only."""
    st.extra[_PROPOSAL] = ((st.tokens, len(st.history)), run)


def _proposed_masks(st: SequenceState, drafts: list[int]) -> list[SeenMask] | None:
    """The masks the proposer saw at positions ``0..len(run)``, when ``drafts`` are its run proposed
    from this very state (taken: one verification per proposal); else None. Not for a row with a
    budget (its rule narrows the grammar's masks) or a failed one."""
    held = st.extra.pop(_PROPOSAL, None)
    if held is None or st.budget is not None or st.error is not None:
        return None
    version, run = held
    n = len(run.tokens)
    if version != (st.tokens, len(st.history)) or len(drafts) < n or tuple(drafts[:n]) != run.tokens:
        return None
    return list(run.masks[: n + 1]) + [None] * (n + 1 - len(run.masks))


@dataclass
class FilledSpec:
    """Verification masks filled before the logits exist (``fill_spec``): ``blocks`` per guided row
    ``(batch index, first mask row, mask rows, state, its (tokens, len(history)) when filled, the
    drafts filled for, whether they were the row's proposed run)``, the masks in host rows of
    ``bitmask``, and the rows' statuses."""

    bitmask: torch.Tensor
    blocks: list[tuple[int, int, int, SequenceState, tuple[int, int], tuple[int, ...], bool]]
    statuses: list[RowStatus | None]

    def fits(self, states: Sequence[SequenceState | None], drafts: Sequence[Sequence[int]]) -> bool:
        """Whether these masks are the ones ``fill_spec`` would fill now for ``states`` and
        ``drafts``: the same guided rows at the same indices, none advanced since, each row's
        drafts over its masked positions the same (a proposed run's verifier masks its run only;
        any other row every position, so its drafts must be the very same)."""
        guided = [i for i, st in enumerate(states) if st is not None]
        if [b[0] for b in self.blocks] != guided:
            return False
        for i, _, n, st, version, filled, proposed in self.blocks:
            d = [int(t) for t in drafts[i]]
            if states[i] is not st or (st.tokens, len(st.history)) != version:
                return False
            if tuple(d[: n - 1]) != filled[: n - 1] or len(d) < n - 1 or (not proposed and len(d) != n - 1):
                return False
        return True


def fill_spec(ctx: RowContext, rows_of: Callable[[int], torch.Tensor], states: Sequence[SequenceState | None],
              drafts: Sequence[Sequence[int]]) -> FilledSpec:
    """The masks of a verification over ``drafts`` (``1 + len(drafts[i])`` rows per guided row,
    ``1 + len(run)`` for a proposed run, ``note_proposal``), filled into ``rows_of(n)`` (n host
    mask rows); applied later with ``apply_filled_spec``, or at once by ``fill_and_apply_spec``."""
    if len(drafts) != len(states):
        raise ValueError(f"{len(drafts)} draft lists for {len(states)} rows")
    drafts = [[int(t) for t in (d.tolist() if isinstance(d, torch.Tensor) else d)] for d in drafts]
    statuses: list[RowStatus | None] = [None] * len(states)
    plan = []  # (row index, first mask row, mask rows, state, drafts, proposed masks)
    mask_rows = 0
    for i, (st, d) in enumerate(zip(states, drafts)):
        if st is not None:
            seen = _proposed_masks(st, d)
            n = len(seen) if seen is not None else 1 + len(d)
            plan.append((i, mask_rows, n, st, d, seen))
            mask_rows += n
    bitmask = rows_of(mask_rows)
    blocks = []
    # Serial on purpose: each block advances and rolls back its own matcher through the drafts,
    # and a Python thread pool over blocks measured slower than serial (the GIL).
    for i, base, n, st, d, seen in plan:
        version = (st.tokens, len(st.history))
        if seen is None:
            valid = _fill_block(ctx, st, d, bitmask, base)
        else:
            valid = _fill_proposed(ctx, st, d, seen, bitmask, base)
        state = StepStatus.ERROR if st.error is not None else StepStatus.OK
        statuses[i] = RowStatus(state, st.error, valid_drafts=valid)
        blocks.append((i, base, n, st, version, tuple(d), seen is not None))
    return FilledSpec(bitmask, blocks, statuses)


def apply_filled_spec(buffer: MaskBuffer, logits: torch.Tensor, filled: FilledSpec,
                      widths: Sequence[int]) -> list[RowStatus | None]:
    """Apply ``filled`` to verification ``logits`` whose row ``i`` owns ``1 + widths[i]``
    consecutive logits rows, in one kernel call."""
    total = sum(1 + w for w in widths)
    if logits.dim() != 2 or logits.shape[0] != total:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {total} verification rows")
    if not filled.blocks:
        return filled.statuses
    starts = [0] * len(widths)
    offset = 0
    for i, w in enumerate(widths):
        starts[i] = offset
        offset += 1 + w
    mask_rows = sum(b[2] for b in filled.blocks)
    identity = mask_rows == total
    index = None if identity else [starts[i] + j for (i, _, n, *_) in filled.blocks for j in range(n)]
    buffer.apply(logits, filled.bitmask[:mask_rows], index)
    return filled.statuses


def fill_and_apply_spec(
    ctx: RowContext,
    buffer: MaskBuffer,
    logits: torch.Tensor,
    states: Sequence[SequenceState | None],
    drafts: Sequence[Sequence[int]],
) -> list[RowStatus | None]:
    """Fill ``1 + len(drafts[i])`` mask rows per guided row (``1 + len(run)`` for a proposed run,
    ``note_proposal``) and apply them in one kernel call."""
    if len(drafts) != len(states):
        raise ValueError(f"{len(drafts)} draft lists for {len(states)} rows")
    widths = [len(d) for d in drafts]
    total = sum(1 + w for w in widths)
    if logits.dim() != 2 or logits.shape[0] != total:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {total} verification rows")
    filled = fill_spec(ctx, lambda n: buffer.rows(n, logits.device), states, drafts)
    return apply_filled_spec(buffer, logits, filled, widths)


def _fill_block(ctx: RowContext, st: SequenceState, drafts: list[int], bitmask: torch.Tensor, base: int) -> int:
    """Fill rows ``base … base+len(drafts)``; return how many leading drafts are allowed."""
    valid = 0
    dead = False
    eos = ctx.eos_ids
    with Lookahead(st) as walk:
        for j in range(len(drafts) + 1):
            if dead:
                eos_only_row(bitmask[base + j], eos)
                continue
            walk.fill(bitmask, base + j)
            if st.error is None and _refused_empty(st, bitmask, base, j, eos):
                dead = True
                continue
            if j == len(drafts) or st.error is not None:
                dead = st.error is not None
                continue
            if st.budget is not None and not (0 <= drafts[j] < bitmask.shape[1] * 32
                                              and allowed(bitmask[base + j], drafts[j])):
                dead = True  # the grammar takes it, the budget rule does not: never past the budget
                continue
            if not walk.advance(drafts[j]):
                dead = True
                continue
            valid += 1
    return valid


def _refused_empty(st: SequenceState, bitmask: torch.Tensor, base: int, j: int, eos: Sequence[int]) -> bool:
    """Whether the filled row ``base + j`` allows nothing. Such a row becomes EOS only (an all -inf
    verification row would fail the engine's sampler for the whole batch); at the real position
    (``j == 0``) the row ends with an error."""
    row = bitmask[base + j]
    if bool(row.numpy().any() if row.is_cpu else row.any()):  # numpy: far cheaper on a host row
        return False
    eos_only_row(bitmask[base + j], eos)
    if j == 0 and st.error is None:
        st.error = InvalidGuideError(
            "the constraint allows no token here, not even EOS (its language is empty at this point)")
    return True


def _fill_proposed(ctx: RowContext, st: SequenceState, drafts: list[int], seen: list[SeenMask],
                   bitmask: torch.Tensor, base: int) -> int:
    """Rows ``base … base+len(run)`` for a proposed run (``seen``: its masks there): known rows
    written (host rows, through numpy), the matcher walked only up to a position it must fill."""
    host = bitmask.numpy()
    words = host.shape[1]
    eos = ctx.eos_ids
    run = len(seen) - 1
    with Lookahead(st) as walk:
        for j, mask in enumerate(seen):
            if isinstance(mask, int):
                host[base + j] = 0
                host[base + j, mask >> 5] = bit_value(mask & 31)
                continue
            if mask is not None and mask.shape[0] == words:
                host[base + j] = mask
                continue
            while walk.advanced < j and walk.advance(drafts[walk.advanced]):
                pass
            if walk.advanced < j:  # not the proposer's own run after all: refuse the rest
                for i in range(j, run + 1):
                    eos_only_row(bitmask[base + i], eos)
                return walk.advanced
            walk.fill(bitmask, base + j)
            empty = _refused_empty(st, bitmask, base, j, eos)
            if empty or st.error is not None:
                for i in range(j + 1, run + 1):
                    eos_only_row(bitmask[base + i], eos)
                return j
    return run


def accept_tokens_spec(
    accepted: Sequence[Sequence[int]], states: Sequence[SequenceState | None]
) -> list[RowStatus | None]:
    """Accept each row's verified tokens in order; stop at the first rejected one (fail closed)."""
    if len(accepted) != len(states):
        raise ValueError(f"{len(accepted)} token lists for {len(states)} rows")
    out: list[RowStatus | None] = [None] * len(states)
    for i, (toks, st) in enumerate(zip(accepted, states)):
        if st is not None:
            out[i] = st.accept_many(toks.tolist() if isinstance(toks, torch.Tensor) else list(toks))
    return out


class DraftCursor:
    """One guided row walked through an engine's drafts, restored exactly by ``rollback``.

    ``lock``: the manager's step lock; held by every method, so the walk never interleaves with
    a step on the same matchers. ``error``: the row's failure once known (the row is then EOS
    only and never advanced).
    """

    def __init__(self, st: SequenceState | None, lock: ContextManager[Any] | None = None,
                 error: GuideError | None = None):
        self.st = st
        self.error = error if error is not None else (st.error if st is not None else None)
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._walk: Lookahead | None = None
        self.dead = False

    def _live(self) -> SequenceState | None:
        st = self.st
        if st is None or self.error is not None:
            return None
        if st.error is not None:
            self.error = st.error
            return None
        return st

    def is_terminated(self) -> bool:
        with self._lock:
            st = self._live()
            if st is None:
                return True
            walk = self._walk if self._walk is not None else Lookahead(st)
            done = walk.terminated()
            if st.error is not None:
                self.error = st.error
            return done

    def fill(self, bitmask: torch.Tensor, index: int, eos_ids: Sequence[int]) -> None:
        """Write the row's mask after the drafts taken so far into ``bitmask[index]``."""
        with self._lock:
            st = self._live()
            if st is None:
                eos_only_row(bitmask[index], eos_ids)
                return
            (self._walk if self._walk is not None else Lookahead(st)).fill(bitmask, index)
            if st.error is not None:
                self.error = st.error

    def advance(self, token: int) -> None:
        """Take one draft; a draft the grammar refuses ends the walk (verification rejects it)."""
        with self._lock:
            if self.dead:
                return
            st = self._live()
            if st is None:
                self.dead = True
                return
            if self._walk is None:
                self._walk = Lookahead(st)
            if not self._walk.advance(int(token)):
                self.dead = True  # nothing to undo for this draft

    def forced(self, max_tokens: int, *, encode: Any = None, bitmask: torch.Tensor | None = None) -> ForcedRun:
        """The tokens the grammar forces from where the walk stands (``forced.forced_tokens``,
        peek only: the walk is where it was afterwards). Nothing for a dead walk, a failed row,
        or one that has not begun its answer (a thinking section is the model's own text)."""
        with self._lock:
            st = self._live()
            if st is None or self.dead or not st.answering:
                return NOTHING
            matcher = st.resolve()
            if matcher is None:
                return NOTHING
            return forced_tokens(matcher, max_tokens, encode=encode, bitmask=bitmask)

    def rollback(self) -> None:
        """Restore the sequence exactly as before the first draft."""
        with self._lock:
            walk, self._walk = self._walk, None
            if walk is not None:
                walk.restore()
            self.dead = False

"""The batched guided step: one persistent bitmask, fill only guided rows, one kernel call.

Per decoding step an engine (through the manager) calls ``fill`` + ``apply`` before sampling and
``accept`` after, with one ``SequenceState`` per logits row (None: unguided, never touched). The
step knows states and the mask buffer, nothing else: each row's transitions are the state's own
(sequence.py). A row whose constraint failed or whose sampled token was rejected is failed
closed: from then on it may only emit EOS, and its status carries the error for the engine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .bitmask import MaskBuffer, empty_rows, eos_only_row
from .errors import InvalidGuideError
from .sequence import OK, RowContext, RowStatus, SequenceState, StepStatus

__all__ = ["BatchedGuidedStep", "FilledMask", "default_fill_threads"]


def default_fill_threads() -> int:
    import os

    cpus = os.cpu_count() or 1
    return 1 if cpus < 4 else min(8, cpus // 2)


@dataclass(frozen=True)
class FilledMask:
    """A step's filled mask, not yet applied: ``bitmask[j]`` masks logits row ``index[j]`` of a
    batch of ``rows`` logits rows."""

    rows: int
    bitmask: torch.Tensor
    index: list[int]
    statuses: list[RowStatus | None]


class BatchedGuidedStep:
    """Fills, applies and accepts the guided rows of one step, given their states."""

    def __init__(
        self,
        ctx: RowContext,
        buffer: MaskBuffer,
        *,
        fill_threads: int | None = None,
        parallel_fill_threshold: int = 64,
    ):
        self.ctx = ctx
        self.buffer = buffer
        # Threads for one backend's native batch fill (xgrammar's and llguidance's pools), used
        # for groups of at least ``parallel_fill_threshold`` rows. None: 1 below 4 CPUs (threads
        # measured slower there), else half the CPUs up to 8.
        self.parallel_fill_threshold = max(1, parallel_fill_threshold)
        self.fill_threads = max(1, fill_threads if fill_threads is not None else default_fill_threads())

    # ---- step ------------------------------------------------------------------------------
    def fill(self, states: Sequence[SequenceState | None], buffer: torch.Tensor | None = None) -> FilledMask:
        """The mask of every guided row, nothing applied yet. Depends only on tokens already
        accepted, so an engine may run it while the model computes the logits (overlap).
        ``buffer``: where to write (default: a fresh tensor, so a fill running beside the
        step's own buffer never shares memory with it)."""
        guided = [(i, st) for i, st in enumerate(states) if st is not None]
        statuses: list[RowStatus | None] = [None] * len(states)
        k = len(guided)
        if buffer is None or buffer.shape[0] < k:
            buffer = torch.empty((max(k, 1), self.buffer.words), dtype=torch.int32)
        bitmask = buffer[:k]
        if k:
            owned = [st for _, st in guided]
            self._fill_grouped(owned, bitmask)
            self._end_empty_rows(owned, bitmask)
            for i, st in guided:
                statuses[i] = RowStatus(StepStatus.ERROR, st.error) if st.error is not None else OK
        return FilledMask(len(states), bitmask, [i for i, _ in guided], statuses)

    def fill_in_place(self, states: Sequence[SequenceState | None]) -> FilledMask:
        """``fill`` into the step's persistent buffer (no allocation in steady state)."""
        k = sum(st is not None for st in states)
        return self.fill(states, self.buffer.rows(max(k, 1)))

    def apply(self, logits: torch.Tensor, filled: FilledMask) -> list[RowStatus | None]:
        """One kernel call: row ``filled.index[j]`` of ``logits`` gets mask row ``j``."""
        if logits.dim() != 2 or logits.shape[0] != filled.rows:
            raise ValueError(f"logits {tuple(logits.shape)} do not match {filled.rows} rows")
        k = len(filled.index)
        if k:
            identity = k == filled.rows
            self.buffer.apply(logits, filled.bitmask, None if identity else filled.index)
        return list(filled.statuses)

    def fill_and_apply(self, logits: torch.Tensor, states: Sequence[SequenceState | None]) -> list[RowStatus | None]:
        if logits.dim() != 2 or logits.shape[0] != len(states):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(states)} rows")
        return self.apply(logits, self.fill_in_place(states))

    def accept(self, token_ids: Sequence[int] | torch.Tensor, states: Sequence[SequenceState | None]) -> list[RowStatus | None]:
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.reshape(-1).tolist()
        if len(token_ids) != len(states):
            raise ValueError(f"{len(token_ids)} tokens for {len(states)} rows")
        return [st.accept(int(tok)) if st is not None else None for tok, st in zip(token_ids, states)]

    # ---- fill internals ---------------------------------------------------------------------
    def _end_empty_rows(self, states: list[SequenceState], bitmask: torch.Tensor) -> None:
        """A row that allows no token at all (an empty language, a dead end no token can leave)
        would be all -inf after the apply and make the engine's sampler fail for the whole batch.
        Such a row ends alone instead: EOS only, with an error status (one vectorized pass)."""
        for j in empty_rows(bitmask):
            st = states[j]
            if st.error is None:
                st.error = InvalidGuideError(
                    "the constraint allows no token here, not even EOS (its language is empty at this point)"
                )
            eos_only_row(bitmask[j], self.ctx.eos_ids)

    def _fill_grouped(self, states: list[SequenceState], bitmask: torch.Tensor) -> None:
        """Rows with a live matcher are grouped by matcher class and filled with one
        ``batch_fill`` per class (xgrammar's runs on native threads without the GIL; a Python
        thread pool measured slower than serial here). Other rows go one by one."""
        groups: dict[type, tuple[list, list[int], list[SequenceState]]] = {}
        for j, st in enumerate(states):
            matcher = st.batch_matcher()
            if matcher is None:
                st.fill(bitmask, j)
                continue
            matchers, rows, owners = groups.setdefault(type(matcher), ([], [], []))
            matchers.append(matcher)
            rows.append(j)
            owners.append(st)
        limit = self.ctx.max_fill_seconds
        for cls, (matchers, rows, owners) in groups.items():
            t0, cpu0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
            if len(matchers) == 1:
                matchers[0].fill_next_token_bitmask(bitmask, rows[0])
            else:
                threads = self.fill_threads if len(matchers) >= self.parallel_fill_threshold else 1
                cls.batch_fill(matchers, bitmask, rows, threads=threads)
            elapsed = time.perf_counter() - t0
            share = elapsed / len(matchers)
            for st in owners:
                st.guided_time_s += share
            # What the limit bounds is one row's own CPU time (RowContext). A lone row fills on
            # this thread; a group may fill on native threads, and no row's own CPU time exceeds
            # the group's wall time nor the process' CPU time over it, so the smaller one is the
            # cheap screen, and rows are timed alone only when it is passed.
            cost = time.thread_time() - own0 if len(matchers) == 1 else min(elapsed, time.process_time() - cpu0)
            if cost > limit:
                self._end_slow_rows(matchers, rows, owners, bitmask, cost, limit)

    @staticmethod
    def _end_slow_rows(matchers, rows, owners, bitmask: torch.Tensor, cost: float, limit: float) -> None:
        """A group's fill cost more than ``max_fill_seconds``: find the rows that did it (a native
        fill cannot be interrupted, so this is after the fact) and end them; the rest go on. A
        lone row is its own measurement; in a group each row is filled again alone on this
        thread and its own CPU time read (this happens only when the screen was passed)."""
        for m, r, st in zip(matchers, rows, owners):
            took = cost
            if len(matchers) > 1:
                t0 = time.thread_time()
                m.fill_next_token_bitmask(bitmask, r)
                took = time.thread_time() - t0
            if took > limit:
                st.end_slow(took, bitmask[r])

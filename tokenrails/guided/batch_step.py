"""The batched guided step: one persistent bitmask, fill only guided rows, one kernel call.

Per decoding step the engine calls ``fill_and_apply(logits, rows)`` before sampling and
``accept_tokens(tokens, rows)`` after. Unguided rows are never touched. A row whose constraint
failed or whose sampled token was rejected is failed closed: from then on it may only emit EOS,
and its status carries the error for the engine to report.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Sequence

import numpy as np
import torch

from ..kernels import apply_token_bitmask_inplace
from ..kernels._common import eos_only_row
from .errors import GuideError, GuideTimeoutError, InvalidGuideError, TokenRejectedError
from .reasoning import ReasoningConfig, open_step
from .spec import GuideSpec

if TYPE_CHECKING:
    from .manager import GuidedDecodingManager, SequenceState
    from .reasoning import ThinkState


@dataclass(frozen=True)
class GuidedRow:
    """Identity and constraint of one logits row.

    ``reasoning``: the model thinks first; the constraint starts after the end marker
    (see reasoning.py). Read when the sequence's state is created.
    """

    session_id: Hashable
    seq_id: Hashable
    spec: GuideSpec
    reasoning: ReasoningConfig | None = None


class StepStatus(enum.Enum):
    OK = "ok"
    TERMINATED = "terminated"  # EOS accepted: the output is complete and valid
    REJECTED = "rejected"      # a sampled token broke the grammar: finish with an error
    ERROR = "error"            # the constraint failed (invalid, unsupported, limit, timeout)


@dataclass
class RowStatus:
    """``valid_drafts`` (speculative fill): leading drafts the grammar accepts.
    ``accepted`` (speculative accept): tokens consumed before a failure (all of them when OK)."""

    state: StepStatus
    error: GuideError | None = None
    valid_drafts: int | None = None
    accepted: int | None = None

    @property
    def failed(self) -> bool:
        return self.state in (StepStatus.REJECTED, StepStatus.ERROR)


_OK = RowStatus(StepStatus.OK)


def default_fill_threads() -> int:
    import os

    cpus = os.cpu_count() or 1
    return 1 if cpus < 4 else min(8, cpus // 2)


@dataclass(frozen=True)
class FilledMask:
    """A step's filled mask, not yet applied: ``bitmask[j]`` masks logits row ``index[j]``."""

    rows: tuple[GuidedRow | None, ...]
    bitmask: torch.Tensor
    index: list[int]
    statuses: list[RowStatus | None]


class BatchedGuidedStep:
    """Owns the reusable bitmask buffers and the fill thread pool of one manager."""

    def __init__(
        self,
        manager: "GuidedDecodingManager",
        *,
        fill_threads: int | None = None,
        parallel_fill_threshold: int = 64,
        device: str | torch.device | None = None,
    ):
        self.manager = manager
        self.words = (manager.vocab.vocab_size + 31) // 32
        # Threads for one backend's native batch fill (xgrammar's and llguidance's pools), used
        # for groups of at least ``parallel_fill_threshold`` rows. None: 1 below 4 CPUs (threads
        # measured slower there), else half the CPUs up to 8.
        self.parallel_fill_threshold = max(1, parallel_fill_threshold)
        self.fill_threads = max(1, fill_threads if fill_threads is not None else default_fill_threads())
        self._host = torch.empty((0, self.words), dtype=torch.int32)
        self._dev: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._index_host = torch.empty(0, dtype=torch.int32)
        if device is not None:
            self._ensure(1, torch.device(device))

    # ---- buffers ---------------------------------------------------------------------------
    def _ensure(self, rows: int, device: torch.device) -> None:
        """Grow buffers (doubling) so ``rows`` fit; steady state allocates nothing."""
        if self._host.shape[0] < rows:
            cap = max(rows, 2 * self._host.shape[0], 8)
            pin = device.type == "cuda"
            self._host = torch.empty((cap, self.words), dtype=torch.int32, pin_memory=pin)
            self._index_host = torch.empty(cap, dtype=torch.int32, pin_memory=pin)
        if device.type != "cpu":
            cur = self._dev.get(device)
            if cur is None or cur[0].shape[0] < self._host.shape[0]:
                cap = self._host.shape[0]
                self._dev[device] = (
                    torch.empty((cap, self.words), dtype=torch.int32, device=device),
                    torch.empty(cap, dtype=torch.int32, device=device),
                )

    # ---- step ------------------------------------------------------------------------------
    def fill_and_apply(self, logits: torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
        return self.apply_filled(logits, self.fill_rows(rows, self._host))

    def fill_rows(self, rows: Sequence[GuidedRow | None], buffer: torch.Tensor | None = None) -> "FilledMask":
        """The mask of every guided row, nothing applied yet. Depends only on tokens already
        accepted, so an engine may run it while the model computes the logits (overlap)."""
        guided = [(i, r) for i, r in enumerate(rows) if r is not None]
        statuses: list[RowStatus | None] = [None] * len(rows)
        k = len(guided)
        if buffer is None or buffer.shape[0] < k:
            buffer = torch.empty((max(k, 1), self.words), dtype=torch.int32)
        bitmask = buffer[:k]
        if k:
            states = [self.state_of(r) for _, r in guided]
            self._fill_grouped(states, bitmask, k)
            self._end_empty_rows(states, bitmask, k)
            for j, (i, _) in enumerate(guided):
                st = states[j]
                statuses[i] = RowStatus(StepStatus.ERROR, st.error) if st.error is not None else _OK
        return FilledMask(tuple(rows), bitmask, [i for i, _ in guided], statuses)

    def apply_filled(self, logits: torch.Tensor, filled: "FilledMask") -> list[RowStatus | None]:
        """One kernel call: row ``filled.index[j]`` of ``logits`` gets mask row ``j``."""
        if logits.dim() != 2 or logits.shape[0] != len(filled.rows):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(filled.rows)} rows")
        k = len(filled.index)
        if not k:
            return list(filled.statuses)
        self._ensure(k, logits.device)
        index = self._index_host[:k]
        index.numpy()[:] = filled.index
        bitmask = filled.bitmask
        if logits.device.type == "cpu":
            dev_mask, dev_index = bitmask, index
        else:
            buf_mask, buf_index = self._dev[logits.device]
            dev_mask, dev_index = buf_mask[:k], buf_index[:k]
            dev_mask.copy_(bitmask, non_blocking=True)
            dev_index.copy_(index, non_blocking=True)
        identity = k == len(filled.rows)
        apply_token_bitmask_inplace(
            logits, dev_mask, indices=None if identity else dev_index,
            vocab_size=self.manager.vocab.vocab_size,
        )
        return list(filled.statuses)

    def _end_empty_rows(self, states: "list[SequenceState]", bitmask: torch.Tensor, k: int) -> None:
        """A row that allows no token at all (an empty language, a dead end no token can leave)
        would be all -inf after the apply and make the engine's sampler fail for the whole batch.
        Such a row ends alone instead: EOS only, with an error status. One vectorized pass over
        the filled words (~5 us at batch 1, ~20 us at batch 32 with 150k tokens)."""
        words = bitmask.numpy()
        if words.shape[1] % 2 == 0:
            words = words.view(np.uint64)
        empty = np.flatnonzero(words.max(axis=1) == 0) if words.dtype == np.uint64 else np.flatnonzero(~words.any(axis=1))
        for j in empty.tolist():
            st = states[j]
            if st.error is None:
                st.error = InvalidGuideError(
                    "the constraint allows no token here, not even EOS (its language is empty at this point)"
                )
            eos_only_row(bitmask[j], self.manager.vocab.eos_ids)

    def _fill_grouped(self, states: "list[SequenceState]", bitmask: torch.Tensor, k: int) -> None:
        """Rows with a live matcher are grouped by matcher class and filled with one
        ``batch_fill`` per class (xgrammar's runs on native threads without the GIL; a Python
        thread pool measured slower than serial here). Thinking and failed rows go row by row."""
        groups: dict[type, tuple[list, list[int], list]] = {}
        for j in range(k):
            st = states[j]
            thinking = st.think is not None and not st.think.done
            matcher = self.manager.resolve_matcher(st) if st.error is None and not thinking else None
            if matcher is None:
                self.fill_row(st, st.think, bitmask, j)
                continue
            matchers, rows, owners = groups.setdefault(type(matcher), ([], [], []))
            matchers.append(matcher)
            rows.append(j)
            owners.append(st)
        limit = self.manager.limits.max_fill_seconds
        for cls, (matchers, rows, owners) in groups.items():
            t0 = time.perf_counter()
            if len(matchers) == 1:
                matchers[0].fill_next_token_bitmask(bitmask, rows[0])
            else:
                threads = self.fill_threads if len(matchers) >= self.parallel_fill_threshold else 1
                cls.batch_fill(matchers, bitmask, rows, threads=threads)
            elapsed = time.perf_counter() - t0
            share = elapsed / len(matchers)
            for st in owners:
                st.guided_time_s += share
            if elapsed > limit:
                self._end_slow_rows(matchers, rows, owners, bitmask, elapsed, limit)

    def _end_slow_rows(self, matchers, rows, owners, bitmask: torch.Tensor, elapsed: float, limit: float) -> None:
        """A group's fill ran past ``max_fill_seconds``: find the rows that did it (a native fill
        cannot be interrupted, so this is after the fact) and end them with
        ``GuideTimeoutError``, EOS only, so they never stall a step again; the rest go on. A lone
        row is its own measurement; in a group each row is timed again alone (this happens only
        when the limit was already passed)."""
        for m, r, st in zip(matchers, rows, owners):
            took = elapsed
            if len(matchers) > 1:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bitmask, r)
                took = time.perf_counter() - t0
            if took > limit:
                st.error = GuideTimeoutError(
                    f"one step's mask took {took:.2f} s (limit max_fill_seconds={limit}): the row ends",
                    limit="max_fill_seconds", value=round(took, 3))
                eos_only_row(bitmask[r], self.manager.vocab.eos_ids)

    def fill_row(self, st: "SequenceState", think: "ThinkState | None", bitmask: torch.Tensor, j: int) -> None:
        """Row ``j`` for ``st`` in thinking state ``think`` (may differ from ``st.think`` when
        looking ahead through drafts). Failed rows get EOS only."""
        if st.error is None and think is not None and think.opening:
            # optional thinking, undecided: the grammar's row (after the tentatively fed marker
            # prefix) OR the start marker's continuation; only the latter once the grammar refused
            matcher = self.manager.resolve_matcher(st)
            if matcher is not None:
                assert st.tracker is not None
                t0 = time.perf_counter()
                if think.answer_ok:
                    matcher.fill_next_token_bitmask(bitmask, j)
                st.tracker.fill_start(think, bitmask, j, union=think.answer_ok)
                st.guided_time_s += time.perf_counter() - t0
                return
        if st.error is None and think is not None and not think.done:
            self.manager.poll_compile(st)  # fail early: a bad spec is reported while thinking
            if st.error is None:
                assert st.tracker is not None
                st.tracker.fill(think, bitmask, j)
                return
        matcher = self.manager.resolve_matcher(st) if st.error is None else None
        if matcher is None:
            eos_only_row(bitmask[j], self.manager.vocab.eos_ids)
            return
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, j)
        took = time.perf_counter() - t0
        st.guided_time_s += took
        if took > self.manager.limits.max_fill_seconds:
            self._end_slow_rows([matcher], [j], [st], bitmask, took, self.manager.limits.max_fill_seconds)

    def accept_tokens(self, token_ids: Sequence[int] | torch.Tensor, rows: Sequence[GuidedRow | None]) -> list[RowStatus | None]:
        if isinstance(token_ids, torch.Tensor):
            token_ids = token_ids.reshape(-1).tolist()
        if len(token_ids) != len(rows):
            raise ValueError(f"{len(token_ids)} tokens for {len(rows)} rows")
        eos = set(self.manager.vocab.eos_ids)
        out: list[RowStatus | None] = [None] * len(rows)
        for i, (tok, row) in enumerate(zip(token_ids, rows)):
            if row is not None:
                out[i] = self.accept_one(self.state_of(row), int(tok), eos)
        return out

    def state_of(self, row: GuidedRow) -> "SequenceState":
        """The manager's state for a guided row (created, and its compile started, on first sight)."""
        return self.manager.state_for(row.session_id, row.seq_id, row.spec, reasoning=row.reasoning)

    def accept_one(self, st: "SequenceState", tok: int, eos: set[int]) -> RowStatus:
        if st.error is not None:
            # A failed row may only have emitted EOS (its mask allowed nothing else).
            return RowStatus(StepStatus.ERROR, st.error)
        if st.think is not None and st.think.opening:
            return self._accept_opening(st, tok, eos)
        if st.think is not None and not st.think.done:
            assert st.tracker is not None
            nxt = st.tracker.advance(st.think, tok)
            if nxt is None:
                why = "while forcing the end of the thinking section" if st.tracker.forcing(st.think) else (
                    "while thinking (EOS before the end marker, or bytes past the end marker in the same token)")
                return self._reject(st, tok, why)
            st.think = nxt
            return _OK
        if self.manager.resolve_matcher(st) is None:
            return RowStatus(StepStatus.ERROR, st.error)
        assert st.matcher is not None
        if st.matcher.is_terminated():
            if tok in eos:
                return RowStatus(StepStatus.TERMINATED)
            return self._reject(st, tok, "after the constraint was complete")
        t0 = time.perf_counter()
        ok = st.matcher.accept_token(tok)
        st.guided_time_s += time.perf_counter() - t0
        st.tokens += 1
        if not ok:
            return self._reject(st, tok, "by the grammar")
        st.history.append(tok)
        if tok in eos:
            return RowStatus(StepStatus.TERMINATED)
        return _OK

    def _accept_opening(self, st: "SequenceState", tok: int, eos: set[int]) -> RowStatus:
        """Optional thinking, undecided: the start marker or the answer's first tokens."""
        matcher = self.manager.resolve_matcher(st)
        if matcher is None:
            return RowStatus(StepStatus.ERROR, st.error)
        assert st.tracker is not None and st.think is not None
        t0 = time.perf_counter()
        nxt, moved = open_step(st.tracker, matcher, st.think, tok)
        st.guided_time_s += time.perf_counter() - t0
        if nxt is None:
            why = ("at the start of an optional thinking section (neither the start marker nor the "
                   "grammar allows it here)")
            return self._reject(st, tok, why)
        if moved > 0:
            st.history.append(tok)
            st.tokens += 1
        elif moved < 0:
            del st.history[len(st.history) + moved:]
        st.think = nxt
        if nxt.done and tok in eos:
            return RowStatus(StepStatus.TERMINATED)
        return _OK

    def _reject(self, st: "SequenceState", tok: int, why: str) -> RowStatus:
        self.manager.counters["rejections"] += 1
        st.error = TokenRejectedError(f"sampled token {tok} is not allowed {why}", token_id=tok)
        return RowStatus(StepStatus.REJECTED, st.error)

    def close(self) -> None:
        """Nothing to release: buffers are freed with the object (kept for API symmetry)."""

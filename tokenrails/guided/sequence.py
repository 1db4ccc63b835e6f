"""One guided sequence: its identity, its grammar future, and its row state machine.

This is the bottom of the guided step (compare vLLM v1's per-request structured-output state): a
``SequenceState`` owns everything one sequence needs — the pending compile of its spec, the
matcher once it exists, the tokens accepted so far, its timings — and the transitions of its row:

* ``fill``: write the row's next mask (its matcher's, or EOS-only for a failed row);
* ``accept``: one sampled token → OK | TERMINATED | REJECTED (fail closed) | ERROR;
* ``tentative`` / ``Lookahead``: walk draft tokens on the matcher and roll back exactly (speculative);
* ``apply_jump``: roll back and accept forced tokens through the same ``accept`` as a sampled one;
* ``finalize``: why the sequence ended and whether its output is a complete match.

Nothing here knows about sessions, caches or engines. A think-first sequence has a phase
(``reasoning.ReasoningPhase``, made by ``start_reasoning``): the state sends its row through it,
and the phase hands the answer's tokens to the grammar's matcher, which stays a plain backend
matcher. The manager (manager.py) creates states and keeps the session table; the batched step
(batch_step.py) fills and accepts many states.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from .backend import CompiledGuide, Matcher
from .bitmask import eos_only_row
from .budget import Budget, budget_table
from .errors import GuideError, GuideLimitError, GuideTimeoutError, TokenRejectedError, detached_copy
from .limits import GuideLimits
from .reasoning import ReasoningConfig, ReasoningPhase, tracker_for
from .vocabulary import Vocabulary
from .spec import GuideSpec

__all__ = [
    "Finalization", "GrammarFuture", "GuidedRow", "Lookahead", "RowContext", "RowStatus",
    "SequenceState", "StepStatus", "count_valid",
]


@dataclass(frozen=True)
class GuidedRow:
    """Identity and constraint of one logits row.

    ``reasoning``: the model thinks first; the constraint starts after the end marker
    (see reasoning.py). ``max_tokens``: close the output within this many generated tokens
    (thinking and the final EOS included; the budget rule, budget.py), None: no budget. Both are
    read when the sequence's state is created.
    """

    session_id: Hashable
    seq_id: Hashable
    spec: GuideSpec
    reasoning: ReasoningConfig | None = None
    max_tokens: int | None = None


class StepStatus(enum.Enum):
    OK = "ok"
    TERMINATED = "terminated"  # EOS accepted: the output is complete and valid
    REJECTED = "rejected"      # a sampled token broke the grammar: finish with an error
    ERROR = "error"            # the constraint failed (invalid, unsupported, limit, timeout)


@dataclass
class RowStatus:
    """``valid_drafts`` (speculative fill): leading drafts the grammar accepts.
    ``accepted`` (speculative accept, jump-forward): tokens consumed before a failure (all of
    them when OK)."""

    state: StepStatus
    error: GuideError | None = None
    valid_drafts: int | None = None
    accepted: int | None = None

    @property
    def failed(self) -> bool:
        return self.state in (StepStatus.REJECTED, StepStatus.ERROR)


OK = RowStatus(StepStatus.OK)


@dataclass(frozen=True)
class Finalization:
    """``finish_reason``: "stop" (grammar accepted EOS), "error", the engine's reason when the
    output is still a complete match, or ``f"{reason}_incomplete"`` when it is not.
    ``complete``: the output (after the thinking section) is a full match of the constraint."""

    finish_reason: str
    complete: bool
    error: GuideError | None = None
    thinking: bool = False  # still inside the thinking section when it ended
    budget_closed: bool = False  # the budget rule removed a token the grammar allowed


class RowContext:
    """What every row of one manager shares: the EOS ids, the per-step fill limit, and the
    manager's counters (``rejections`` is counted here).

    ``max_fill_seconds`` bounds a fill's own CPU time (``time.thread_time`` of the filling
    thread), not its wall time: the limit is there to stop a grammar whose masks are expensive,
    and on a loaded machine the wall clock also counts other processes' turns, the GIL, and a
    wait for the row's compile (which has its own deadline), none of which the grammar costs."""

    __slots__ = ("eos_ids", "eos", "max_fill_seconds", "counters")

    def __init__(self, eos_ids: Sequence[int], max_fill_seconds: float, counters: dict | None = None):
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.eos = frozenset(self.eos_ids)
        self.max_fill_seconds = max_fill_seconds
        self.counters = counters if counters is not None else {"rejections": 0}


class GrammarFuture:
    """The compile of one spec as its sequence sees it.

    ``wait()``: the compiled guide, waiting up to the request's deadline (raises its
    ``GuideError``); ``failure()``: the compile's error if it already failed, without waiting.
    The manager builds it over its compile cache; the state never sees the manager.
    """

    __slots__ = ("_wait", "_failure")

    def __init__(self, wait: Callable[[], CompiledGuide], failure: Callable[[], GuideError | None]):
        self._wait = wait
        self._failure = failure

    def wait(self) -> CompiledGuide:
        return self._wait()

    def failure(self) -> GuideError | None:
        return self._failure()


@dataclass
class SequenceState:
    """Everything kept for one (session, sequence).

    ``matcher``: the grammar's matcher, None until the grammar is needed (``grammar`` finishes the
    compile then) or when ``error`` is set. ``phase``: a think-first sequence's reasoning phase
    (thinking, the gap, answering), which takes the row's tokens and borrows ``matcher`` once the
    grammar is needed (at the end of the thinking section, or at once while undecided).
    ``history``: every token the row accepted, in order (jump-forward rolls back through it).
    """

    spec_key: str
    matcher: Matcher | None
    error: GuideError | None = None
    grammar_init_s: float = 0.0
    guided_time_s: float = 0.0
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    spec: GuideSpec | None = None
    history: list[int] = field(default_factory=list)
    grammar: GrammarFuture | None = None
    ctx: RowContext | None = None
    budget: Budget | None = None
    phase: ReasoningPhase | None = None

    # ---- reasoning --------------------------------------------------------------------------
    def start_reasoning(self, vocab: Vocabulary, config: ReasoningConfig,
                        prompt_token_ids: Sequence[int] | None = None, thinking_done: bool | None = None) -> None:
        """Think first: the sequence gets a ``ReasoningPhase`` (see reasoning.py), started where the
        prompt (or ``thinking_done``) says; a bad config or marker fails the row (``error``)."""
        try:
            tracker = tracker_for(vocab, config)
            think = tracker.initial(prompt_token_ids, thinking_done)
        except GuideError as exc:
            self.error = exc
            return
        self.phase = ReasoningPhase(tracker, think, self.compiled_matcher, self._grammar_failure)

    # ---- the token budget ------------------------------------------------------------------
    def start_budget(self, max_tokens: int, limits: GuideLimits | None = None) -> None:
        """Close the output within ``max_tokens`` tokens (budget.py): waits for the compile,
        builds (or reads) the guide's distance table, and fails the row up front
        (``GuideLimitError``, limit "max_tokens") when even the shortest output cannot fit."""
        if self.error is not None:
            return
        try:
            if max_tokens < 1:
                raise GuideLimitError(f"max_tokens must be >= 1, got {max_tokens}", limit="max_tokens",
                                      value=max_tokens)
            start = time.perf_counter()
            try:
                guide = self.grammar.wait() if self.grammar is not None else None
            finally:
                self.grammar_init_s += time.perf_counter() - start
            matcher = self.resolve()
            if matcher is None or guide is None:
                return
            tracker = self.phase.tracker if self.phase is not None else None
            budget = Budget(max_tokens, guide, budget_table(guide, limits), tracker)
            budget.check_fits(matcher)
        except GuideError as exc:
            self.error = exc
            return
        self.budget = budget

    def budget_left(self, ahead: int = 0) -> int:
        """Steps left in the budget (``ahead``: draft tokens walked but not accepted yet)."""
        assert self.budget is not None
        return self.budget.max_tokens - len(self.history) - ahead

    # ---- the grammar future --------------------------------------------------------------
    def compiled_matcher(self) -> Matcher:
        """The grammar's matcher, made on first use (waits for the compile; raises its error)."""
        if self.matcher is None:
            assert self.grammar is not None, "a state without matcher needs its grammar future"
            start = time.perf_counter()
            try:
                self.matcher = self.grammar.wait().matcher()
            finally:
                self.grammar_init_s += time.perf_counter() - start
        return self.matcher

    def _grammar_failure(self) -> GuideError | None:
        """The compile's error if it already failed (a copy: the cached one stays unpinned)."""
        err = self.grammar.failure() if self.grammar is not None else None
        return detached_copy(err) if err is not None else None

    def resolve(self) -> Matcher | ReasoningPhase | None:
        """What takes this row's tokens: its reasoning phase, else the grammar's matcher (finishing
        a deferred compile: waits up to its deadline; None once failed)."""
        if self.phase is not None:
            return self.phase
        if self.matcher is None and self.error is None:
            try:
                self.compiled_matcher()
            except GuideError as exc:
                self.error = exc
        return self.matcher

    def _fail(self, exc: GuideError) -> RowStatus:
        self.error = exc
        return RowStatus(StepStatus.ERROR, exc)

    # ---- where the row stands --------------------------------------------------------------
    @property
    def answering(self) -> bool:
        """The constrained output has begun (always, without a thinking section)."""
        return self.phase is None or self.phase.think.done

    @property
    def thinking(self) -> bool:
        """Inside a decided thinking section."""
        return self.phase is not None and self.phase.think.thinking

    @property
    def in_gap(self) -> bool:
        """Right after a generated end-of-thinking marker, before the grammar's first token
        (whitespace may still come first: ``ReasoningConfig.whitespace_after_end``)."""
        return self.phase is not None and self.phase.think.gap is not None

    def answer_start(self) -> int | None:
        """Where the constrained output begins in ``history`` (0 without a thinking section; None
        before it began: thinking, undecided, or in the gap after the end marker)."""
        if self.phase is None:
            return 0
        return len(self.history) - len(self.phase.answer) if self.answering and not self.in_gap else None

    def batch_matcher(self) -> Matcher | None:
        """The grammar's matcher when a batched fill may fill this row with its class, else None
        (failed rows, budget rows, and rows whose reasoning phase still shapes the row)."""
        if self.error is not None or self.budget is not None:  # a budget row is filled alone
            return None
        try:
            return self.compiled_matcher() if self.phase is None else self.phase.handed_over()
        except GuideError as exc:
            self.error = exc
            return None

    # ---- fill ------------------------------------------------------------------------------
    def fill(self, bitmask: torch.Tensor, j: int, ahead: int = 0) -> None:
        """Row ``j`` of ``bitmask`` for this state, from its matcher's current position (a
        look-ahead advances the matcher itself by ``ahead`` drafts). Failed rows get EOS only.
        With a budget, the grammar's row intersected with the budget rule."""
        ctx = self.ctx
        assert ctx is not None
        matcher = self.resolve() if self.error is None else None
        if matcher is not None:
            t0, cpu0 = time.perf_counter(), time.thread_time()
            try:
                matcher.fill_next_token_bitmask(bitmask, j)
                if self.budget is not None:
                    left = self.budget_left(ahead)
                    if left < 1 and not matcher.is_terminated():  # past the budget, unfinished: end it
                        raise GuideLimitError(
                            f"max_tokens={self.budget.max_tokens} exhausted before the output completed",
                            limit="max_tokens", value=self.budget.max_tokens)
                    self.budget.restrict(matcher, bitmask, j, left)
            except GuideError as exc:
                self.error = exc
            else:
                self.guided_time_s += time.perf_counter() - t0
                took = time.thread_time() - cpu0  # the fill's own work (see RowContext)
                if took > ctx.max_fill_seconds:
                    self.end_slow(took, bitmask[j])
                return
        eos_only_row(bitmask[j], ctx.eos_ids)

    def end_slow(self, took: float, row: torch.Tensor) -> None:
        """This row's fill cost ``took`` s of CPU, past ``max_fill_seconds``: it ends with
        ``GuideTimeoutError``, EOS only, so it never stalls a step again."""
        ctx = self.ctx
        assert ctx is not None
        self.error = GuideTimeoutError(
            f"one step's mask took {took:.2f} s of CPU (limit max_fill_seconds={ctx.max_fill_seconds}): the row ends",
            limit="max_fill_seconds", value=round(took, 3))
        eos_only_row(row, ctx.eos_ids)

    # ---- accept ----------------------------------------------------------------------------
    def accept(self, tok: int) -> RowStatus:
        """One sampled (or forced) token through the row's state machine."""
        if self.error is not None:
            # A failed row may only have emitted EOS (its mask allowed nothing else).
            return RowStatus(StepStatus.ERROR, self.error)
        matcher = self.resolve()
        if matcher is None:
            return RowStatus(StepStatus.ERROR, self.error)
        eos = self.ctx.eos if self.ctx is not None else frozenset()
        if matcher.is_terminated():
            if tok in eos:
                return RowStatus(StepStatus.TERMINATED)
            return self._reject(tok, "after the constraint was complete")
        t0 = time.perf_counter()
        try:
            ok = matcher.accept_token(tok)
        except GuideError as exc:
            return self._fail(exc)
        self.guided_time_s += time.perf_counter() - t0
        self.tokens += 1
        if not ok:
            return self._reject(tok, self.phase.refusal if self.phase is not None else "by the grammar")
        self.history.append(tok)
        if tok in eos:
            return RowStatus(StepStatus.TERMINATED)
        return OK

    def _reject(self, tok: int, why: str) -> RowStatus:
        if self.ctx is not None:
            self.ctx.counters["rejections"] = self.ctx.counters.get("rejections", 0) + 1
        self.error = TokenRejectedError(f"sampled token {tok} is not allowed {why}", token_id=tok)
        return RowStatus(StepStatus.REJECTED, self.error)

    def accept_many(self, tokens: Sequence[int]) -> RowStatus:
        """Accept ``tokens`` in order; stop at the first failure (``accepted`` counts the rest)."""
        status = RowStatus(StepStatus.ERROR, self.error) if self.error is not None else OK
        n = 0
        for tok in tokens:
            status = self.accept(int(tok))
            if status.failed:
                break
            n += 1
        return RowStatus(status.state, status.error, accepted=n)

    # ---- look-ahead (speculative drafts) and jump-forward ------------------------------------
    def tentative(self, tok: int) -> bool:
        """Advance the matcher by one draft (no history, no counters); False: not allowed,
        nothing changed. The caller rolls the matcher back (see ``Lookahead``)."""
        matcher = self.resolve() if self.error is None else None
        if matcher is None or matcher.is_terminated():
            return False
        try:
            return matcher.accept_token(tok)
        except GuideError as exc:
            self.error = exc
            return False

    def forced_prefix(self) -> list[int] | None:
        """Before the constrained output: the tokens forced now (``[]``: none); None once it
        began (the grammar decides what is forced)."""
        return None if self.phase is None else self.phase.forced_prefix()

    def rollback_limit(self) -> int | None:
        """How many of the last tokens may be rolled back and re-tokenized (None: all; never back
        into a thinking section or an undecided start)."""
        return None if self.phase is None else self.phase.rollback_limit()

    def apply_jump(self, rollback: int, token_ids: Sequence[int]) -> RowStatus:
        """Roll the output back ``rollback`` tokens, then accept ``token_ids`` exactly as sampled
        tokens (same transitions, same history)."""
        if rollback > len(self.history):
            raise ValueError(f"cannot roll back {rollback} tokens: only {len(self.history)} were generated")
        if self.error is not None:
            return RowStatus(StepStatus.ERROR, self.error, accepted=0)
        matcher = self.resolve()
        if matcher is None:
            return RowStatus(StepStatus.ERROR, self.error, accepted=0)
        limit = self.rollback_limit()
        if rollback and limit is not None and rollback > limit:
            raise ValueError("cannot roll back: the answer has not started (thinking, or the optional "
                             "thinking decision is still open), or the roll-back reaches into it")
        if rollback:
            matcher.rollback(rollback)
            del self.history[len(self.history) - rollback:]
        return self.accept_many(token_ids)

    # ---- end ------------------------------------------------------------------------------
    def finalize(self, reason: str = "length") -> Finalization:
        """Why the sequence ended and whether its output is a complete match (see
        ``GuidedDecodingManager.finalize``)."""
        if self.error is not None:
            return Finalization("error", False, self.error)
        matcher = self.phase or self.matcher
        if matcher is None:  # never compiled, never used
            return Finalization(f"{reason}_incomplete", False)
        closed = self.budget is not None and self.budget.closed
        try:
            if matcher.is_terminated():
                return Finalization("stop", True, budget_closed=closed)
            if matcher.is_accepting():
                return Finalization(reason, True, budget_closed=closed)
        except GuideError:  # the grammar was never needed and cannot be had now
            pass
        think = self.phase.think if self.phase is not None else None  # still in a free section?
        free = think is not None and (think.thinking or (think.opening and not think.answer_ok))
        return Finalization(f"{reason}_incomplete", False, thinking=free, budget_closed=closed)

    def may_end(self) -> bool:
        """Whether the output is complete now (EOS would be a valid end)."""
        if self.error is not None:
            return False
        matcher = self.resolve()
        try:
            return matcher is not None and matcher.is_accepting()
        except GuideError as exc:
            self.error = exc
            return False


class Lookahead:
    """Walks one sequence through draft tokens on its own matcher and rolls it back exactly on
    exit (thinking sections included: the matcher's rollback is exact): no matcher copies."""

    def __init__(self, st: SequenceState):
        self.st = st
        self.advanced = 0

    def __enter__(self) -> "Lookahead":
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the sequence's matcher back where it was (idempotent)."""
        if self.advanced:
            matcher = self.st.phase or self.st.matcher
            assert matcher is not None
            matcher.rollback(self.advanced)
            self.advanced = 0

    def advance(self, tok: int) -> bool:
        """Take one draft; False (state unchanged) when it is not allowed."""
        if not self.st.tentative(int(tok)):
            return False
        self.advanced += 1
        return True

    def back(self) -> None:
        """Undo the last ``advance``."""
        if self.advanced:
            matcher = self.st.phase or self.st.matcher
            assert matcher is not None
            matcher.rollback(1)
            self.advanced -= 1

    def fill(self, bitmask: torch.Tensor, j: int) -> None:
        """Row ``j``: the sequence's mask after the drafts walked so far (a budget counts them)."""
        self.st.fill(bitmask, j, self.advanced)

    def terminated(self) -> bool:
        """Only EOS may follow the walked tokens (never while thinking or undecided)."""
        if self.st.error is not None:
            return True
        matcher = self.st.resolve()
        return matcher is None or matcher.is_terminated()


def count_valid(st: SequenceState, tokens: Sequence[int]) -> int:
    """Leading ``tokens`` allowed from ``st`` (thinking included); the state is left unchanged."""
    if st.error is not None:
        return 0
    matcher = st.resolve()
    if matcher is None:
        return 0
    try:
        return matcher.validate_tokens([int(t) for t in tokens])
    except GuideError as exc:
        st.error = exc
        return 0
